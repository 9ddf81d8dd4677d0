"""First-step time of a 2-process jax.distributed job (one GPU each, fresh
caches), with and without agreement (LAZYTRITON_AGREE), for a jitted program
whose 8-config autotuned matmul goes through lazytriton.jax.triton_call.
Every job starts with empty tuning and Triton caches but with the C++ stubs and
the FFI handler already built (a warm-up job builds them). Runs alternate
(agree, no agree, ...) so drift hits both alike.

    python benchmarks/distributed_first_step.py [--runs 2] [--size 2048]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "tests" / "gpu_distributed_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(agree: bool, size: int, n: int = 2, stubs: str | None = None, keep: str | None = None) -> list[dict]:
    """One job on fresh lazytriton and Triton caches; `stubs`: a directory of
    warm caches whose built C++ stubs and FFI handler each rank starts with
    (their g++ builds are not what is measured); `keep`: where to leave them."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = keep or tmp
        port = free_port()
        procs = []
        for r in range(n):
            if stubs:
                shutil.copytree(f"{stubs}/cache{r}/stubs", f"{tmp}/cache{r}/stubs")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(r), "LAZYTRITON_CACHE_DIR": f"{tmp}/cache{r}",
                   "LAZYTRITON_AGREE": "1" if agree else "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "TRITON_CACHE_DIR": f"{tmp}/triton{r}"}
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(r), str(n), str(port), str(size)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        out = []
        for r, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=600)
            if p.returncode != 0:
                sys.exit(f"rank {r} failed:\n{stderr[-3000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--size", type=int, default=2048)
    args = ap.parse_args()
    rows = {True: [], False: []}
    with tempfile.TemporaryDirectory() as warm:
        job(False, args.size, keep=warm)  # builds the stubs and the FFI handler once
        for _ in range(args.runs):
            for agree in (True, False):
                rows[agree].append(job(agree, args.size, stubs=warm))
    print(f"2 processes x 1 GPU, matmul {args.size}^3 fp16, 8 configs, fresh caches, {args.runs} run(s) each")
    print("agreement | first step per rank (s)          | slowest (median) | tunes | winners (config index)")
    for agree in (True, False):
        firsts = [[r["first_step_s"] for r in run] for run in rows[agree]]
        slowest = statistics.median(max(f) for f in firsts)
        winners = [[r["winner_index"] for r in run] for run in rows[agree]]
        tunes = [sum(r["lazytriton"]["tunes"] for r in run) for run in rows[agree]]
        per_rank = "; ".join(", ".join(f"{t:.2f}" for t in f) for f in firsts)
        print(f"{'on ' if agree else 'off'}       | {per_rank:32} | {slowest:16.2f} | {tunes} | {winners}")
    print(json.dumps({"on": rows[True], "off": rows[False]}))


if __name__ == "__main__":
    main()
