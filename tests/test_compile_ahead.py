"""Compiling a call's candidates ahead of its first execution
(LazyKernel.compile_ahead; the JAX face calls it for every call site when a
program is lowered on a GPU machine): the binaries land in the cache under the
keys the first call looks up, and a first call that comes while they still
compile waits for them instead of compiling them again. Real Triton compiles
for sm_90, no GPU."""
import logging
import threading

import triton
import triton.language as tl

import lazytriton
from lazytriton.compile import compiler, target_for
from lazytriton.runtime import resolve
from lazytriton.model.arrays import DeviceArray

TARGET = target_for(90)
X = DeviceArray(0x7F0000000000, "fp32", 4 * 4096, (4096,))


@triton.autotune(configs=[triton.Config({"B": b}, num_warps=w) for b, w in ((64, 2), (128, 4), (256, 4))],
                 key=["n"])
@triton.jit
def ahead_kernel(x, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) + 5, mask=o < n)


def test_compile_ahead_fills_the_cache_the_first_call_reads(cache_dir):
    k = lazytriton.kernel(ahead_kernel)
    before = resolve.counters()
    assert k.compile_ahead(X, 4096, target=TARGET).result(timeout=300) == 3
    assert resolve.counters()["compiles"] - before["compiles"] == 3
    assert resolve.counters()["tunes"] == before["tunes"] and resolve.counters()["resolves"] == before["resolves"]
    # What a first call of that specialization compiles: nothing (every binary is in the cache).
    again = k.compile_ahead(X, 4096, target=TARGET).result(timeout=300)
    assert again == 3 and resolve.counters()["compiles"] - before["compiles"] == 3


def test_compiles_asked_for_soon_queue_as_a_calls_and_the_others_as_made_ahead(cache_dir):
    """compile_ahead(soon=True) (the JAX face's sites at their lowering; a program whose calls come
    next): its compiles queue as a call's, so that the costliest of the whole program starts
    first and none runs niced; without it, after every call's (compile.schedule.history)."""
    from lazytriton.compile import schedule

    k = lazytriton.kernel(ahead_kernel)
    for n, soon in ((4096, True), (4097, False)):  # two specializations (n % 16)
        start = len(schedule.history())
        assert k.compile_ahead(X, n, target=TARGET, soon=soon).result(timeout=300) == 3
        mine = [h for h in schedule.history()[start:] if h["label"].startswith("ahead_kernel")]
        want = schedule.URGENT if soon else schedule.BACKGROUND
        assert len(mine) == 3 and all(h["priority"] == want and h["ran_as"] == want for h in mine), mine


def test_binaries_compiled_ahead_carry_the_buffers_they_write(cache_dir, monkeypatch):
    """A binary's TTIR is read for the parameters it writes when it is stored (compile_ahead's
    thread), and that travels with it: a first call of it does not read the TTIR again."""
    from lazytriton.cache import Cache, decode_binary
    from lazytriton.runtime import tuner

    k = lazytriton.kernel(ahead_kernel)
    assert k.compile_ahead(X, 4096 + 80, target=TARGET).result(timeout=300) == 3
    cache = Cache(cache_dir)
    stored = [decode_binary(p.name.split(".")[0], p.read_bytes()) for p in cache.dir.glob("binaries/*")]
    assert len(stored) == 3 and all(b.written == ["x"] for b in stored), [b.written for b in stored]

    def unread(*a):
        raise AssertionError("the TTIR was read again")

    monkeypatch.setattr(tuner, "written_pointer_args", unread)
    cand = compiler.Candidate(0, None, None, binary=stored[0])
    assert tuner.written_buffers([cand], ["x", "n"], {"x": (0x7F0000000000, 4096 * 4)}, []) == ["x"]


def test_a_first_call_waits_for_compiles_under_way(cache_dir, caplog, monkeypatch):
    """Two streams over the same compile keys in one process: the second waits
    for the first's compiles (one compile per candidate in all)."""
    k = lazytriton.kernel(ahead_kernel)
    n = 4096 + 16  # a key no other test compiled
    gate = threading.Event()
    real = compiler._front_end

    def slow_front_ends(*a):  # holds the first stream's compiles until the second has joined them
        gate.wait(60)
        return real(*a)

    monkeypatch.setattr(compiler, "_front_end", slow_front_ends)
    before = resolve.counters()["compiles"]
    first = k.compile_ahead(X, n, target=TARGET)
    with caplog.at_level(logging.INFO, logger="lazytriton"):
        while not compiler._inflight:  # the first stream has registered its keys
            threading.Event().wait(0.01)
        monkeypatch.setattr(compiler, "_front_end", real)
        second = k.compile_ahead(X, n, target=TARGET)
        threading.Timer(0.5, gate.set).start()
        assert second.result(timeout=300) == 3 and first.result(timeout=300) == 3
    assert "3 candidate(s) already compiling in this process: waiting for them" in caplog.text
    assert resolve.counters()["compiles"] - before == 3
    assert not compiler._inflight


@triton.jit
def ahead_variant(x, n, C: tl.constexpr, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) + C, mask=o < n)


def test_every_kernel_compiled_ahead_reaches_the_queue_at_once(cache_dir, monkeypatch):
    """compile_ahead for more kernels than any pool of threads would hold (a program of 40 call
    sites): each one's candidates are queued at once, while none has compiled yet, so that the
    compile queue orders all of them. A thread per kernel waits for its compiles; with 32 threads,
    the 33rd kernel's compiles reached the queue only once a whole kernel had compiled."""
    from lazytriton.compile import pool as compile_pool, schedule

    gate = threading.Event()

    def held(*a):  # no front end ends before every kernel's candidates are queued
        gate.wait(60)
        raise compile_pool.CompileFailed("held by the test")

    monkeypatch.setattr(compiler, "_front_end", held)
    k = lazytriton.kernel(ahead_variant)
    start = len(schedule.history())
    futures = [k.compile_ahead(X, 4096, C=c, B=64, target=TARGET, soon=True) for c in range(40)]
    deadline = threading.Event()
    threading.Timer(20, deadline.set).start()
    while not deadline.is_set() and len(schedule.history()[start:]) < 40:
        deadline.wait(0.02)
    queued = len([h for h in schedule.history()[start:] if h["label"].startswith("ahead_variant")])
    gate.set()
    assert queued == 40, queued
    for f in futures:
        assert f.exception(timeout=60) is not None  # every candidate failed: held, then refused


FORKED = r"""
import os, sys
sys.path.insert(0, {tests!r})
from test_compile_ahead import ahead_kernel, X, TARGET
import lazytriton
k = lazytriton.kernel(ahead_kernel)
print("parent", k.compile_ahead(X, 4096 + 32, target=TARGET).result(timeout=120), flush=True)
pid = os.fork()
if pid == 0:  # the child's compile_ahead must not wait for its parent's pool threads
    try:
        print("child", k.compile_ahead(X, 4096 + 48, target=TARGET).result(timeout=60), flush=True)
        os._exit(0)
    except BaseException as exc:
        print("child failed", repr(exc), flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_compiles_ahead(tmp_path):
    """A child forked after compile_ahead ran in its parent gets threads of its own (the parent's
    pool counted idle threads the child does not have: its job waited forever)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "lt"), "TRITON_CACHE_DIR": str(tmp_path / "tr")}
    r = subprocess.run([sys.executable, "-c", FORKED.format(tests=str(Path(__file__).parent))], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parent 3" in r.stdout and "child 3" in r.stdout and "child exit 0" in r.stdout, r.stdout + r.stderr
