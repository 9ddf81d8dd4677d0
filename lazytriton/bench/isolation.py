"""What isolating first launches costs (issue 50): the first call of the demo's 8-config
matmul (2048^3 fp16, lazytriton/demo_kernels.py, torch arrays) and of the field package's
8-config matmul (a package that imports torch and jax: bench/field.py), each cold (fresh
process, empty caches) with LAZYTRITON_ISOLATION on and off, rows interleaved in the
same run; and the helper process's memory (resident, and the device memory its CUDA
context holds), read while it lives.

    python -m lazytriton.bench.isolation [--repeat 3] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from . import cold, field

# (name, label, script, environment): run `repeat` times each, interleaved
ROWS = [
    # No launch stub or torch reader built (g++, in the background, 15 s after the call): the rows end sooner.
    ("demo-on", "demo matmul, isolation on", "demo", {"LAZYTRITON_ISOLATION": "1", "LAZYTRITON_STUB_BUILD": "off"}),
    ("demo-off", "demo matmul, isolation off", "demo", {"LAZYTRITON_ISOLATION": "0", "LAZYTRITON_STUB_BUILD": "off"}),
    ("field-on", "field package's matmul, isolation on", "field", {"LT_MODE": "lazy", "LAZYTRITON_ISOLATION": "1"}),
    ("field-off", "field package's matmul, isolation off", "field", {"LT_MODE": "lazy", "LAZYTRITON_ISOLATION": "0"}),
]


def _demo(env: dict, caches: str, label: str, say) -> dict:
    out = os.path.join(caches, "out.json")
    full = {**os.environ, "LAZYTRITON_CACHE_DIR": os.path.join(caches, "lt"),
            "TRITON_CACHE_DIR": os.path.join(caches, "triton"), "TRITON_DEFAULT_FP_FUSION": "1", **env}
    p = subprocess.run([sys.executable, "-c", cold.LAZY, out], env=full, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        say(f"  {label}: failed\n{p.stderr[-6000:]}")
        return {"failed": True}
    r = json.load(open(out))
    return {"first_s": r["first_call_s"], "max_err": r["max_err"], "isolation": r.get("isolation") or {},
            "tunes": r["stats"]["tunes"]}


def measure(repeat: int = 3, say=print) -> dict:
    """{row name: {"label", "first_s": [...], "median_s", "isolation": the last run's report}}, and
    "overhead": the median first call with isolation on over off, per kernel."""
    root = tempfile.mkdtemp(prefix="lt-isolation-")
    pkg = field.write_package(root)
    res = {name: {"label": label, "first_s": []} for name, label, _, _ in ROWS}
    try:
        for i in range(repeat):
            for name, label, script, env in ROWS:
                d = os.path.join(root, f"{name}-{i}")
                os.makedirs(d)
                t = time.perf_counter()
                r = (_demo(env, d, label, say) if script == "demo" else
                     field.one_process(field.ONE, env, pkg, d, f"{label} (run {i + 1})", say=lambda *_: None))
                if r.get("failed"):
                    say(f"  {label}: failed ({r.get('error', '')})")
                    continue
                res[name]["first_s"].append(r["first_s"])
                res[name]["isolation"] = r.get("isolation") or {}
                iso = res[name]["isolation"]
                say(f"  {label} (run {i + 1}): first call {r['first_s']:.3f} s; isolation {iso.get('stats', {})}; "
                    f"helper {iso.get('helper_rss_bytes', 0) / 2**20:.0f} MiB resident, "
                    f"{iso.get('helper_device_bytes', 0) / 2**20:.0f} MiB of device memory "
                    f"({time.perf_counter() - t:.1f} s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in res.values():
        r["median_s"] = statistics.median(r["first_s"]) if r["first_s"] else None
    res["overhead"] = {k: (res[f"{k}-on"]["median_s"] / res[f"{k}-off"]["median_s"]
                           if res[f"{k}-on"]["median_s"] and res[f"{k}-off"]["median_s"] else None)
                       for k in ("demo", "field")}
    return res


def table(res: dict) -> str:
    lines = ["| first call, cold (fresh process and caches) | median (s) | runs (s) |", "| --- | --- | --- |"]
    for name, label, _, _ in ROWS:
        r = res[name]
        if r["median_s"] is not None:
            lines.append(f"| {label} | {r['median_s']:.3f} | {', '.join(f'{v:.3f}' for v in r['first_s'])} |")
    for k, v in res["overhead"].items():
        if v is not None:
            lines.append(f"| {k}: isolation on / off | {v:.3f}x | |")
    iso = res["demo-on"].get("isolation") or {}
    if "helper_rss_bytes" in iso or "helper_device_bytes" in iso:
        lines.append(f"| helper process: resident / device memory of its context | "
                     f"{iso.get('helper_rss_bytes', 0) / 2**20:.0f} MiB / {iso.get('helper_device_bytes', 0) / 2**20:.0f} MiB | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="runs of each row, interleaved (default 3)")
    p.add_argument("--out", default=None, help="write every row's numbers here (JSON)")
    opts = p.parse_args(argv)
    res = measure(opts.repeat)
    print(table(res))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
