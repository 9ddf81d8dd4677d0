"""Issue 50 without a GPU: a candidate's first launch isolated in a helper process, on the
recording stand-in driver (tests/fake_cuda), which faults or hangs a launch by its block
size as a real context would (a fault: that launch and everything after it in the process
answer CUDA_ERROR_ILLEGAL_ADDRESS). Real processes, real Triton compiles for sm_90, real
helper processes; tests/test_gpu_isolation.py does the same on a GPU.

What is checked: the protocol (the helper's start, frames, idle exit, what it imports);
a faulting config never launched in the caller, the call going on with the others (the
standalone face, and the JAX face's first execution);
verdicts persisted per binary (a second process neither compiles nor launches a failed
config, a proven binary needs no helper, a warm start none at all); every config failing:
one error naming the kernel, each config and its reason, the caller's context alive; a
hang abandoned within the bound; IPC, a device copy by IPC or host staging per buffer; the settings."""
import json
import logging
import os
import pickle
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lazytriton import _core, settings
from lazytriton.cache import Cache, verdicts
from lazytriton.runtime import isolation

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "isolation_worker.py"
X, OUT = "0x7f0000000000", 0x7F1000000000
BLOCK = {0: 32, 1: 64, 2: 128}  # each config's threads per block (num_warps 1, 2, 4)


