"""The JAX GPU-correctness tests of the modern-kernel and JAX-API features
(and the tuner's own GPU tests), run again under compute-sanitizer's memcheck with each XLA allocator: the
BFC allocator (one arena: an address a little off may still land in it) and
the platform allocator (one cudaMalloc per buffer: memcheck sees each
buffer's exact bounds). Each group runs in a pytest process of its own,
command buffers on (tests/conftest.py), compute-sanitizer following it and
its children (but where SANITIZER_ARGS says otherwise).

(The command-buffer matrix, test_gpu_capture_matrix.py, does the same for
the capture cases with a worker of its own.)
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # each test: a pytest run under memcheck
pytest.importorskip("jax")
TESTS = Path(__file__).resolve().parent

# group -> pytest arguments (files under tests/ and a -k selection of their JAX tests)
GROUPS = {
    "tma": ["test_gpu_tma.py", "-k", "jax"],
    "tuples": ["test_gpu_tuples.py", "-k", "jax"],
    "gluon": ["test_gpu_gluon.py", "-k", "triton_call"],
    # The export test runs two child processes of its own: kept out of the memcheck run's time.
    "jax_api": ["test_gpu_jax_api.py", "-k", "not export"],
    # The tuner's trials (interleaved timing, snapshots grown while candidates compile), on CuPy
    # arrays: XLA's allocator does not apply there, the JAX groups above tune through them too.
    # Not the test that compares timings: the sanitizer changes them.
    "tune_overlap": ["test_gpu_tune_overlap.py", "-k", "not as_it_times_alone"],
    # Issue 23: optional pointers switching between None and arrays in one process (CuPy), and a
    # Python int beyond int32 indexing an 8 GiB buffer through lazytriton.jax.
    "specialization": ["test_gpu_specialization.py"],
    # Issue 36: arrays on the other GPU refused, one process driving both GPUs (torch, CuPy, a jit on
    # device 1, shard_map over both with command buffers on). Needs two GPUs.
    "two_devices": ["test_gpu_two_devices.py"],
    # The stubs' reads of torch tensors (the torch reader, torch's getters) and CuPy arrays: views at
    # offsets, dtypes, parameters and subclasses in one process.
    "array_reads": ["test_gpu_array_reads.py"],
    # Issue 46: torch's streams, torch.cuda.graph capture and replay, option-named parameters (not
    # torch.compile's reduce-overhead test: Inductor's compile under the sanitizer takes minutes).
    "torch_streams": ["test_gpu_torch_streams.py", "-k", "not reduce_overhead"],
    # Issue 48: online tuning, every call one launch of one candidate on the caller's data (matmul,
    # in place, reset_to_zero, a side stream), CUDA events around the launches (not the tests that
    # start processes of their own).
    "online": ["test_gpu_online.py", "-k", "not restart and not jax"],
    # Issue 50: a faulting config's first launch isolated in a helper process, in pytest's own
    # process; the helper, whose kernel faults on purpose, is not followed (SANITIZER_ARGS).
    "isolation": ["test_gpu_isolation.py", "-k", "in_process"],
}
# group -> compute-sanitizer arguments of its own
SANITIZER_ARGS = {"isolation": ["--target-processes", "application-only"]}


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


@pytest.mark.parametrize("allocator", ["bfc", "platform"])
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_jax_tests_are_clean_under_memcheck(tmp_path, group, allocator):
    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer not installed")
    if group == "two_devices" and _gpu_count() < 2:
        pytest.skip("needs two GPUs")
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "ltcache"), "PYTHONUNBUFFERED": "1",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    if allocator == "platform":
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    files, *select = GROUPS[group]
    # Refusing an array of another device asks the driver, as Triton's launcher does, whether the
    # current context can read it: the expected answer is CUDA_ERROR_INVALID_VALUE, which the
    # sanitizer would count as an error; memory errors are what this run looks for.
    api = ["--report-api-errors", "no"] if group == "two_devices" else []
    cmd = ["compute-sanitizer", "--tool", "memcheck", *api, *SANITIZER_ARGS.get(group, []), "--error-exitcode", "99", "--print-limit", "20",
           sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "--rootdir", str(TESTS.parent), "-c", str(TESTS.parent / "pyproject.toml"),
           str(TESTS / files), *select]
    # cwd outside the checkout: the run imports the installed package.
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    # The report's headlines (what was hit, and where), not its host backtraces.
    said = "\n".join(ln for ln in out.splitlines()
                     if ln.startswith("=========") and "Host Frame" not in ln and ln.strip("= "))
    print(f"[{group} {allocator}] rc={r.returncode}\n{said[:3000]}\n" + "\n".join(out.splitlines()[-5:]))
    assert r.returncode == 0, said[:6000] + out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out, said[:6000]
    # Every selected test ran under the sanitizer: none skipped (no GPU seen there, say).
    summary = [ln for ln in out.splitlines() if " passed" in ln]
    assert summary and not any(w in summary[-1] for w in ("failed", "skipped", "error")), out[-4000:]
