"""First-step time of a 2-process jax.distributed job (one GPU each, fresh
lazytriton and Triton caches), with and without agreement
(LAZYTRITON_AGREE), for a jitted program whose 8-config autotuned matmul goes
through lazytriton.jax.triton_call. Every job starts with the C++ stubs and
the FFI handler already built (a warm-up job builds them: their g++ builds are
not what is measured). Jobs alternate (agreement on, off, ...) so drift hits
both alike. Needs two GPUs; the harness runs it in its full suite when there
are.

    python -m lazytriton.bench.distributed RANK NPROC PORT SIZE   (one rank; the harness starts them)
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

from .common import row

ROWS = ["first step, agreement on (slowest rank)", "first step, agreement off (slowest rank)"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(agree: bool, size: int, n: int = 2, stubs: str | None = None, keep: str | None = None) -> list[dict]:
    """One job on fresh caches; `stubs`: a directory of warm caches whose built
    stubs each rank starts with; `keep`: where to leave this job's caches."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = keep or tmp
        port, procs = _free_port(), []
        for r in range(n):
            if stubs and os.path.isdir(f"{stubs}/cache{r}/stubs"):
                shutil.copytree(f"{stubs}/cache{r}/stubs", f"{tmp}/cache{r}/stubs")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(r), "LAZYTRITON_CACHE_DIR": f"{tmp}/cache{r}",
                   "LAZYTRITON_AGREE": "1" if agree else "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "TRITON_CACHE_DIR": f"{tmp}/triton{r}"}
            procs.append(subprocess.Popen([sys.executable, "-m", "lazytriton.bench.distributed", str(r), str(n),
                                           str(port), str(size)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=tmp))
        out = []
        for r, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"rank {r} failed: {stderr.strip()[-2000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out


def run(progress, suite: str) -> dict:
    size, runs = 2048, (2 if suite == "full" else 1)
    samples = {True: [], False: []}
    per = {True: [], False: []}
    with tempfile.TemporaryDirectory() as warm:
        progress("distributed: warm-up job (builds the stubs and the FFI handler)")
        job(False, size, keep=warm)
        for i in range(runs):
            for agree in (True, False):
                progress(f"distributed: job {i + 1}/{runs}, agreement {'on' if agree else 'off'}")
                ranks = job(agree, size, stubs=warm)
                samples[agree].append(max(r["first_step_s"] for r in ranks))
                per[agree].append(ranks)
    rows = []
    for agree, name in zip((True, False), ROWS):
        ranks = per[agree]
        rows.append(row(name, "lazytriton", samples[agree], jobs=ranks,
                        tunes=[sum(r["tunes"] for r in job_) for job_ in ranks],
                        correct=all(r["rel_err"] < 1e-2 for job_ in ranks for r in job_)))
    return {"sections": {"distributed": {
        "title": f"First step of a 2-process jax.distributed job (matmul {size}^3, 8 configs, fresh caches)",
        "unit": "s", "better": "lower", "rows": rows,
        "notes": ["agreement on: one rank tunes, the other launches its winner; off: every rank tunes"]}}}


def _rank_main(rank: int, n: int, port: int, size: int) -> None:
    import time

    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=rank,
                               initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    import triton

    import lazytriton
    from lazytriton.demo_kernels import demo_matmul
    from lazytriton.jax import triton_call

    m = size

    def mm(a, b):
        return triton_call(a, b, M=m, N=m, K=m, sam=m, sak=1, sbk=m, sbn=1, scm=m, scn=1, kernel=demo_matmul,
                           out_type=jax.ShapeDtypeStruct((m, m), jnp.float16),
                           grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(m, meta["BN"])))

    ka, kb = jax.random.split(jax.random.key(0))  # the same inputs on every rank
    a = jax.random.normal(ka, (m, m), jnp.float16)
    b = jax.random.normal(kb, (m, m), jnp.float16)
    a.block_until_ready()
    b.block_until_ready()
    f = jax.jit(mm)
    t0 = time.perf_counter()
    out = f(a, b).block_until_ready()  # the first step: compile, agree or tune, launch
    first = time.perf_counter() - t0
    ref = np.asarray(jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)))
    err = float(np.abs(np.asarray(out, np.float32) - ref).max() / np.abs(ref).max())
    st = lazytriton.stats()
    print(json.dumps({"rank": rank, "first_step_s": first, "rel_err": err, "tunes": st["tunes"],
                      "compiles": st["compiles"], "record_hits": st["record_hits"]}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    _rank_main(*(int(a) for a in sys.argv[1:5]))