def run(tmp_path: Path, fake: Path, n: int = 4096, log: str = "launches", x: str = X, jax: bool = False,
        **env) -> tuple[dict, list]:
    full = {**os.environ, "LD_LIBRARY_PATH": str(fake), "TRITON_LIBCUDA_PATH": str(fake),
            "FAKE_CUDA_LOG": str(tmp_path / f"{log}.jsonl"), "FAKE_CUDA_LOG_HELPER": "1",
            "FAKE_CUDA_PARAM_SIZES": "scale:8,8,4,8,8",
            "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
            "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"), **env}
    for name in ("FAKE_CUDA_FAULT_BLOCK", "FAKE_CUDA_HANG_BLOCK", "FAKE_CUDA_IPC", "FAKE_CUDA_FREE_BYTES"):
        if name not in env:
            full.pop(name, None)
    r = subprocess.run([sys.executable, str(WORKER), str(n), x, *(["--jax"] if jax else [])], env=full,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    path = tmp_path / f"{log}.jsonl"
    launches = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return json.loads(r.stdout.strip().splitlines()[-1]), launches


def caller_launches(launches: list, x: str = X) -> list:
    """The launches on the caller's own buffers (the helper's are on copies of its own)."""
    want = int(x, 16).to_bytes(8, "little").hex()
    return [ln for ln in launches if ln["params"][0] == want]


def persisted(tmp_path: Path) -> dict:
    found: dict = {}
    for path in (tmp_path / "cache").glob(f"**/{verdicts.SUBDIR}/*{verdicts.EXT}"):
        doc = verdicts.decode(path.name[:-len(verdicts.EXT)], path.read_bytes())
        if doc["key"] == doc["binary"]:
            found[doc["verdict"]] = found.get(doc["verdict"], 0) + 1
    return found


# -- compiled ahead: the helper starts with the compiles -------------------------------------------

def test_compiling_ahead_starts_the_helper_unless_every_candidate_has_a_verdict(tmp_path, fake_driver):
    first, _ = run(tmp_path, fake_driver, AHEAD="1")
    # Started by compile_ahead (its start overlaps the compiles), then the one the call's jobs use.
    assert first["error"] is None and first["helpers_after_ahead"] == 1, first
    assert first["isolation"]["helpers"] == 1 and first["isolation"]["jobs"] == 3, first["isolation"]
    warm, _ = run(tmp_path, fake_driver, log="warm", AHEAD="1")  # every binary proven: no helper at all
    assert warm["error"] is None and warm["helpers_after_ahead"] == 0 and warm["isolation"]["helpers"] == 0, warm


# -- a faulting config ------------------------------------------------------------------------------

def test_a_faulting_config_never_launches_here_and_the_call_goes_on(tmp_path, fake_driver):
    r, launches = run(tmp_path, fake_driver, FAKE_CUDA_FAULT_BLOCK="64")
    assert r["error"] is None and r["next_cuda_work"] is True, r
    iso = r["isolation"]
    assert (iso["jobs"], iso["ok"], iso["faults"], iso["hangs"], iso["unchecked"]) == (3, 2, 1, 0, 0), iso
    # The helper that ran the faulting config ended with its context: another ran the configs after it
    # (none when it was the last compiled: the compile stream's order is the costliest first).
    assert iso["helpers"] in (1, 2), iso
    assert iso["ipc_buffers"] == 6 and iso["staged_buffers"] == 0, iso
    # Config 1 ran once, in a helper, on its copies; never on the caller's buffers.
    assert [ln["block"] for ln in launches if ln["block"] == BLOCK[1]] == [BLOCK[1]]
    assert BLOCK[1] not in {ln["block"] for ln in caller_launches(launches)}
    assert {ln["block"] for ln in caller_launches(launches)} == {BLOCK[0], BLOCK[2]}  # trials, then the winner
    assert persisted(tmp_path) == {"ok": 2, "fault": 1}

    # A second process, another specialization's key: config 1 is neither compiled nor launched,
    # the proven binaries need no helper; the others are timed again, here.
    again, launches = run(tmp_path, fake_driver, n=4096 + 16, log="again", FAKE_CUDA_FAULT_BLOCK="64")
    assert again["error"] is None and again["next_cuda_work"] is True, again
    assert again["isolation"]["helpers"] == 0 and again["isolation"]["jobs"] == 0, again
    assert again["stats"]["compiles"] == 0 and again["stats"]["timed"] == 2, again["stats"]
    assert BLOCK[1] not in {ln["block"] for ln in launches}

    # A warm start: the persisted winner, no helper at all.
    warm, _ = run(tmp_path, fake_driver, log="warm", FAKE_CUDA_FAULT_BLOCK="64")
    assert warm["stats"]["record_hits"] == 1 and warm["isolation"]["helpers"] == 0, warm


def test_a_first_call_resolves_with_the_short_switch_interval_and_gives_it_back(tmp_path, fake_driver):
    """compile.schedule.resolving around Resolution.run: the trials (their grids) see threads switch
    every 0.5 ms, so front ends running beside a call give its steps the GIL back soon; the
    program's interval is back once the call is resolved (its launch, and after)."""
    r, _ = run(tmp_path, fake_driver)
    assert r["error"] is None, r
    during, default = r["switch_intervals"], r["switch_interval_after"]
    assert default == 0.005 and during[0] == 0.0005 and during[-1] == default, (during, default)


def test_the_jax_face_isolates_the_first_execution_alike(tmp_path, fake_driver):
    pytest.importorskip("jax")
    r, launches = run(tmp_path, fake_driver, jax=True, FAKE_CUDA_FAULT_BLOCK="64")
    assert r["error"] is None and r["next_cuda_work"] is True, r
    iso = r["isolation"]
    assert (iso["jobs"], iso["ok"], iso["faults"]) == (3, 2, 1) and iso["ipc_buffers"] == 6, iso
    assert BLOCK[1] not in {ln["block"] for ln in caller_launches(launches)}
    assert persisted(tmp_path) == {"ok": 2, "fault": 1}
    # The standalone face in another process finds the same binaries' verdicts: no helper.
    again, _ = run(tmp_path, fake_driver, log="again", FAKE_CUDA_FAULT_BLOCK="64")
    assert again["error"] is None and again["isolation"]["helpers"] == 0 and again["stats"]["compiles"] == 0, again


def test_every_config_failing_is_one_error_naming_the_kernel_each_config_and_its_reason(tmp_path, fake_driver):
    r, launches = run(tmp_path, fake_driver, FAKE_CUDA_FAULT_BLOCK="32,64,128")
    assert r["next_cuda_work"] is True, r  # the caller's context lives
    err = r["error"]
    assert err.startswith("AllCandidatesFailed: kernel scale: every candidate config"), err
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in err and "isolated first launch" in err and "unaffected" in err, err
    assert r["isolation"]["faults"] == 3 and not caller_launches(launches), r
    assert persisted(tmp_path) == {"fault": 3}
    assert not list((tmp_path / "cache").glob("**/records/*.ltr"))  # no winner

    # A second process: the same error from the verdicts, nothing compiled, nothing launched anywhere.
    again, launches = run(tmp_path, fake_driver, log="again", FAKE_CUDA_FAULT_BLOCK="32,64,128")
    for i in range(3):
        assert f"config {i} (B: {64 << i}" in again["error"], again["error"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in again["error"] and again["next_cuda_work"] is True, again
    assert again["isolation"]["helpers"] == 0 and again["stats"]["compiles"] == 0 and not launches, again


def test_retune_tries_a_failed_config_again_isolated(tmp_path, fake_driver):
    run(tmp_path, fake_driver, FAKE_CUDA_FAULT_BLOCK="64")
    r, launches = run(tmp_path, fake_driver, log="retune", FAKE_CUDA_FAULT_BLOCK="64", LAZYTRITON_RETUNE="1")
    assert r["error"] is None and r["next_cuda_work"] is True, r
    assert (r["isolation"]["jobs"], r["isolation"]["faults"]) == (1, 1), r  # the proven two are not isolated again
    assert BLOCK[1] not in {ln["block"] for ln in caller_launches(launches)}


# -- a hang -----------------------------------------------------------------------------------------

def test_a_hanging_config_is_abandoned_within_the_bound(tmp_path, fake_driver):
    t = time.perf_counter()
    r, launches = run(tmp_path, fake_driver, FAKE_CUDA_HANG_BLOCK="64", LAZYTRITON_ISOLATION_TIMEOUT="1")
    assert r["error"] is None and r["next_cuda_work"] is True, r
    iso = r["isolation"]
    assert (iso["hangs"], iso["ok"], iso["faults"]) == (1, 2, 0), iso
    assert iso["isolated_s"] < 1 + 15, iso  # the bound, and the helpers' starts
    assert time.perf_counter() - t < 120
    assert BLOCK[1] not in {ln["block"] for ln in caller_launches(launches)}
    assert persisted(tmp_path) == {"ok": 2, "hang": 1}


# -- how buffers reach the helper -------------------------------------------------------------------

def test_a_buffer_whose_allocation_cannot_be_exported_goes_as_a_device_copy(tmp_path, fake_driver):
    # The stand-in refuses to export 0x7c... (memory of a stream-ordered pool, say, or XLA's): x is
    # copied into exportable memory of the caller's, which goes by IPC, as out does.
    r, launches = run(tmp_path, fake_driver, x="0x7c0000000000")
    iso = r["isolation"]
    assert r["error"] is None and (iso["copied_buffers"], iso["ipc_buffers"], iso["staged_buffers"]) == (3, 3, 0), iso
    assert len(caller_launches(launches, "0x7c0000000000")) == len(launches) - 3  # the helper's 3 on copies


def test_with_no_room_for_device_copies_a_buffer_is_staged_through_host_memory(tmp_path, fake_driver):
    # 8 KiB free: no room for x's 16 KiB copy (nor for the tuner's snapshot, which goes to host memory).
    r, launches = run(tmp_path, fake_driver, x="0x7c0000000000", FAKE_CUDA_FREE_BYTES=str(8 << 10))
    iso = r["isolation"]
    assert r["error"] is None and (iso["copied_buffers"], iso["ipc_buffers"], iso["staged_buffers"]) == (0, 3, 3), iso
    assert len(caller_launches(launches, "0x7c0000000000")) == len(launches) - 3


def test_no_ipc_at_all_stages_every_buffer(tmp_path, fake_driver):
    r, _ = run(tmp_path, fake_driver, FAKE_CUDA_IPC="0")
    iso = r["isolation"]
    assert r["error"] is None and (iso["staged_buffers"], iso["ipc_buffers"], iso["copied_buffers"]) == (6, 0, 0), r


def test_a_helper_that_cannot_start_leaves_the_candidates_to_the_trials_here(tmp_path, fake_driver):
    r, _ = run(tmp_path, fake_driver, FAKE_CUDA_HELPER_NO_DEVICE="1")
    assert r["error"] is None and r["next_cuda_work"] is True, r
    iso = r["isolation"]
    # One start tried; the other candidates are answered at once (not started again for RETRY_S).
    assert (iso["helpers"], iso["unchecked"], iso["ok"]) == (1, 3, 0), iso
    assert persisted(tmp_path) == {}  # nothing proven, nothing failed: the next process tries again


# -- the setting ------------------------------------------------------------------------------------

def test_isolation_off_launches_here_at_once(tmp_path, fake_driver):
    r, _ = run(tmp_path, fake_driver, LAZYTRITON_ISOLATION="0")
    assert r["error"] is None and r["isolation"]["helpers"] == 0 and r["isolation"]["jobs"] == 0, r
    # ... and a faulting config then faults here, as before: the trial names it, the context is dead.
    bad, _ = run(tmp_path, fake_driver, log="bad", n=8192, LAZYTRITON_ISOLATION="0", FAKE_CUDA_FAULT_BLOCK="64")
    assert "tuning trial" in bad["error"] and "CUDA_ERROR_ILLEGAL_ADDRESS" in bad["error"], bad
    assert bad["next_cuda_work"] is not True, bad


@pytest.mark.parametrize("name, value, says", [
    ("LAZYTRITON_ISOLATION", "sometimes", "1/0"),
    ("LAZYTRITON_ISOLATION_TIMEOUT", "0", "> 0"),
    ("LAZYTRITON_ISOLATION_TIMEOUT", "soon", "seconds"),
])
def test_a_bad_setting_is_one_line_naming_it(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(settings.SettingError, match=name) as e:
        settings.check_environment()
    assert says in str(e.value)


def test_the_settings_defaults(monkeypatch):
    monkeypatch.delenv("LAZYTRITON_ISOLATION", raising=False)
    monkeypatch.delenv("LAZYTRITON_ISOLATION_TIMEOUT", raising=False)
    assert settings.isolation() is True and settings.isolation_timeout() == 10.0
    monkeypatch.setenv("LAZYTRITON_ISOLATION", "off")
    monkeypatch.setenv("LAZYTRITON_ISOLATION_TIMEOUT", "2.5")
    assert settings.isolation() is False and settings.isolation_timeout() == 2.5


# -- the helper's protocol --------------------------------------------------------------------------

def helper(fake: Path, device: int = 0, idle: float = 30.0, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", *flags, isolation.HELPER, _core.__file__, str(device), str(idle),
                             str(idle)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "LD_LIBRARY_PATH": str(fake)})


def frame(stream) -> dict:
    (n,) = struct.unpack("<I", stream.read(4))
    return pickle.loads(stream.read(n))


def test_the_helper_says_it_is_ready_and_leaves_when_its_input_closes(fake_driver):
    p = helper(fake_driver)
    msg = frame(p.stdout)
    assert msg["status"] == "ready" and msg["pid"] == p.pid and msg["at"] <= time.monotonic(), msg
    p.stdin.close()
    assert p.wait(timeout=30) == 0


def test_the_helper_leaves_when_idle(fake_driver):
    p = helper(fake_driver, 0, 0.5)
    assert frame(p.stdout)["status"] == "ready"
    assert p.wait(timeout=30) == 0


def test_a_helper_without_the_device_says_why(fake_driver):
    p = helper(fake_driver, 5)
    msg = frame(p.stdout)
    assert msg["status"] == "unavailable" and "CUDA_ERROR" in msg["reason"], msg
    p.wait(timeout=30)


def test_the_helper_imports_the_core_alone(fake_driver):
    """Not lazytriton's package, not torch, JAX or Triton: a helper starts in a fraction of a second."""
    p = helper(fake_driver, 0, 30.0, "-X", "importtime")
    assert frame(p.stdout)["status"] == "ready"
    maps = Path(f"/proc/{p.pid}/maps").read_text()
    p.stdin.close()
    p.wait(timeout=30)
    assert "/lazytriton/_core." in maps  # loaded from its file, not through the package
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.read().decode().splitlines() if "import time:" in ln}
    assert imported and not {m for m in imported if m.split(".")[0] in ("torch", "jax", "triton", "numpy", "cupy",
                                                                        "lazytriton")}, imported


# -- verdicts, per binary ---------------------------------------------------------------------------

@pytest.fixture(params=["disk", "memory"])
def cache(request, tmp_path):
    return Cache(tmp_path / "c", disk=request.param == "disk")


def test_a_verdict_is_found_by_the_binary_and_by_its_compile_key(cache):
    bid, ckey = verdicts.binary_id(b"\x7fELF cubin"), "ab" * 32
    assert verdicts.lookup(cache, bid) is None and verdicts.lookup(cache, ckey) is None
    verdicts.record(cache, bid, ckey, "k", "config 1 (B: 128)", verdicts.FAULT, "CUDA_ERROR_ILLEGAL_ADDRESS", "H200")
    for key in (bid, ckey):
        doc = verdicts.lookup(cache, key)
        assert doc["verdict"] == "fault" and doc["binary"] == bid and doc["compile_key"] == ckey, doc
        assert verdicts.failed(doc)
    assert "faulted (CUDA_ERROR_ILLEGAL_ADDRESS)" in verdicts.in_words(doc) and "H200" in verdicts.in_words(doc)
    assert verdicts.clear(cache, kernel="other") == 0
    assert verdicts.clear(cache, kernel="k") == 2 and verdicts.lookup(cache, bid) is None


def test_a_proven_binary_is_not_failed(cache):
    bid = verdicts.binary_id(b"image")
    verdicts.record(cache, bid, None, "k", "default config", verdicts.OK)
    assert not verdicts.failed(verdicts.lookup(cache, bid))
    with pytest.raises(ValueError, match="verdict"):
        verdicts.record(cache, bid, None, "k", "default config", "maybe")


def test_a_corrupt_verdict_is_discarded(tmp_path, caplog):
    cache = Cache(tmp_path / "c")
    bid = verdicts.binary_id(b"image")
    verdicts.record(cache, bid, None, "k", "default config", verdicts.HANG)
    path = next((tmp_path / "c").glob(f"**/{verdicts.SUBDIR}/{bid}{verdicts.EXT}"))
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    assert verdicts.lookup(cache, bid) is None and not path.exists()
    assert "invalid verdict" in caplog.text


def test_verdicts_skip_the_fsync_and_one_a_power_cut_left_empty_is_a_miss(tmp_path, monkeypatch, caplog):
    """Documents are published by rename without fsync (entries keep it): a power cut can leave
    one's name with no bytes, which reads as absent and is removed."""
    from lazytriton.cache import files

    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    cache = Cache(tmp_path / "c")
    bid = verdicts.binary_id(b"image")
    verdicts.record(cache, bid, "cd" * 32, "k", "default config", verdicts.OK)
    assert synced == [] and verdicts.lookup(cache, bid)["verdict"] == "ok"
    files.atomic_write(tmp_path / "entry", b"an entry")  # binaries and records: file and directory
    assert len(synced) == 2
    path = next((tmp_path / "c").glob(f"**/{verdicts.SUBDIR}/{bid}{verdicts.EXT}"))
    path.write_bytes(b"")
    with caplog.at_level(logging.INFO, logger="lazytriton.cache"):  # said as a warning once a process
        assert verdicts.lookup(cache, bid) is None and not path.exists()
    assert "invalid verdict" in caplog.text


def test_clearing_the_cache_clears_the_verdicts(tmp_path):
    cache = Cache(tmp_path / "c")
    bid = verdicts.binary_id(b"image")
    verdicts.record(cache, bid, "cd" * 32, "k", "default config", verdicts.FAULT, "CUDA_ERROR_LAUNCH_FAILED")
    cache.clear()
    assert verdicts.lookup(cache, bid) is None and verdicts.lookup(cache, "cd" * 32) is None
