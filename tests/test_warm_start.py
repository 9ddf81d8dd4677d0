"""A new process finds the winner a former one persisted, for every kernel:
also one that reads a tl.constexpr-wrapped Python function (seen on scan and
cumsum kernels), whose Triton cache_key holds a memory address and so differs
in every process. Real processes, real Triton compiles for sm_90, the
recording stand-in driver (tests/fake_cuda)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "warm_start_worker.py"

HEAD = """
import triton
import triton.language as tl

CONFIGS = [triton.Config({"B": 64}, num_warps=2), triton.Config({"B": 128}, num_warps=4)]
"""

MODULES = {
    # A Python function wrapped in a constexpr: its repr is "<function _twice at 0x...>".
    "reads_a_constexpr_function": HEAD + """
def _twice(v):
    return v * 2

SCALE = tl.constexpr(_twice)

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def k(x, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    y = tl.load(x + o, mask=o < n)
    if SCALE is not None:
        y = y * 2
    tl.store(x + o, y, mask=o < n)
""",
    # A callee that reads it: the address reaches the kernel's key through the callee's.
    "callee_reads_a_constexpr_function": HEAD + """
def _twice(v):
    return v * 2

SCALE = tl.constexpr(_twice)

@triton.jit
def scale(y):
    if SCALE is not None:
        y = y * 2
    return y

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def k(x, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(x + o, scale(tl.load(x + o, mask=o < n)), mask=o < n)
""",
    "reads_a_module_constexpr": HEAD + """
FACTOR = tl.constexpr(3)

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def k(x, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) * FACTOR, mask=o < n)
""",
}


def run(tmp_path, fake, name) -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake), "TRITON_LIBCUDA_PATH": str(fake),
           "FAKE_CUDA_LOG": str(tmp_path / "launches.jsonl"), "FAKE_CUDA_PARAM_SIZES": "k:8,4,8,8",
           "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1")}
    r = subprocess.run([sys.executable, str(WORKER), str(tmp_path), name], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_new_process_finds_the_persisted_winner(tmp_path, fake_driver, name):
    (tmp_path / f"{name}.py").write_text(MODULES[name])
    first = run(tmp_path, fake_driver, name)
    assert first["compiles"] == 2 and first["tunes"] == 1, first
    second = run(tmp_path, fake_driver, name)
    assert second["fingerprint"] == first["fingerprint"]
    assert (second["compiles"], second["tunes"], second["record_hits"]) == (0, 0, 1), second
    if "constexpr_function" in name:  # the case this guards: Triton's own key is not stable
        assert second["triton_cache_key"] != first["triton_cache_key"]
