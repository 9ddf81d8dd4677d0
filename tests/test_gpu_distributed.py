"""Agreement on the 2-GPU machine: 2 processes, one GPU each, jax.distributed,
a jitted program with an 8-config autotuned matmul through triton_call. One
process tunes, the other compiles the winner alone; both launch the same config."""
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


def run_job(tmp_path, agree: bool, n: int = 2, size: int = 1024) -> list[dict]:
    """One job of n processes, one GPU each, each with its own empty cache."""
    port = free_port()
    procs = []
    for r in range(n):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(r), "LAZYTRITON_CACHE_DIR": str(tmp_path / f"cache{r}"),
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


def _gpus() -> int:
    import lazytriton

    return lazytriton._core.device_count()


def test_one_process_tunes_both_launch_its_winner(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    res = run_job(tmp_path, agree=True)
    tuner = [r for r in res if r["agreement"]["resolved_here"] == 1]
    receiver = [r for r in res if r["agreement"]["received"] == 1]
    assert len(tuner) == 1 and len(receiver) == 1, res
    tuner, receiver = tuner[0], receiver[0]
    assert tuner["lazytriton"]["tunes"] == 1 and tuner["lazytriton"]["compiles"] > 1
    assert receiver["lazytriton"]["tunes"] == 0 and receiver["lazytriton"]["compiles"] == 1  # the winner alone
    assert receiver["winner_index"] == tuner["winner_index"]
    # The receiver's own record (in memory and persisted) says where its winner came from.
    for agreed in (receiver["agreed"], receiver["stored_agreed"]):
        assert agreed["from_rank"] == tuner["rank"] and agreed["winner_index"] == tuner["winner_index"]
        assert "their_compile_key" not in agreed  # the same binary on both
    assert receiver["stored_winner_index"] == tuner["winner_index"] and tuner["agreed"] is None
    assert all(r["rel_err"] < 1e-2 for r in res), res


def test_opted_out_processes_tune_on_their_own(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    res = run_job(tmp_path, agree=False)
    for r in res:
        assert r["lazytriton"]["tunes"] == 1 and r["agreement"]["resolved_here"] == 0 and r["agreed"] is None
        assert r["rel_err"] < 1e-2
