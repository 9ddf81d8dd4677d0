"""How agreement scales with the number of processes, on the CPU: N processes
of one jax.distributed job (CPU backend, JAX's real coordination service and
key-value store, lazytriton.distributed's real protocol) agree on a tuning key
whose "tuning" is a stand-in of fixed duration. Reported per N: the requests
the coordinator served for agreement (counted at each client: one request per
key-value call), the most any rank made, how many blocking gets a rank made
(one: nobody polls), and the time from the winner being published to every
rank holding it, with and without the winner's binary in the published value.

It starts by measuring what the binary costs to make: each of the demo
matmul's 8 configs compiled for sm_90 on this CPU (Triton's real compile; no
GPU needed), and the size of its encoded binary (what agreement sends).

    python -m lazytriton.bench.distributed_sim [--ranks 8 32 64] [--rounds 6] [--tune-s 2]
        [--json docs/benchmarks/agreement_sim.json] [--plot docs/benchmarks/agreement_sim.png]

Each rank process is light: it imports JAX and lazytriton.distributed only
(not the lazytriton package's __init__, which imports Triton: ~107 MiB more
per process); its RSS and PSS are reported.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types


def _light_distributed():
    """lazytriton.distributed without running lazytriton/__init__.py (Triton, the C++ core)."""
    if "lazytriton" not in sys.modules:
        spec = importlib.util.find_spec("lazytriton")
        pkg = types.ModuleType("lazytriton")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["lazytriton"] = pkg
    import lazytriton.distributed as ld
    return ld


def _memory_mib() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_mib"] = int(line.split()[1]) / 1024
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["pss_mib"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


class CountingClient:
    """JAX's distributed client, counting its key-value requests and timing the winner's."""

    CALLS = ("key_value_set_bytes", "key_value_try_get_bytes", "blocking_key_value_get_bytes")

    def __init__(self, client):
        self.client = client
        self.reset()

    def reset(self):
        self.calls = {c: 0 for c in self.CALLS}
        self.published_at = None
        self.received_at = None
        self.blocked_at = None

    def key_value_set_bytes(self, key, value, allow_overwrite=False):
        self.calls["key_value_set_bytes"] += 1
        if key.endswith("/winner"):
            self.published_at = time.time()
        return self.client.key_value_set_bytes(key, value, allow_overwrite)

    def key_value_try_get_bytes(self, key):
        self.calls["key_value_try_get_bytes"] += 1
        return self.client.key_value_try_get_bytes(key)

    def blocking_key_value_get_bytes(self, key, timeout_ms):
        self.calls["blocking_key_value_get_bytes"] += 1
        self.blocked_at = time.time()
        value = self.client.blocking_key_value_get_bytes(key, timeout_ms)
        self.received_at = time.time()
        return value


def _rank_main(rank: int, n: int, port: int, out: str, rounds: int, tune_s: float, payload: int) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=rank,
                               initialization_timeout=600)
    from jax._src.distributed import global_state

    ld = _light_distributed()
    client = CountingClient(global_state.client)
    agreement = ld.Agreement(ld.JaxStore(client), rank, n, timeout_s=600.0, slice_s=300.0)
    rows = []
    for i in range(rounds):
        global_state.client.wait_at_barrier(f"sim/{i}", 600_000)
        binary = bytes(payload) if i % 2 == 0 else None  # even rounds: the binary travels with the choice
        client.reset()
        key = hashlib.sha256(f"sim-{n}-{i}".encode()).hexdigest()

        def local():
            time.sleep(tune_s)  # the stand-in tuning
            return rank, {"winner_index": rank % 8, "winner": key}, binary

        t0 = time.time()
        got = agreement.resolve("sim_kernel", key, local, lambda rec, origin, b: origin["rank"])
        rows.append({"round": i, "binary": binary is not None, "result": got, "start": t0, "end": time.time(),
                     "calls": dict(client.calls), "published_at": client.published_at,
                     "blocked_at": client.blocked_at, "received_at": client.received_at})
    global_state.client.wait_at_barrier("sim/end", 600_000)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "rounds": rows, **_memory_mib(), "stats": ld.stats()}, f)
    global_state.client.wait_at_barrier("sim/written", 600_000)
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def simulate(n: int, rounds: int, tune_s: float, payload: int) -> dict:
    """One job of n processes; per round: requests, fan-out time, agreement."""
    with tempfile.TemporaryDirectory() as out:
        port = _free_port()
        t0 = time.time()
        procs = [subprocess.Popen(["nice", "-n", "10", sys.executable, os.path.abspath(__file__), "rank", str(r),
                                   str(n), str(port), out, str(rounds), str(tune_s), str(payload)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"})
                 for r in range(n)]
        errs = []
        try:
            for p in procs:
                errs.append(p.communicate(timeout=1200)[1])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for r, p in enumerate(procs):
            if p.returncode != 0:
                raise RuntimeError(f"rank {r} of {n} failed: {errs[r][-3000:]}")
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(n)]
    job = {"processes": n, "job_s": time.time() - t0, "tune_s": tune_s, "payload_bytes": payload,
           "rss_mib_max": max(r["rss_mib"] for r in ranks),
           "rss_mib_mean": statistics.mean(r["rss_mib"] for r in ranks),
           "pss_mib_total": sum(r.get("pss_mib", 0.0) for r in ranks), "rounds": []}
    for i in range(rounds):
        rs = [r["rounds"][i] for r in ranks]
        pub = [x["published_at"] for x in rs if x["published_at"] is not None]
        waiters = [x for x in rs if x["received_at"] is not None]
        per_rank = [sum(x["calls"].values()) for x in rs]
        job["rounds"].append({
            "binary": rs[0]["binary"],
            "agreed": len({x["result"] for x in rs}) == 1,
            "publishers": len(pub),
            "requests": sum(per_rank), "requests_per_rank_max": max(per_rank),
            "blocking_gets_per_rank_max": max(x["calls"]["blocking_key_value_get_bytes"] for x in rs),
            "all_blocked_before_publish": all(x["blocked_at"] < pub[0] for x in waiters),
            "fanout_s": max(x["received_at"] for x in waiters) - pub[0],
            "fanout_median_s": statistics.median(x["received_at"] - pub[0] for x in waiters),
            "step_s": max(x["end"] for x in rs) - min(x["start"] for x in rs)})
    return job


def compile_vs_binary() -> dict:
    """Seconds to compile each demo matmul config for sm_90 on this CPU, and its encoded binary's size."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = tmp
        import lazytriton
        from lazytriton.model.arrays import PointerArg
        from lazytriton.cache import encode_binary
        from lazytriton.compile.compiler import Binder, compile_one
        from lazytriton.compile.targets import device_target
        from lazytriton.demo_kernels import DEMO_CONFIGS, demo_matmul

        spec = lazytriton.kernel(demo_matmul).spec
        target = device_target((9, 0))
        binder = Binder(spec, target)
        m = 2048
        args = {"a": PointerArg(1 << 20, "fp16"), "b": PointerArg(2 << 20, "fp16"), "c": PointerArg(3 << 20, "fp16"),
                "M": m, "N": m, "K": m, "sam": m, "sak": 1, "sbk": m, "sbn": 1, "scm": m, "scn": 1}
        rows = []
        for cfg in DEMO_CONFIGS:
            bound = binder.bind((), {**args, **cfg.all_kwargs()})
            t0 = time.perf_counter()
            binary = compile_one(spec, target, bound)
            rows.append({"config": str(cfg), "compile_s": time.perf_counter() - t0,
                         "cubin_bytes": len(binary.cubin), "encoded_bytes": len(encode_binary("0" * 64, binary))})
    return {"configs": rows, "compile_s_median": statistics.median(r["compile_s"] for r in rows[1:]),
            "encoded_bytes_median": int(statistics.median(r["encoded_bytes"] for r in rows))}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = result["jobs"]
    ns = [j["processes"] for j in jobs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for binary, style, label in ((True, "o-", "winner + its binary"), (False, "s--", "winner only")):
        fan = [statistics.median(r["fanout_s"] for r in j["rounds"] if r["binary"] == binary) * 1e3 for j in jobs]
        ax1.plot(ns, fan, style, label=label)
    ax1.set_xlabel("processes")
    ax1.set_ylabel("published -> every rank holds it (ms)")
    ax1.set_title("time to agree (median of rounds)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    req = [statistics.median(r["requests"] for r in j["rounds"]) for j in jobs]
    ax2.plot(ns, req, "o-", label="all ranks")
    ax2.plot(ns, [3 * n for n in ns], ":", color="grey", label="3 per process")
    ax2.set_xlabel("processes")
    ax2.set_ylabel("key-value requests per agreement")
    ax2.set_title("coordinator requests")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(f"Agreement on a 2-core CPU: one jax.distributed job, stand-in tuning of {jobs[0]['tune_s']:g} s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tune-s", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    result = {"compile": compile_vs_binary()}
    c = result["compile"]
    print(f"compile, per config (sm_90, this CPU): median {c['compile_s_median']:.2f} s; "
          f"encoded binary median {c['encoded_bytes_median']} bytes", flush=True)
    result["jobs"] = []
    for n in a.ranks:
        job = simulate(n, a.rounds, a.tune_s, c["encoded_bytes_median"])
        result["jobs"].append(job)
        fan = sorted(r["fanout_s"] for r in job["rounds"])
        print(f"{n:4d} processes: agreed={all(r['agreed'] for r in job['rounds'])} "
              f"requests={[r['requests'] for r in job['rounds']]} per-rank max="
              f"{max(r['requests_per_rank_max'] for r in job['rounds'])} blocking gets per rank="
              f"{max(r['blocking_gets_per_rank_max'] for r in job['rounds'])} fan-out ms="
              f"{[round(f * 1e3, 1) for f in fan]} RSS max {job['rss_mib_max']:.0f} MiB, PSS total "
              f"{job['pss_mib_total']:.0f} MiB, job {job['job_s']:.0f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.plot:
        plot(result, a.plot)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        sys.path.pop(0)  # this file's folder (lazytriton/bench) must not shadow top-level modules
        _rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                   float(sys.argv[7]), int(sys.argv[8]))
    else:
        main()
