"""Agreement on a GPU machine: 2 and 4 processes of one jax.distributed job,
ranks sharing the GPUs round-robin (on one GPU, all of them share it), each
with its own empty cache as separate hosts would have; a jitted program with an
8-config autotuned matmul through triton_call. One process tunes; the others
receive its winner and binary through JAX's key-value store: no compile, no
tuning there; every rank launches the same config and computes the right result."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
WORKER = Path(__file__).resolve().parent / "gpu_distributed_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpus() -> int:
    import lazytriton

    return lazytriton._core.device_count()


def run_job(tmp_path, agree: bool, n: int = 2, size: int = 1024) -> list[dict]:
    """One job of n processes, rank r on GPU r % GPUs, each with its own empty cache."""
    port, gpus = free_port(), _gpus()
    procs = []
    for r in range(n):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(r % gpus), "LAZYTRITON_CACHE_DIR": str(tmp_path / f"cache{r}"),
               "LAZYTRITON_AGREE": "1" if agree else "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
               "TRITON_CACHE_DIR": str(tmp_path / f"triton{r}")}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(r), str(n), str(port), str(size)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=400))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{err[-5000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.parametrize("n", [2, 4])
def test_one_process_tunes_all_launch_its_winner(tmp_path, n):
    res = run_job(tmp_path, agree=True, n=n)
    tuner = [r for r in res if r["agreement"]["resolved_here"] == 1]
    receivers = [r for r in res if r["agreement"]["received"] == 1]
    assert len(tuner) == 1 and len(receivers) == n - 1, res
    tuner = tuner[0]
    assert tuner["lazytriton"]["tunes"] == 1 and tuner["lazytriton"]["compiles"] > 1
    for receiver in receivers:
        # The winner's binary came with the choice: nothing compiled, nothing tuned here.
        assert receiver["lazytriton"]["tunes"] == 0 and receiver["lazytriton"]["compiles"] == 0, receiver
        assert receiver["winner_index"] == tuner["winner_index"]
        # The receiver's own record (in memory and persisted) says where its winner came from.
        for agreed in (receiver["agreed"], receiver["stored_agreed"]):
            assert agreed["from_rank"] == tuner["rank"] and agreed["winner_index"] == tuner["winner_index"]
            assert "their_compile_key" not in agreed  # the same binary on both
        assert receiver["stored_winner_index"] == tuner["winner_index"]
    assert tuner["agreed"] is None
    assert all(r["rel_err"] < 1e-2 for r in res), res


def test_opted_out_processes_tune_on_their_own(tmp_path):
    res = run_job(tmp_path, agree=False)
    for r in res:
        assert r["lazytriton"]["tunes"] == 1 and r["agreement"]["resolved_here"] == 0 and r["agreed"] is None
        assert r["rel_err"] < 1e-2
