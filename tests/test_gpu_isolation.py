"""Issue 50 on a GPU: a candidate's first launch runs in a helper process with a CUDA
context of its own, so a config that faults or hangs never takes the program down.
Each case runs in a process of its own (tests/gpu_isolation_worker.py: fresh random
data, a poisoned output, compared with the input it copies), on each face; the
`in_process` tests run in pytest's own process (the memcheck group runs them under
compute-sanitizer, which then checks the caller, not the helper that faults)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import triton

import lazytriton
from lazytriton.cache import verdicts
from lazytriton.runtime import isolation
from kernels import isolation as kernels

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "gpu_isolation_worker.py"


def run(face: str, kernel: str, n: int, cache_dir: Path, **env) -> dict:
    full = {**os.environ, "LAZYTRITON_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1", **env}
    r = subprocess.run([sys.executable, str(WORKER), face, kernel, str(n)], capture_output=True, text=True,
                       env=full, timeout=300, cwd=str(cache_dir.parent))
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(face, kernel, n, json.dumps(out["isolation"]), f"{out['elapsed_s']:.2f} s")
    return out


def persisted(cache_dir: Path) -> dict:
    """verdict -> how many binaries have it, from the verdict files."""
    found: dict = {}
    for path in Path(cache_dir).glob(f"**/{verdicts.SUBDIR}/*{verdicts.EXT}"):
        doc = verdicts.decode(path.name[:-len(verdicts.EXT)], path.read_bytes())
        if doc["key"] == doc["binary"]:
            found[doc["verdict"]] = found.get(doc["verdict"], 0) + 1
    return found


FACES = ["cupy", "torch"]


def _face(face: str) -> None:
    pytest.importorskip(face)


@pytest.mark.parametrize("face", FACES)
def test_a_faulting_config_is_left_out_and_the_call_returns_the_good_result(face, cache_dir):
    _face(face)
    n = 1 << 20
    r = run(face, "one_faulty", n, cache_dir)
    assert r["error"] is None and r["correct"], r
    assert r["next_cuda_work"] is True, r
    iso = r["isolation"]
    assert (iso["faults"], iso["ok"], iso["hangs"], iso["unchecked"]) == (1, 2, 0, 0), iso
    # torch's and CuPy's default allocators are cudaMalloc's: every buffer went through IPC.
    assert iso["ipc_buffers"] == 3 * 2 and iso["staged_buffers"] == 0, iso
    assert persisted(cache_dir) == {"ok": 2, "fault": 1}

    # A second process, another specialization's key (n): config 1 is neither compiled nor launched,
    # the two proven binaries launch with no helper at all.
    again = run(face, "one_faulty", n + 16, cache_dir)
    assert again["error"] is None and again["correct"] and again["next_cuda_work"] is True, again
    assert again["isolation"]["helpers"] == 0 and again["isolation"]["jobs"] == 0, again
    assert again["stats"]["compiles"] == 0, again["stats"]

    # A warm start: the persisted winner, no helper.
    warm = run(face, "one_faulty", n, cache_dir)
    assert warm["correct"] and warm["stats"]["record_hits"] == 1 and warm["isolation"]["helpers"] == 0, warm


@pytest.mark.parametrize("face", FACES)
def test_every_config_faulting_is_a_clear_error_and_the_context_lives(face, cache_dir):
    _face(face)
    r = run(face, "all_faulty", 1 << 16, cache_dir)
    assert r["error"] is not None, r
    for part in ("kernel all_faulty", "config 0 (BLOCK: 128", "config 1 (BLOCK: 512", "CUDA_ERROR_ILLEGAL_ADDRESS",
                 "isolated first launch", "context is unaffected"):
        assert part in r["error"], (part, r["error"])
    assert r["next_cuda_work"] is True, r
    assert persisted(cache_dir) == {"fault": 2}
    assert not list(Path(cache_dir).glob("**/records/*.ltr"))  # no winner

    # A second process launches neither (nor compiles them): the same error, from the verdicts.
    again = run(face, "all_faulty", 1 << 16, cache_dir)
    assert "kernel all_faulty" in again["error"] and "CUDA_ERROR_ILLEGAL_ADDRESS" in again["error"], again
    assert again["isolation"]["jobs"] == 0 and again["stats"]["compiles"] == 0, again
    assert again["next_cuda_work"] is True


@pytest.mark.parametrize("face", FACES)
def test_a_hanging_config_is_abandoned_within_the_bound(face, cache_dir):
    _face(face)
    bound = 3.0
    r = run(face, "one_hanging", 1 << 16, cache_dir, LAZYTRITON_ISOLATION_TIMEOUT=str(bound))
    assert r["error"] is None and r["correct"] and r["next_cuda_work"] is True, r
    iso = r["isolation"]
    assert iso["hangs"] == 1 and iso["ok"] == 1, iso
    # The hung job: its copies, the load and the bound, then the helper killed (and another started).
    assert iso["isolated_s"] < bound + 20, iso
    assert persisted(cache_dir) == {"ok": 1, "hang": 1}


@pytest.mark.parametrize("allocator", ["bfc", "platform"])
def test_jax_face(allocator, cache_dir):
    pytest.importorskip("jax")
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if allocator == "platform":
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    n = 1 << 20
    r = run("jax", "one_faulty", n, cache_dir, **env)
    assert r["error"] is None and r["correct"] and r["next_cuda_work"] is True, r
    iso = r["isolation"]
    assert (iso["faults"], iso["ok"]) == (1, 2), iso
    print(f"XLA {allocator}: {iso['ipc_buffers']} buffers through IPC, {iso['copied_buffers']} as device copies, "
          f"{iso['staged_buffers']} staged")
    # Each job's x and out: XLA's own memory by IPC where it can be exported, else a device copy of it
    # (the device has room: none goes through host memory).
    assert iso["ipc_buffers"] + iso["copied_buffers"] == 3 * 2 and iso["staged_buffers"] == 0, iso

    again = run("jax", "one_faulty", n + 16, cache_dir, **env)
    assert again["correct"] and again["isolation"]["jobs"] == 0 and again["stats"]["compiles"] == 0, again

    bad = run("jax", "all_faulty", 1 << 16, cache_dir, **env)
    assert bad["error"] is not None and "all_faulty" in bad["error"], bad
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in bad["error"], bad
    assert bad["next_cuda_work"] is True, bad

    hang = run("jax", "one_hanging", 1 << 16, cache_dir, LAZYTRITON_ISOLATION_TIMEOUT="3", **env)
    assert hang["correct"] and hang["isolation"]["hangs"] == 1 and hang["next_cuda_work"] is True, hang


def test_in_process_a_faulting_config_leaves_this_process_working(cache_dir):
    """In pytest's own process (the memcheck group's subject): the faulting config runs only in the
    helper, this process tunes the others on its buffers and its context stays usable."""
    cp = pytest.importorskip("cupy")
    n = 1 << 18
    host = np.random.default_rng().standard_normal(n).astype(np.float32)
    x, out = cp.asarray(host), cp.full(n, cp.nan, cp.float32)
    before = isolation.stats()
    lazytriton.kernel(kernels.one_faulty)[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n, out)
    np.testing.assert_array_equal(cp.asnumpy(out), host)
    after = isolation.stats()
    assert after["faults"] - before["faults"] == 1 and after["ok"] - before["ok"] == 2
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_allclose(cp.asnumpy(x * 3), host * 3)


def test_in_process_every_config_faulting_raises_and_this_process_goes_on(cache_dir):
    cp = pytest.importorskip("cupy")
    n = 1 << 16
    x, out = cp.ones(n, cp.float32), cp.zeros(n, cp.float32)
    with pytest.raises(RuntimeError, match="kernel all_faulty") as e:
        lazytriton.kernel(kernels.all_faulty)[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n, out)
    assert "config 0 (BLOCK: 128" in str(e.value) and "config 1 (BLOCK: 512" in str(e.value)
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(e.value)
    cp.cuda.runtime.deviceSynchronize()
    assert float((x * 2).sum()) == 2 * n
