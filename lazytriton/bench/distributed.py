"""First-step time of a jax.distributed job of 2 and of 4 processes (fresh
lazytriton and Triton caches per rank, as separate hosts would have), with and
without agreement (LAZYTRITON_AGREE), for a jitted program whose 8-config
autotuned matmul goes through lazytriton.jax.triton_call. Ranks share the
machine's GPUs round-robin (rank r on GPU r % GPUs): on a one-GPU machine
every rank shares GPU 0. Every job starts with the C++ stubs and the FFI
handler already built (a warm-up job builds them: their g++ builds are not
what is measured). Jobs alternate (agreement on, off, ...) so drift hits both
alike. Checked per job: every rank launched the same winner (agreement on),
results correct. The harness runs it in its full suite with 2 GPUs or more,
and on one GPU when asked for (--only=distributed).

    python -m lazytriton.bench.distributed RANK NPROC PORT SIZE   (one rank; the harness starts them)
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from .common import row

RANKS = (2, 4)
ROWS = [f"first step, {n} ranks, agreement {state} (slowest rank)" for n in RANKS for state in ("on", "off")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpus() -> int:
    from .. import _core

    return max(1, _core.device_count())


def job(agree: bool, size: int, n: int = 2, stubs: str | None = None, keep: str | None = None,
        gpus: int | None = None) -> list[dict]:
    """One job of n ranks on fresh caches, rank r on GPU r % gpus; `stubs`: a
    directory of warm caches whose built stubs each rank starts with; `keep`:
    where to leave this job's caches."""
    gpus = gpus or _gpus()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = keep or tmp
        port, procs = _free_port(), []
        for r in range(n):
            if stubs and os.path.isdir(f"{stubs}/cache{r}/stubs"):
                shutil.copytree(f"{stubs}/cache{r}/stubs", f"{tmp}/cache{r}/stubs")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(r % gpus), "LAZYTRITON_CACHE_DIR": f"{tmp}/cache{r}",
                   "LAZYTRITON_AGREE": "1" if agree else "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "TRITON_CACHE_DIR": f"{tmp}/triton{r}"}
            procs.append(subprocess.Popen([sys.executable, "-m", "lazytriton.bench.distributed", str(r), str(n),
                                           str(port), str(size)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=tmp))
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=600))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for r, (p, (stdout, stderr)) in enumerate(zip(procs, outs)):
            if p.returncode != 0:
                raise RuntimeError(f"rank {r} of {n} failed: {stderr.strip()[-2000:]}")
        return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outs]


def run(progress, suite: str) -> dict:
    size, runs = 2048, (2 if suite == "full" else 1)
    gpus = _gpus()
    samples = {(n, agree): [] for n in RANKS for agree in (True, False)}
    per = {key: [] for key in samples}
    with tempfile.TemporaryDirectory() as warm:
        progress("distributed: warm-up job (builds the stubs and the FFI handler)")
        job(False, size, n=max(RANKS), keep=warm, gpus=gpus)
        for n in RANKS:
            for i in range(runs):
                for agree in (True, False):
                    progress(f"distributed: {n} ranks, job {i + 1}/{runs}, agreement {'on' if agree else 'off'}")
                    ranks = job(agree, size, n=n, stubs=warm, gpus=gpus)
                    samples[n, agree].append(max(r["first_step_s"] for r in ranks))
                    per[n, agree].append(ranks)
    rows, notes = [], []
    for n in RANKS:
        for agree in (True, False):
            jobs = per[n, agree]
            rows.append(row(f"first step, {n} ranks, agreement {'on' if agree else 'off'} (slowest rank)",
                            "lazytriton" if agree else "other", samples[n, agree], jobs=jobs,
                            tunes=[sum(r["tunes"] for r in j) for j in jobs],
                            same_winner=[len({r["winner_index"] for r in j}) == 1 for j in jobs],
                            correct=all(r["rel_err"] < 1e-2 for j in jobs for r in j)))
        on, off = statistics.median(samples[n, True]), statistics.median(samples[n, False])
        same = all(len({r["winner_index"] for r in j}) == 1 for j in per[n, True])
        notes.append(f"{n} ranks: agreement on / off = {on / off:.2f}x (medians {on:.2f} s / {off:.2f} s); "
                     f"every rank the same winner with agreement: {'yes' if same else 'NO'}")
    where = "one GPU shared by every rank" if gpus == 1 else f"{gpus} GPUs, rank r on GPU r % {gpus}"
    return {"sections": {"distributed": {
        "title": f"First step of a jax.distributed job, 2 and 4 ranks ({where}; matmul {size}^3, 8 configs, "
                 "fresh caches per rank)",
        "unit": "s", "better": "lower", "rows": rows, "gpus": gpus,
        "notes": notes + ["agreement on: one rank tunes, the others receive its winner and binary through JAX's "
                          "key-value store; off: every rank tunes (ranks sharing a GPU tune side by side)"]}}}


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
    from lazytriton import distributed
    from lazytriton.cache import Cache

    cache = Cache()
    records = [cache.show(e.key)["record"] for e in cache.entries() if e.kind == "record"]
    print(json.dumps({"rank": rank, "first_step_s": first, "rel_err": err, "tunes": st["tunes"],
                      "compiles": st["compiles"], "record_hits": st["record_hits"],
                      "winner_index": [r["winner_index"] for r in records][-1] if records else None,
                      "agreement": distributed.stats()}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    _rank_main(*(int(a) for a in sys.argv[1:5]))
