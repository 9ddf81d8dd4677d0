"""The bandwidth- and compute-bound process of the harness (torch arrays):

- throughput: kernel time (device, triton.testing.do_bench) of each tuned
  workload through lazytriton beside torch's op, and the achieved TB/s or
  TFLOP/s against the device's copy bandwidth and fp16 matmul rate, measured
  in the same process;
- tuning: every config of each autotuned workload timed with Triton's own
  launch, the config lazytriton chose marked, and what choosing cost (a fresh
  re-tune on the same arguments, compiled binaries from the cache).
"""
from __future__ import annotations

import os
import statistics
import time

from .common import row, why
from .timing import interleaved
from .workloads import throughput_workloads


SAME = "Triton, same config"  # Triton's own launch of the config lazytriton chose


def throughput_rows(suite: str) -> list[str]:
    return [f"{w.name}: {s}" for w in throughput_workloads(suite) if w.torch is not None
            for s in ("lazytriton", *([SAME] if w.same_config else []), "torch")]


def tuning_rows(suite: str) -> list[str]:
    return [w.name for w in throughput_workloads(suite) if w.torch is not None and w.tuning]


def device_us(fn, rep_ms: float):
    """A path for timing.interleaved: each sample is the median device time of
    fn over rep_ms of triton.testing.do_bench (L2 flushed before every run)."""
    from triton.testing import do_bench

    return lambda b: do_bench(fn, warmup=5, rep=rep_ms, return_mode="median") * 1e-3 * b


def run(progress, suite: str) -> dict:
    import torch

    rows, tuning, notes = [], [], []
    try:
        ceil = ceilings(progress)
    except Exception as exc:  # noqa: BLE001  (the kernel times stand without them)
        ceil = {"copy_GBps": float("nan"), "matmul_TFLOPs": float("nan")}
        notes.append(f"the device's ceilings not measured ({why(exc)})")
    for w in throughput_workloads(suite):
        if w.torch is None:
            continue
        progress(f"throughput: {w.name}")
        try:
            s = w.torch()
            (s.get("first") or s["run"])()  # compile (or the run's cache) + tune on these arguments
            torch.cuda.synchronize()
            s["run"]()
            torch.cuda.synchronize()
            correct = bool(s["check"]())
            paths = {"lazy": device_us(s["run"], 25), "ref": device_us(s["ref"], 25)}
            if w.same_config:
                same = s["same"]()
                same()  # Triton's compile of that config
                paths["same"] = device_us(same, 25)
            # lazytriton and the others in alternating rounds: drift hits all alike
            got = interleaved(paths, torch.cuda.synchronize, rounds=8, batch=1)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{w.name}: not measured ({why(exc)})")
            continue
        unit = "TFLOP/s" if w.bound == "compute" else "GB/s"
        ceiling = ceil["matmul_TFLOPs"] if w.bound == "compute" else ceil["copy_GBps"]

        def rate(us):
            return w.flops / us / 1e6 if w.bound == "compute" else w.bytes / us / 1e3

        common = dict(workload=w.name, rate_unit=unit, ceiling=ceiling, bound=w.bound, bytes=w.bytes, flops=w.flops)
        rows.append(row(f"{w.name}: lazytriton", "lazytriton", got["lazy"], correct=correct,
                        rate=[rate(t) for t in got["lazy"]], **common))
        if "same" in got:
            rows.append(row(f"{w.name}: {SAME}", "other", got["same"], rate=[rate(t) for t in got["same"]], **common))
        rows.append(row(f"{w.name}: torch", "other", got["ref"], op=s["ref_name"],
                        rate=[rate(t) for t in got["ref"]], **common))
        if not correct:
            notes.append(f"{w.name}: lazytriton gave a WRONG result")
        if w.tuning:
            try:
                tuning.append(_tuning_quality(w.name, s, progress))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{w.name}: tuning quality not measured ({why(exc)})")
    notes.append("device time: each sample the median of 25 ms of triton.testing.do_bench (L2 flushed), 8 rounds "
                 f"alternating lazytriton, torch's op and ({SAME}) Triton's own launch of lazytriton's config; "
                 "rate = bytes moved (or flops) / time, "
                 "against the device's copy bandwidth (a 1 GiB copy) and fp16 matmul rate (8192^3 torch.matmul) "
                 "measured in the same process")
    return {"sections": {
        "throughput": {"title": "Kernel time of tuned workloads (torch arrays)", "unit": "us", "better": "lower",
                       "rows": rows, "ceilings": ceil, "notes": notes},
        "tuning": {"title": "Tuning quality: the config lazytriton chose vs every config", "unit": "ms",
                   "better": "lower", "rows": tuning,
                   "notes": ["every config timed with Triton's own launch (do_bench medians); samples: the time "
                             "lazytriton took to choose (a re-tune on the same arguments, binaries from its cache)"]},
    }}


def ceilings(progress) -> dict:
    """The device's copy bandwidth (GB/s) and fp16 matmul rate (TFLOP/s), measured."""
    import torch
    from triton.testing import do_bench

    progress("ceilings: copy bandwidth, fp16 matmul rate")
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    tm = do_bench(lambda: a @ a, warmup=10, rep=100, return_mode="median")
    return {"copy_GBps": 2 * (1 << 28) * 4 / t / 1e6, "matmul_TFLOPs": 2 * 8192 ** 3 / tm / 1e9}


def _tuning_quality(name: str, s: dict, progress) -> dict:
    """Chosen config (a fresh re-tune) vs every config timed with Triton's own launch."""
    import torch

    import lazytriton

    kernel = s["kernel"]
    fresh = lazytriton.kernel(kernel)
    old = os.environ.get("LAZYTRITON_RETUNE")
    os.environ["LAZYTRITON_RETUNE"] = "1"
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fresh.resolve(*s["args"], grid=s["grid"], stream=torch.cuda.current_stream().cuda_stream, **s["meta"])
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop("LAZYTRITON_RETUNE", None)
        else:
            os.environ["LAZYTRITON_RETUNE"] = old
    rec = fresh.records[-1]
    chosen = rec.winner_index
    tuned_ms = [c.get("time_ms") for c in rec.candidates]
    # Every config through Triton's own launch, in interleaved rounds; one that
    # cannot run (out of resources) cannot win.
    paths, failed = {}, set()
    for i, cfg in enumerate(kernel.configs):
        meta = {**cfg.kwargs, **s["meta"]}
        g = s["grid"](meta)
        launch = (lambda g, meta, cfg: lambda: kernel.fn[g](*s["args"], **meta, num_warps=cfg.num_warps,
                                                            num_stages=cfg.num_stages))(g, meta, cfg)
        try:
            launch()  # compiles (Triton's cache) and runs once
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            failed.add(i)
            continue
        paths[i] = device_us(launch, 10)
    got = interleaved(paths, torch.cuda.synchronize, rounds=3, batch=1)
    times = [float("inf") if i in failed else statistics.median(got[i]) for i in range(len(kernel.configs))]
    best = min(range(len(times)), key=lambda i: times[i])
    progress(f"tuning: {name}: chose config {chosen}, best {best} ({times[chosen] / times[best]:.3f}x)")
    return row(name, "lazytriton", [tune_s * 1e3], configs=[str(c) for c in kernel.configs], times_us=times,
               lazytriton_trial_ms=tuned_ms, chosen=chosen, best=best, ratio=times[chosen] / times[best])
