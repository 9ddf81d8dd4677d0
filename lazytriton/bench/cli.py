"""`lazytriton bench`: runs a suite, shows progress, writes results.json,
report.md and plots."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from . import report, suites


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=("cpu", "quick", "full"), default=None,
                   help="cpu: what needs no GPU; quick: a few minutes on a GPU; full: more shapes and repetitions "
                        "(default: quick with a GPU, else cpu)")
    p.add_argument("--out", default="lazytriton-bench", help="directory for results.json, report.md and plots")
    p.add_argument("--processes", type=int, default=None,
                   help="processes each GPU section runs in (default: 3 for full, 2 for quick)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one GPU section in this process


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lazytriton bench", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    if args.worker:
        section, full, out = args.worker.split(":", 2)
        res = suites.GPU_SECTIONS[section](_progress, full == "full")
        Path(out).write_text(json.dumps(res))
        return 0
    import lazytriton

    gpu, why = lazytriton.gpu_available()
    suite = args.suite or ("quick" if gpu else "cpu")
    if suite != "cpu" and not gpu:
        print(f"lazytriton bench --suite {suite}: no GPU here ({why}); run --suite cpu", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"command": " ".join(["lazytriton", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"]
               else " ".join(sys.argv), "suite": suite, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "environment": _environment(gpu), "sections": {}}
    plan = ["cpu"] if suite == "cpu" else ["launch", "throughput", "cpu"]
    processes = args.processes or (3 if suite == "full" else 2)
    for i, name in enumerate(plan, 1):
        _progress(f"section {i}/{len(plan)}: {name}" + ("" if name == "cpu" else f" in {processes} processes"))
        if name == "cpu":
            results["sections"][name] = suites.cpu(_progress, suite == "full")
        else:
            results["sections"][name] = _in_processes(name, suite, processes, out)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    md = report.write(results, out)
    _progress(f"wrote {out / 'results.json'}, {md} and {len(list(out.glob('*.png')))} plot(s)")
    return 0


def _in_processes(section: str, suite: str, n: int, out: Path) -> dict:
    """The section in n fresh processes, one after another; samples are kept per
    process (the report takes the median process and the range over them)."""
    runs = []
    for i in range(n):
        path = out / f".{section}-{i}.json"
        _progress(f"{section}: process {i + 1}/{n}")
        r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--worker", f"{section}:{suite}:{path}"],
                           env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"lazytriton bench: section {section} failed in process {i + 1} (exit {r.returncode})")
        runs.append(json.loads(path.read_text()))
        path.unlink()
    merged = dict(runs[0])
    merged["rows"] = []
    for j, row in enumerate(runs[0]["rows"]):
        per = [r["rows"][j] for r in runs]
        merged["rows"].append({**row, "samples": [s for p in per for s in p["samples"]],
                               "process_samples": [p["samples"] for p in per],
                               **({"rate": [x for p in per for x in p["rate"]]} if "rate" in row else {})})
    if "tuning" in runs[0]:
        merged["tuning_per_process"] = [r["tuning"] for r in runs]
    return merged


def _environment(gpu: bool) -> dict:
    import triton

    import lazytriton

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "triton": triton.__version__, "lazytriton": lazytriton.__version__}
    try:
        import jax

        env["jax"] = jax.__version__
    except ImportError:
        pass
    if gpu:
        from lazytriton import _core

        dev = _core.device_info(0)
        env.update(device=dev["name"], capability=list(dev["capability"]), driver=dev["driver_version"])
    return env
