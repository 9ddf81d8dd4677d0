"""On-disk cache: round trips, corruption, crashes, locking, degradation, archives."""

import argparse
import hashlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lazytriton import cache as lc
from lazytriton.cache import Cache, CompiledBinary, TuningRecord
from lazytriton.cli.cache import add_cache_commands
from lazytriton.cache.keys import FORMAT_VERSION

KEY_A = "a" * 64
KEY_B = "b" * 64
KEY_C = "c" * 64


@triton.jit
def add_kernel(X, Y, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(OUT + offs, tl.load(X + offs, mask=mask) + tl.load(Y + offs, mask=mask), mask=mask)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A real sm_90 compile of add_kernel (works without a GPU)."""
    saved = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    try:
        src = ASTSource(add_kernel, {"X": "*fp32", "Y": "*fp32", "OUT": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                        {(4, ): 1024}, {(0, ): [["tt.divisibility", 16]]})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 3.9's FP-fusion default notice
            return triton.compile(src, target=GPUTarget("cuda", 90, 32))
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved


@pytest.fixture
def cache(tmp_path):
    return Cache(tmp_path / "cache", disk=True)


def make_record(kernel_name="add_kernel", device="NVIDIA H100 80GB HBM3", **extra):
    return TuningRecord(
        kernel_name=kernel_name, winner=KEY_B, winner_index=1,
        candidates=[
            {"config": {"BLOCK": 64, "num_warps": 4}, "compile_key": KEY_A, "time_ms": 0.02, "error": None},
            {"config": {"BLOCK": 128, "num_warps": 4}, "compile_key": KEY_B, "time_ms": 0.01, "error": None},
            {"config": {"BLOCK": 4096, "num_warps": 1}, "compile_key": None, "time_ms": None, "error": "OutOfResources"},
        ],
        device_name=device, compute_capability=[9, 0], driver_version=12040, tune_key_values=[1024, "fp32"],
        extra=extra)


def small_binary(name="tiny", payload=b"\x7fELF" + bytes(range(256))):
    return CompiledBinary(name=name, cubin=payload, metadata={"name": name, "num_warps": 4, "shared": 0})


def run_script(tmp_path, body, *args, timeout=30):
    """Run a python snippet in a fresh interpreter (importing the installed lazytriton)."""
    script = tmp_path / f"script_{time.monotonic_ns()}.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# --------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------


def test_compiled_binary_round_trip(cache, compiled, tmp_path):
    binary = CompiledBinary.from_triton(compiled)
    assert binary.name == "add_kernel"
    assert binary.cubin == compiled.kernel and len(binary.cubin) > 1000
    md = binary.metadata
    assert md["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert md["num_warps"] == 4 and md["name"] == "add_kernel"
    for field in ("shared", "num_ctas", "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                  "launch_cooperative_grid", "launch_pdl", "tmem_size", "triton_version"):
        assert field in md, field
    json.dumps(md)  # must be JSON-able as is
    assert "cubin" in binary.asm_names and "ttir" in binary.asm_names
    assert "tt.func" in binary.ttir

    cache.store_binary(KEY_A, binary)
    fresh = Cache(cache.root)  # another process would see the same
    loaded = fresh.load_binary(KEY_A)
    assert loaded == binary
    assert loaded.cubin == compiled.kernel
    assert cache.stats["binary_stores"] == 1
    assert fresh.stats["binary_hits"] == 1
    assert fresh.load_binary(KEY_B) is None
    assert fresh.stats["binary_misses"] == 1
    # Raw cubin bytes are stored as is (no base64 bloat).
    on_disk = cache.entry_path(lc.KIND_BINARY, KEY_A).read_bytes()
    assert compiled.kernel in on_disk
    assert len(on_disk) < len(compiled.kernel) + 64 * 1024


def test_record_round_trip(cache):
    record = make_record(note="hi")
    cache.store_record(KEY_C, record)
    loaded = Cache(cache.root).load_record(KEY_C)
    assert loaded == record
    assert loaded.winner_config == {"BLOCK": 128, "num_warps": 4}
    assert loaded.triton_version == triton.__version__
    assert cache.load_record(KEY_A) is None
    assert cache.stats["record_stores"] == 1 and cache.stats["record_misses"] == 1


def test_overwrite_replaces_entry(cache):
    cache.store_record(KEY_C, make_record(device="A"))
    cache.store_record(KEY_C, make_record(device="B"))
    assert cache.load_record(KEY_C).device_name == "B"


def test_invalid_key_is_rejected(cache):
    for bad in ("../../etc/passwd", "ABC", "", "a" * 7):
        with pytest.raises(ValueError):
            cache.load_record(bad)


# --------------------------------------------------------------------------
# Bad entries: warning, None, file removed
# --------------------------------------------------------------------------


def _corrupt_and_load(cache, caplog, mutate):
    cache.store_binary(KEY_A, small_binary())
    path = cache.entry_path(lc.KIND_BINARY, KEY_A)
    path.write_bytes(mutate(path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="lazytriton.cache"):
        assert cache.load_binary(KEY_A) is None
    warnings_ = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings_) == 1 and str(path) in warnings_[0].getMessage()
    assert not path.exists()
    assert cache.stats["discarded"] == 1
    # The caller rebuilds and stores again: that works.
    cache.store_binary(KEY_A, small_binary())
    assert cache.load_binary(KEY_A) == small_binary()


def _flip(offset):
    def mutate(data):
        data = bytearray(data)
        data[offset] ^= 0xFF
        return bytes(data)
    return mutate


def _reversion(version):
    def mutate(data):
        # A well-formed entry of another format version (valid checksum).
        magic, _, kind, length, digest = lc.entries._HEADER.unpack_from(data)
        return lc.entries._HEADER.pack(magic, version, kind, length, digest) + data[lc.entries._HEADER.size:]
    return mutate


@pytest.mark.parametrize("mutate", [
    _flip(-1),  # last cubin byte
    _flip(lc.entries._HEADER.size + 8),  # JSON header
    _flip(10),  # inside the stored checksum
    _flip(0),  # magic
    lambda d: d[:len(d) // 2],  # truncated payload
    lambda d: d[:20],  # truncated header
    lambda d: b"",  # empty file
    lambda d: d + b"junk",  # trailing garbage
    _reversion(FORMAT_VERSION + 1),  # foreign (newer) version
    _reversion(0),
], ids=["flip-cubin", "flip-json", "flip-checksum", "flip-magic", "truncate-half", "truncate-header", "empty",
        "trailing", "newer-version", "older-version"])
def test_bad_binary_entry_is_discarded(cache, caplog, mutate):
    _corrupt_and_load(cache, caplog, mutate)


def test_bad_record_entry_is_discarded(cache, caplog):
    cache.store_record(KEY_C, make_record())
    path = cache.entry_path(lc.KIND_RECORD, KEY_C)
    path.write_bytes(_flip(-3)(path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="lazytriton.cache"):
        assert cache.load_record(KEY_C) is None
    assert str(path) in caplog.text and not path.exists()


def test_entry_under_wrong_key_is_discarded(cache, caplog):
    # A valid file copied/renamed to another key must not be served for it.
    cache.store_record(KEY_A, make_record())
    src = cache.entry_path(lc.KIND_RECORD, KEY_A)
    dst = cache.entry_path(lc.KIND_RECORD, KEY_B)
    dst.write_bytes(src.read_bytes())
    with caplog.at_level(logging.WARNING, logger="lazytriton.cache"):
        assert cache.load_record(KEY_B) is None
    assert not dst.exists() and cache.load_record(KEY_A) is not None


def test_binary_file_is_not_a_record(cache):
    cache.store_binary(KEY_A, small_binary())
    rec_path = cache.entry_path(lc.KIND_RECORD, KEY_A)
    rec_path.write_bytes(cache.entry_path(lc.KIND_BINARY, KEY_A).read_bytes())
    assert cache.load_record(KEY_A) is None


# --------------------------------------------------------------------------
# Atomic writes under a killed writer
# --------------------------------------------------------------------------

KILLED_WRITER = """
import os, signal, sys
from lazytriton import cache as lc
root, key = sys.argv[1:]
c = lc.Cache(root, disk=True)

def die_mid_write(tmp_path, written):
    if written >= 2 * lc.files._WRITE_CHUNK:  # a few MiB in, far from the end
        os.kill(os.getpid(), signal.SIGKILL)

lc.files._chunk_hook = die_mid_write
c.store_binary(key, lc.CompiledBinary(name="big", cubin=os.urandom(8 << 20), metadata={"name": "big"}))
print("not killed")
"""


def _kill_writer(tmp_path, root, key):
    proc = run_script(tmp_path, KILLED_WRITER, root, key)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (out, err)


def test_killed_writer_leaves_no_entry(tmp_path):
    root = tmp_path / "cache"
    _kill_writer(tmp_path, root, KEY_A)
    cache = Cache(root, disk=True)
    final = cache.entry_path(lc.KIND_BINARY, KEY_A)
    assert not final.exists()
    temps = [p for p in final.parent.iterdir() if p.name.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].stat().st_size >= 2 * lc.files._WRITE_CHUNK  # died mid-write
    assert cache.load_binary(KEY_A) is None
    assert [e.key for e in cache.entries()] == []  # temp files are not entries

    cache.store_binary(KEY_A, small_binary())
    assert cache.load_binary(KEY_A) == small_binary()

    # A killed overwrite leaves the previous good entry in place.
    _kill_writer(tmp_path, root, KEY_A)
    assert Cache(root).load_binary(KEY_A) == small_binary()

    # Temp files are removed once stale (older than an hour), not before.
    assert cache.clean_temp() == 0
    old = time.time() - 2 * lc.STALE_TEMP_AGE_S
    for p in final.parent.iterdir():
        if p.name.endswith(".tmp"):
            os.utime(p, (old, old))
    assert cache.clean_temp() == 2
    assert not [p for p in final.parent.iterdir() if p.name.endswith(".tmp")]
    assert cache.load_binary(KEY_A) == small_binary()


def test_first_store_cleans_stale_temps(tmp_path):
    cache = Cache(tmp_path / "cache", disk=True)
    cache._ensure_dirs()
    stale = cache.dir / "records" / f".{KEY_A}.ltr.123.deadbeef.tmp"
    stale.write_bytes(b"partial")
    old = time.time() - 2 * lc.STALE_TEMP_AGE_S
    os.utime(stale, (old, old))
    Cache(cache.root).store_record(KEY_B, make_record())
    assert not stale.exists()


# --------------------------------------------------------------------------
# Locking
# --------------------------------------------------------------------------

LOCK_WORKER = """
import json, sys, time
from pathlib import Path
from lazytriton.cache import Cache, TuningRecord
root, key, outdir, who = sys.argv[1:]
out = Path(outdir)
c = Cache(root, disk=True)
(out / f"ready.{who}").touch()
while len(list(out.glob("ready.*"))) < 2:  # start together so they contend
    time.sleep(0.005)
t0 = time.monotonic()
with c.lock(key):
    waited = time.monotonic() - t0
    rec = c.load_record(key)
    tuned = rec is None
    if tuned:
        time.sleep(1.0)  # "tuning"
        c.store_record(key, TuningRecord(kernel_name="k", winner=key, winner_index=0,
                                         candidates=[{"config": {"BLOCK": 64}, "compile_key": key,
                                                      "time_ms": 1.0, "error": None}],
                                         device_name="dev", extra={"tuner": who}))
        rec = c.load_record(key)
(out / f"result.{who}.json").write_text(json.dumps({"tuned": tuned, "waited": waited, "tuner": rec.extra["tuner"]}))
"""


def test_two_processes_tune_once(tmp_path):
    root, outdir = tmp_path / "cache", tmp_path / "out"
    outdir.mkdir()
    procs = [run_script(tmp_path, LOCK_WORKER, root, KEY_C, outdir, who) for who in ("p1", "p2")]
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    results = [json.loads((outdir / f"result.{who}.json").read_text()) for who in ("p1", "p2")]
    assert sorted(r["tuned"] for r in results) == [False, True]
    assert results[0]["tuner"] == results[1]["tuner"]  # both end with the same record
    loser = next(r for r in results if not r["tuned"])
    assert loser["waited"] > 0.5  # it really waited for the tuner
    assert Cache(root).load_record(KEY_C).extra["tuner"] == results[0]["tuner"]


@pytest.mark.parametrize("shared_instance", [True, False])
def test_threads_exclude_each_other(tmp_path, shared_instance):
    root = tmp_path / "cache"
    caches = [Cache(root, disk=True)] * 4 if shared_instance else [Cache(root, disk=True) for _ in range(4)]
    inside, peak, tuned = [0], [0], []
    guard = threading.Lock()

    def worker(i):
        c = caches[i]
        with c.lock(KEY_A):
            with guard:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            if c.load_record(KEY_A) is None:
                time.sleep(0.1)
                c.store_record(KEY_A, make_record(device=f"t{i}"))
                tuned.append(i)
            with guard:
                inside[0] -= 1

    threads = [threading.Thread(target=worker, args=(i, )) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 1 and len(tuned) == 1


def test_lock_is_reentrant_and_flock_excludes_separate_opens(cache):
    import fcntl
    with cache.lock(KEY_A):
        with Cache(cache.root).lock(KEY_A):  # same thread, nested: no deadlock
            pass
        # Still held: a separate open file description cannot take it.
        fd = os.open(cache._lock_path(KEY_A), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(cache._lock_path(KEY_A), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released after the block
    finally:
        os.close(fd)


def test_clear_removes_the_lock_files_no_process_holds(cache, tmp_path):
    for key, name in ((KEY_A, "add_kernel"), (KEY_B, "other_kernel"), (KEY_C, "third_kernel")):
        with cache.lock(key):  # as a resolution does: the lock file stays after it
            cache.store_record(key, make_record(kernel_name=name))
    locks = lambda: sorted(p.name[:8] for p in (cache.dir / "locks").iterdir())  # noqa: E731
    assert locks() == [KEY_A[:8], KEY_B[:8], KEY_C[:8]]
    assert cache.clear("other_kernel") == 1 and locks() == [KEY_A[:8], KEY_C[:8]]
    holder = run_script(tmp_path, HOLD_LOCK, cache._lock_path(KEY_C))  # another process still tuning KEY_C
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cache.clear() == 2 and locks() == [KEY_C[:8]]  # its lock stays while held
    finally:
        holder.kill()
        holder.communicate()
    assert cache.clear() == 0 and locks() == []


# --------------------------------------------------------------------------
# Unwritable directory / disabled cache
# --------------------------------------------------------------------------


def test_unwritable_dir_degrades_to_memory_with_one_warning(tmp_path, caplog, compiled):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    cache = Cache(afile / "cache", disk=True)
    binary = CompiledBinary.from_triton(compiled)
    with caplog.at_level(logging.WARNING, logger="lazytriton.cache"):
        cache.store_binary(KEY_A, binary)
        record = make_record()
        cache.store_record(KEY_B, record)
        with cache.lock(KEY_B):
            assert cache.load_record(KEY_B) == record
        cache.store_record(KEY_C, make_record())
        assert cache.load_binary(KEY_A) == binary
    warns = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warns) == 1 and "memory" in warns[0].getMessage()
    assert not cache.on_disk
    assert {e.key for e in cache.entries()} == {KEY_A, KEY_B, KEY_C}
    assert all(e.path is None for e in cache.entries())
    assert cache.clear("add_kernel") == 3  # binary name and record kernel_name both match


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_dir_degrades(tmp_path, caplog):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        cache = Cache(ro / "cache", disk=True)
        with caplog.at_level(logging.WARNING, logger="lazytriton.cache"):
            cache.store_record(KEY_A, make_record())
            cache.store_record(KEY_B, make_record())
        assert cache.load_record(KEY_A) is not None
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    finally:
        ro.chmod(0o755)


def test_cache_disabled_by_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRITON_CACHE", "0")
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "cache"))
    cache = Cache()
    assert cache.root == tmp_path / "cache" and not cache.on_disk
    cache.store_record(KEY_A, make_record())
    with cache.lock(KEY_A):
        assert cache.load_record(KEY_A) is not None
    assert not (tmp_path / "cache").exists()


# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------


def test_settings_from_env(tmp_path, monkeypatch):
    for var in ("LAZYTRITON_CACHE_DIR", "LAZYTRITON_CACHE", "LAZYTRITON_RETUNE", "LAZYTRITON_TUNING"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = lc.settings()
    assert s == lc.Settings(cache_dir=tmp_path / "xdg" / "lazytriton", disk_cache=True, retune=False, tuning=True)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert lc.settings().cache_dir == Path.home() / ".cache" / "lazytriton"

    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("LAZYTRITON_RETUNE", "1")
    monkeypatch.setenv("LAZYTRITON_TUNING", "off")
    monkeypatch.setenv("LAZYTRITON_CACHE", "0")
    s = lc.settings()  # read at call time
    assert (s.cache_dir, s.retune, s.tuning, s.disk_cache) == (tmp_path / "mine", True, False, False)
    with pytest.raises(Exception):
        s.retune = False  # frozen


def test_get_cache_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "one"))
    monkeypatch.delenv("LAZYTRITON_CACHE", raising=False)
    first = lc.get_cache()
    assert lc.get_cache() is first and first.root == tmp_path / "one"
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "two"))
    assert lc.get_cache().root == tmp_path / "two"


def test_a_kernel_wrapped_without_a_cache_uses_the_process_cache(tmp_path, monkeypatch):
    # One process-wide default: what lazytriton.cache.get_cache() reports (the remote tier's
    # counters, entries) is what a kernel wrapped without cache= reads and writes (once there
    # were two, and a GPU test read a remote tier no kernel had used).
    import lazytriton
    from lazytriton import demo_kernels

    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "one"))
    k = lazytriton.kernel(demo_kernels.demo_matmul)
    assert k.cache is lc.get_cache()
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "two"))
    assert k.cache is lc.get_cache() and k.cache.root == tmp_path / "two"


# --------------------------------------------------------------------------
# Management: entries / show / clear
# --------------------------------------------------------------------------


def _populate(cache, compiled):
    cache.store_binary(KEY_A, CompiledBinary.from_triton(compiled))
    cache.store_binary(KEY_B, small_binary("other_kernel"))
    cache.store_record(KEY_C, make_record())


def test_entries_show_clear(cache, compiled):
    _populate(cache, compiled)
    entries = {e.key: e for e in cache.entries()}
    assert set(entries) == {KEY_A, KEY_B, KEY_C}
    assert entries[KEY_A].kind == "binary" and entries[KEY_A].kernel_name == "add_kernel"
    assert entries[KEY_C].kind == "record" and entries[KEY_C].device_name == "NVIDIA H100 80GB HBM3"
    assert entries[KEY_C].winner_config == {"BLOCK": 128, "num_warps": 4}
    assert entries[KEY_A].size == cache.entry_path(lc.KIND_BINARY, KEY_A).stat().st_size

    shown = cache.show("aaaa")
    assert shown["valid"] and shown["binary"]["cubin_sha256"] == hashlib.sha256(compiled.kernel).hexdigest()
    assert shown["binary"]["metadata"]["num_warps"] == 4
    assert cache.show(KEY_C[:10])["record"]["winner_index"] == 1
    with pytest.raises(KeyError):
        cache.show("dddd")

    assert cache.clear("add_kernel") == 2  # its binary and its record
    assert [e.key for e in cache.entries()] == [KEY_B]
    assert cache.clear() == 1 and cache.entries() == []


def test_show_reports_invalid_entry(cache):
    cache.store_record(KEY_C, make_record())
    path = cache.entry_path(lc.KIND_RECORD, KEY_C)
    path.write_bytes(_flip(-2)(path.read_bytes()))
    shown = cache.show("ccc")
    assert shown["valid"] is False and "checksum" in shown["error"]


def test_ambiguous_prefix(cache):
    cache.store_record(KEY_A, make_record())
    cache.store_binary(KEY_A, small_binary())
    with pytest.raises(ValueError):
        cache.show("a")


# --------------------------------------------------------------------------
# Export / import
# --------------------------------------------------------------------------


def test_export_import_round_trip(cache, compiled, tmp_path):
    _populate(cache, compiled)
    archive = tmp_path / "archive.tar.gz"
    assert cache.export(archive) == 3
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["triton_version"] == triton.__version__
    assert {e["key"] for e in manifest["entries"]} == {KEY_A, KEY_B, KEY_C}

    fresh = Cache(tmp_path / "fresh", disk=True)
    assert fresh.import_(archive) == 3
    assert fresh.load_binary(KEY_A).cubin == compiled.kernel
    assert fresh.load_record(KEY_C) == cache.load_record(KEY_C)

    only = tmp_path / "only.tar.gz"
    assert cache.export(only, kernel="other_kernel") == 1


def _rewrite_archive(src, dst, edit_member=None, edit_manifest=None, add=None):
    with tarfile.open(src) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(dst, "w:gz") as tar:
        for name, data in members + (add or []):
            if name == "manifest.json" and edit_manifest:
                data = json.dumps(edit_manifest(json.loads(data))).encode()
            elif edit_member and name != "manifest.json":
                data = edit_member(name, data)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _flip_record(name, data):
    return _flip(-5)(data) if name.startswith("records/") else data


@pytest.mark.parametrize("tamper, match", [
    (dict(edit_member=_flip_record), "checksum mismatch"),
    (dict(edit_manifest=lambda m: {**m, "format_version": FORMAT_VERSION + 1}), "format version"),
    (dict(add=[("binaries/../../evil", b"x")]), "not in the manifest"),
    (dict(edit_manifest=lambda m: {**m, "entries": [{**e, "member": "../x"} for e in m["entries"]]}),
     "does not match"),
])
def test_import_rejects_tampered_archive(cache, compiled, tmp_path, tamper, match):
    _populate(cache, compiled)
    good, bad = tmp_path / "good.tar.gz", tmp_path / "bad.tar.gz"
    cache.export(good)
    _rewrite_archive(good, bad, **tamper)
    fresh = Cache(tmp_path / "fresh", disk=True)
    with pytest.raises(ValueError, match=match):
        fresh.import_(bad)
    assert fresh.entries() == []  # all or nothing


def test_import_rejects_forged_entry_with_matching_manifest(cache, tmp_path):
    # The manifest checksum was updated to match the tampered member: the
    # entry's own header checksum still catches it.
    cache.store_record(KEY_C, make_record())
    good, forged, bad = tmp_path / "good.tar.gz", tmp_path / "forged.tar.gz", tmp_path / "bad.tar.gz"
    cache.export(good)
    forged_bytes = {}

    def edit_member(name, data):
        forged_bytes[name] = _flip(-5)(data)
        return forged_bytes[name]

    _rewrite_archive(good, forged, edit_member=edit_member)
    sums = {n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in forged_bytes.items()}
    _rewrite_archive(forged, bad, edit_manifest=lambda m: {
        **m, "entries": [{**e, "size": sums[e["member"]][0], "sha256": sums[e["member"]][1]} for e in m["entries"]]})
    with pytest.raises(ValueError, match="invalid entry"):
        Cache(tmp_path / "fresh", disk=True).import_(bad)


def test_import_rejects_non_archive(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(ValueError):
        Cache(tmp_path / "c", disk=True).import_(junk)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="lazytriton")
    add_cache_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_cli(cache, compiled, tmp_path, capsys):
    _populate(cache, compiled)
    root = str(cache.root)
    assert _cli("cache", "--cache-dir", root, "list") == 0
    out = capsys.readouterr().out
    assert "add_kernel" in out and "other_kernel" in out and "BLOCK=128" in out and "3 entries" in out

    assert _cli("cache", "--cache-dir", root, "list", "--json") == 0
    assert {e["key"] for e in json.loads(capsys.readouterr().out)} == {KEY_A, KEY_B, KEY_C}

    assert _cli("cache", "--cache-dir", root, "show", KEY_C[:8]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100" in out and "OutOfResources" in out
    assert _cli("cache", "--cache-dir", root, "show", KEY_A[:8], "--json") == 0
    assert json.loads(capsys.readouterr().out)["binary"]["name"] == "add_kernel"
    assert _cli("cache", "--cache-dir", root, "show", "dddd") == 1
    assert "no cache entry" in capsys.readouterr().err

    archive = str(tmp_path / "b.tar.gz")
    assert _cli("cache", "--cache-dir", root, "export", archive) == 0
    assert "exported 3 entries" in capsys.readouterr().out
    assert _cli("cache", "--cache-dir", root, "clear", "--kernel", "other_kernel") == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert _cli("cache", "--cache-dir", root, "clear") == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert _cli("cache", "--cache-dir", root, "import", archive) == 0
    assert "imported 3 entries" in capsys.readouterr().out
    junk = tmp_path / "junk"
    junk.write_bytes(b"x")
    assert _cli("cache", "--cache-dir", root, "import", str(junk)) == 1
    assert "error" in capsys.readouterr().err
    # Into a directory that cannot be made: nothing kept in this process's memory and called imported
    # (a file there is refused as an argument: tests/test_newcomer.py).
    assert _cli("cache", "--cache-dir", "/proc/lazytriton-test-cache", "import", archive) == 1
    out, err = capsys.readouterr()
    assert "imported" not in out and err.startswith("error: cannot write into the cache directory ") and \
        "0 of 3 entries imported" in err, (out, err)


# --------------------------------------------------------------------------
# Pre-tuning for a fleet: `lazytriton pretune -- PROGRAM`
# --------------------------------------------------------------------------

PROGRAM = """
import sys
from lazytriton.cache import Cache, CompiledBinary, TuningRecord
c = Cache()  # the cache of the settings pretune passes down
bin_ = lambda name: CompiledBinary(name=name, cubin=name.encode() * 64, metadata={"name": name})
rec = lambda w: TuningRecord(kernel_name="k", winner=w, winner_index=0, device_name="dev",
                             candidates=[{"config": {}, "compile_key": w, "time_ms": 1.0, "error": None}])
# Tunes one specialization: two candidates compiled, "b" wins.
c.store_binary("b" * 64, bin_("winner"))
c.store_binary("e" * 64, bin_("loser"))
c.store_record("1" * 64, rec("b" * 64))
# Finds another one tuned by an earlier run.
assert c.load_record("2" * 64) is not None
assert c.load_record("7" * 64) is None  # a miss is not used
sys.exit(int(sys.argv[1]))
"""


def _pretune(tmp_path, *argv):
    return subprocess.run([sys.executable, "-m", "lazytriton", "pretune", *map(str, argv)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_pretune_archives_exactly_the_records_used_and_their_winners(tmp_path):
    root = tmp_path / "cache"
    earlier = Cache(root, disk=True)
    earlier.store_binary("c" * 64, small_binary("earlier_winner"))
    earlier.store_record("2" * 64, TuningRecord(
        kernel_name="earlier", winner="c" * 64, winner_index=0, device_name="dev",
        candidates=[{"config": {}, "compile_key": "c" * 64, "time_ms": 1.0, "error": None}]))
    earlier.store_record("3" * 64, make_record(kernel_name="unrelated"))  # not used by the program
    earlier.store_binary("d" * 64, small_binary("unrelated"))
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    archive = tmp_path / "kernels.tar.gz"

    done = _pretune(tmp_path, "-o", archive, "--cache-dir", root, "--", sys.executable, program, 0)
    assert done.returncode == 0, done.stderr
    assert "used 2 tuned kernel specialization(s); wrote 4 entries" in done.stdout
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    got = {(e["kind"], e["key"]) for e in manifest["entries"]}
    assert got == {("record", "1" * 64), ("binary", "b" * 64), ("record", "2" * 64), ("binary", "c" * 64)}

    node = Cache(tmp_path / "node", disk=True)  # another node of the fleet
    assert node.import_(archive) == 4
    assert node.load_record("1" * 64).winner == "b" * 64 and node.load_binary("b" * 64).name == "winner"
    assert node.load_binary("e" * 64) is None and node.load_record("3" * 64) is None


def test_pretune_fails_with_the_program(tmp_path):
    archive = tmp_path / "kernels.tar.gz"
    done = _pretune(tmp_path, "-o", archive, "--cache-dir", tmp_path / "c", "--", sys.executable, "-c",
                    "import sys; sys.exit(3)")
    assert done.returncode == 3 and "exited with status 3; no archive written" in done.stderr
    assert not archive.exists()
    done = _pretune(tmp_path, "-o", archive, "--", sys.executable, "-c", "pass")
    assert done.returncode == 1 and "resolved no tuned kernel" in done.stderr
    assert "no archive written" in done.stderr and not archive.exists()  # not an empty archive
    assert _pretune(tmp_path, "-o", archive).returncode == 2


# --------------------------------------------------------------------------
# A cache directory shared by many hosts (network filesystem)
# --------------------------------------------------------------------------

HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


def test_lock_wait_is_bounded(tmp_path, monkeypatch, caplog):
    # Another process holds the flock and never lets go (a hung client): the wait
    # ends at LAZYTRITON_CACHE_LOCK_TIMEOUT and the work goes on without the lock.
    cache = Cache(tmp_path / "cache", disk=True)
    cache._ensure_dirs()
    holder = run_script(tmp_path, HOLD_LOCK, cache._lock_path(KEY_A))
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setenv("LAZYTRITON_CACHE_LOCK_TIMEOUT", "0.5")
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, logger="lazytriton.cache"):
            with cache.lock(KEY_A):
                cache.store_record(KEY_A, make_record())
        # The holder lets go only after 60 s: a wait that was not bounded would end there
        # (and without the warning). The margin is wide because the suite runs under -n 14.
        assert 0.5 <= time.monotonic() - t0 < 30
        assert "gave up waiting" in caplog.text and "LAZYTRITON_CACHE_LOCK_TIMEOUT" in caplog.text
        assert cache.load_record(KEY_A) == make_record()
        # With locks off (a filesystem whose flock hangs), no flock is even tried.
        import fcntl
        tried = []
        real_flock = fcntl.flock
        monkeypatch.setattr(fcntl, "flock", lambda fd, op: (tried.append(op), real_flock(fd, op)))
        with cache.lock(KEY_B):
            pass
        assert tried, "the recording flock is not the one the cache calls"
        tried.clear()
        monkeypatch.setenv("LAZYTRITON_CACHE_LOCKS", "0")
        with cache.lock(KEY_A):
            pass
        assert tried == []
    finally:
        holder.kill()
        holder.communicate()


def test_filesystem_without_flock_is_not_an_error(cache, monkeypatch, caplog):
    # What NFS without a lock manager answers (ENOLCK): one warning, work goes on.
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(lc.files, "_unsupported_warned", False)
    with caplog.at_level(logging.WARNING, logger="lazytriton.cache"):
        for key in (KEY_A, KEY_B):
            with cache.lock(key):
                cache.store_record(key, make_record())
    warns = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warns) == 1 and "not supported" in warns[0].getMessage()
    assert cache.load_record(KEY_B) == make_record()


WRITER = """
import sys
from lazytriton.cache import Cache, TuningRecord
root, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Cache(root, disk=True)
for i in range(n):
    c.store_record("f" * 64, TuningRecord(kernel_name="k", winner="f" * 64, winner_index=0, device_name=who,
                                          candidates=[{"config": {"i": i}, "compile_key": None,
                                                       "time_ms": None, "error": "x" * 4096}]))
"""

READER = """
import json, sys, time
from lazytriton.cache import Cache
root = sys.argv[1]
c = Cache(root, disk=True)
seen, reads = set(), 0
end = time.monotonic() + 20
while len(seen) < 2 and time.monotonic() < end:
    rec = c.load_record("f" * 64)  # never a torn or foreign entry
    if rec is not None:
        reads += 1
        assert rec.kernel_name == "k" and len(rec.candidates[0]["error"]) == 4096
        seen.add(rec.device_name)
print(json.dumps({"seen": sorted(seen), "reads": reads, "discarded": c.stats["discarded"]}))
"""


def test_concurrent_publishers_never_expose_a_partial_entry(tmp_path, monkeypatch):
    # Two "hosts" publish the same key while a third reads, with file locks off
    # (as on a filesystem without them): every read is one whole entry.
    monkeypatch.setenv("LAZYTRITON_CACHE_LOCKS", "0")
    root = tmp_path / "shared"
    Cache(root, disk=True)._ensure_dirs()
    writers = [run_script(tmp_path, WRITER, root, who, 300) for who in ("host1", "host2")]
    reader = run_script(tmp_path, READER, root)
    for p in writers:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    got = json.loads(out)
    assert got["reads"] > 0 and got["discarded"] == 0 and set(got["seen"]) <= {"host1", "host2"}
    assert not [p for p in (root / f"v{FORMAT_VERSION}" / "records").iterdir() if p.name.endswith(".tmp")]


def test_tuning_keys_keep_gpu_models_drivers_and_versions_apart(monkeypatch):
    # What lets hosts share one cache directory (or one pretune archive) safely.
    from lazytriton.cache import keys

    def key(**change):
        parts = dict(fn=add_kernel, signature={"X": "*fp32", "Y": "*fp32", "OUT": "*fp32", "n": "i32"},
                     constexprs={}, attrs={}, configs=[], base_options={}, target=GPUTarget("cuda", 90, 32),
                     device_name="NVIDIA H100 80GB HBM3", tune_key_values=(1024,), driver_version=12080)
        return keys.tuning_key(**{**parts, **change})

    base = key()
    assert key() == base
    assert key(device_name="NVIDIA H200") != base
    assert key(driver_version=12090) != base
    assert key(target=GPUTarget("cuda", 100, 32)) != base
    monkeypatch.setattr(keys, "triton_version", lambda: "0.0.1")
    assert key() != base
