"""Compile-only timings on the CPU (no GPU): every candidate of the benchmark
harness's 16-call-site program (lazytriton/bench/field.py: 15 distinct
kernels, 76 candidates) compiled for sm_90 through the compile server, as the
JAX lowering asks for them (one compile stream per kernel, all at once), and
one matmul's 8 candidates alone. Where each candidate's front end ran (here,
holding the GIL, or in a worker from its portable recipe) is what changed in
issue 33; this measures when the program's kernels are compiled.

    python benchmarks/compile_front_ends.py [--repeat 3] [--only program|one]

Each run is a fresh process with an empty Triton cache and a compile server
made ready before the clock starts. Prints, per run and as the median of the
runs: when every candidate had reached the server ("handed"), when the first
kernel and half the kernels had all their candidates, when the last did
("all"), and the seconds of Triton's front end spent in this process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

RUN = r"""
import json, os, sys, threading, time
sys.path.insert(0, os.environ["LT_PKG_DIR"])
import ltfield_cpu.kernels as K
from triton.backends.compiler import GPUTarget
from lazytriton.compile import pool as compile_pool, schedule
from lazytriton.compile.compiler import Binder, Candidate, compile_stream
from lazytriton.model.arrays import DeviceArray
from lazytriton.model.spec import kernel_spec

T = GPUTarget("cuda", 90, 32)
P = DeviceArray(0x7F0000000000, "fp16", 1 << 24)
MM = (P, P, 1024, 1024, 1024, 1024, 1, 1024, 1, 1024, 1, P)
sites = [(k, MM) for k in K.MATMULS] + [(k, (P, 2048, P)) for k in K.ROWWISE] + \
        [(k, (P, P, 1 << 20, P)) for k in K.ELEMENTWISE]
if os.environ["LT_WHICH"] == "one":
    sites = sites[:1]
streams = []
for kernel, args in sites:
    spec = kernel_spec(kernel)
    b = Binder(spec, T)
    streams.append((spec, [Candidate(i, c, b.bind(args, c.all_kwargs())) for i, c in enumerate(spec.configs)]))
assert compile_pool.get_pool().wait_ready()
done = {}
t0 = time.perf_counter()

def run(spec, cands, order):
    for c in compile_stream(spec, T, cands, order=order):
        assert c.binary is not None, c.error
    done[spec.name + str(order)] = time.perf_counter() - t0

threads = [threading.Thread(target=run, args=(s, c, schedule.next_order())) for s, c in streams]
for t in threads:
    t.start()
for t in threads:
    t.join()
hist = [h for h in schedule.history() if h["queued"] >= t0]
ends = sorted(done.values())
cands = [c for _, cs in streams for c in cs]
print(json.dumps({
    "handed": max(h.get("front_end_done", t0) for h in hist) - t0,
    "first_kernel": ends[0], "half_kernels": ends[len(ends) // 2], "all": ends[-1],
    "front_end_here_s": sum(c.extra.get("front_end_s", 0.0) for c in cands
                            if c.extra.get("front_end", "here") == "here"),
    "front_ends_in_workers": sum(c.extra.get("front_end") == "worker" for c in cands),
    "candidates": len(cands)}))
"""


def one_run(which: str, pkg: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lt-fe-") as d:
        env = dict(os.environ, LT_PKG_DIR=pkg, LT_WHICH=which, TRITON_CACHE_DIR=os.path.join(d, "triton"),
                   LAZYTRITON_CACHE_DIR=os.path.join(d, "lt"), TRITON_DEFAULT_FP_FUSION="1")
        p = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            raise SystemExit(p.stderr[-4000:])
        return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("program", "one"))
    ap.add_argument("--out", help="write every run's numbers here (JSON)")
    args = ap.parse_args(argv)
    from lazytriton.bench import field

    pkg = tempfile.mkdtemp(prefix="lt-fe-pkg-")
    os.makedirs(os.path.join(pkg, "ltfield_cpu"))
    open(os.path.join(pkg, "ltfield_cpu", "__init__.py"), "w").close()
    with open(os.path.join(pkg, "ltfield_cpu", "kernels.py"), "w") as f:
        f.write(textwrap.dedent(field.KERNELS))
    results = {}
    for which in ("program", "one"):
        if args.only and args.only != which:
            continue
        runs = []
        for i in range(args.repeat):
            r = one_run(which, pkg)
            runs.append(r)
            print(f"{which} run {i + 1}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in r.items()), flush=True)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        results[which] = {"median": med, "runs": runs}
        print(f"{which} median: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
