"""Candidates compile in worker processes (lazytriton.compile.pool), really in
parallel, with Triton on the CPU (sm_90 needs no GPU): Triton's front end runs
in the caller and the TTIR travels; the workers never import the kernel's
module. A worker that crashes fails its candidate with an error naming the
kernel and the config, and nothing hangs. The one queue (compile.schedule)
decides which front end runs next and which back end starts where."""
import logging
import os
import signal
import time

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from lazytriton.compile import pool as compile_pool
from lazytriton.model.arrays import DeviceArray
from lazytriton.compile.compiler import Binder, Candidate, compile_all, compile_stream
from lazytriton.demo_kernels import DEMO_CONFIGS, demo_matmul
from lazytriton.model.spec import kernel_spec

TARGET = GPUTarget("cuda", 90, 32)
P = DeviceArray(0x7F0000000000, "fp16", 1 << 24)


@triton.jit
def tile_matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # One K block of the demo's matmul, no loop: its TTIR reads back as printed, so its back end
    # runs in a worker (a loop's, whose induction variable's name the printer leaves out, runs here).
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x = tl.load(a + rm[:, None] * sam + rk[None, :] * sak)
    y = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, tl.dot(x, y).to(tl.float16))


def demo_candidates(configs=DEMO_CONFIGS, kernel=tile_matmul):
    spec = kernel_spec(kernel)
    binder = Binder(spec, TARGET)
    args = (P, P, P, 2048, 2048, 2048, 2048, 1, 2048, 1, 2048, 1)
    return spec, [Candidate(i, c, binder.bind(args, c.all_kwargs())) for i, c in enumerate(configs)]


@pytest.fixture
def fresh_triton_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    # The server keeps the environment it started with (an earlier test's cache):
    # restart it, so that its workers fill this test's cache.
    pool = compile_pool.get_pool()
    if pool is not None:
        pool.close()
        assert pool.wait_ready()
        wait_hashed(pool)  # jobs forked before it fill a private Triton cache (server._unhashed)
    return tmp_path


def wait_hashed(pool, timeout: float = 120.0) -> None:
    """Until the running server has Triton's installation hash."""
    deadline = time.perf_counter() + timeout
    while "hashed_at" not in pool.timeline:
        assert time.perf_counter() < deadline, pool.timeline
        time.sleep(0.01)


def test_demo_configs_compile_in_worker_processes(fresh_triton_cache, caplog):
    spec, cands = demo_candidates(DEMO_CONFIGS[:4])
    with caplog.at_level(logging.INFO, logger="lazytriton"):
        compile_all(spec, TARGET, cands)
    assert all(c.binary is not None and c.binary.cubin[:4] == b"\x7fELF" for c in cands), [c.error for c in cands]
    assert "in 2 worker process(es)" in caplog.text or "worker process(es)" in caplog.text
    # Same bytes as compiling in this process (threads), and Triton's cache was filled by the workers.
    _, local = demo_candidates(DEMO_CONFIGS[:1])
    compile_all(spec, TARGET, local, max_workers=1)
    assert local[0].binary.cubin == cands[0].binary.cubin
    assert any(fresh_triton_cache.joinpath("triton").rglob("*.cubin"))
    # Each compile's history has the worker's own seconds: when it started there, not when it
    # was handed to the server, is what a first step's trace needs.
    from lazytriton.compile import schedule

    done = [h for h in schedule.history()[-4:] if "job_s" in h]
    assert len(done) == 4, schedule.history()[-4:]
    assert all(0 < h["job_s"] <= h["job_done"] - h["front_end"] for h in done), done


def test_workers_and_threads_key_tritons_cache_alike(fresh_triton_cache):
    """A back end in a worker and one on a thread here key Triton's cache by the
    same hash (of the TTIR text and Triton's source hash), so either finds what
    the other compiled; the warm-up's stand-in installation hash stays out."""
    spec, cands = demo_candidates(DEMO_CONFIGS[:1])
    compile_all(spec, TARGET, cands)
    assert cands[0].binary is not None and cands[0].extra["compiled_in"] == "worker", cands[0].error
    cache = fresh_triton_cache / "triton"
    before = sorted(p.name for p in cache.iterdir())
    assert before and not any("warm" in p for p in before)  # the warm-up's stand-in key went to a throwaway cache
    _, here = demo_candidates(DEMO_CONFIGS[:1])
    compile_all(spec, TARGET, here, max_workers=0)  # the back end on a thread here
    assert here[0].extra["compiled_in"] == "thread" and here[0].binary.cubin == cands[0].binary.cubin
    assert sorted(p.name for p in cache.iterdir()) == before  # a hit: no new entry


def test_the_server_starts_without_lazytritons_runtime_or_tritons_front_end(tmp_path):
    """A fresh process's first compiles wait for its compile server to start: the server imports
    lazytriton's compile path without the package's __init__ (the runtime and the faces), and warms
    up Triton's later stages on an empty kernel made with Triton's IR builder, never importing the
    code generator its children do not run. Fails with the package imported whole, or with a
    warm-up through an ASTSource (its front end imports the code generator)."""
    import ast
    import subprocess
    import sys

    from lazytriton.compile import server

    # BOOTSTRAP itself, its server loop swapped for the warm-up and a look at what it imported.
    probe = server.BOOTSTRAP.replace("serve(int(sys.argv[1]), r, pid)",
                                     "server._warm_up()\nprint(sorted(sys.modules))")
    probe = probe.replace("from lazytriton.compile.server import serve", "from lazytriton.compile import server")
    assert probe.count("server._warm_up()") == 1 and "import serve\n" not in probe
    p = subprocess.run([sys.executable, "-c", probe, "1"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert p.returncode == 0, p.stderr[-3000:]
    imported = set(ast.literal_eval(p.stdout.strip().splitlines()[-1]))
    assert {"lazytriton.compile.server", "lazytriton.compile.ir_text", "lazytriton.cache"} <= imported
    assert not {m for m in imported if m.startswith(("lazytriton.runtime", "lazytriton.jax"))}, imported
    assert "triton.compiler.code_generator" not in imported


def test_the_servers_installation_hash_comes_from_its_child_or_is_computed_there(monkeypatch, capsys):
    """What the compile server does with the answer of the child that computed
    Triton's installation hash: the hash, for Triton's cache keys from then on;
    an error, said once, and the hash computed in the server instead."""
    from triton.runtime import cache as triton_cache

    from lazytriton.compile import server

    real = triton_cache.triton_key
    monkeypatch.setattr(triton_cache, "triton_key", real)  # put back after the test

    def answer(data: bytes) -> int:
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        return r

    server._take_installation_hash(answer(b"ok 3.6.0-abc-def"), None)
    assert triton_cache.triton_key() == "3.6.0-abc-def"
    monkeypatch.setattr(triton_cache, "triton_key", real)
    server._take_installation_hash(answer(b"error MemoryError()"), None)
    assert "hash failed in its child (MemoryError()): computing it here" in capsys.readouterr().err
    assert triton_cache.triton_key is real and real() == real()


def test_the_server_reports_its_start_up_on_the_callers_clock(fresh_triton_cache):
    pool = compile_pool.get_pool()
    spec, cands = demo_candidates(DEMO_CONFIGS[:1])
    compile_all(spec, TARGET, cands)  # starts the server and waits for a compile
    wait_hashed(pool)
    t = compile_pool.server_timeline()
    assert set(t) == {"started_at", "imports_done_at", "ready_at", "hashed_at"}, t
    # Ready before the hash, which it reads between jobs (a frame of its own).
    assert t["started_at"] < t["imports_done_at"] < t["ready_at"] <= t["hashed_at"] < time.perf_counter()
    assert t["hashed_at"] - t["started_at"] < 60
    assert pool is compile_pool.get_pool()


def test_a_job_before_tritons_installation_hash_compiles_the_same_binary_into_a_private_cache(tmp_path):
    """A compile server is ready before Triton's installation hash (0.5 s on an H200, after Triton's
    0.3 s import, in a child of its own). A job forked before it is keyed by a stand-in: it must
    neither read nor fill the caller's Triton cache (another installation's stand-in entry would
    be a wrong hit), and builds the same binary. A cache manager of the caller's, or use_ir_loc
    (Triton writes the IR file's path in its cache into the binary), is keyed for real (the child
    computes the hash). Run in a process of its own: a worker's state is applied to it. Fails if
    the stand-in reached the caller's cache, or either of those got the private one."""
    import subprocess
    import sys

    script = f"""
import os, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
os.environ["TRITON_CACHE_DIR"] = {str(tmp_path / "triton")!r}
from triton.runtime import cache as triton_cache
from test_compile_pool import TARGET, demo_candidates
from lazytriton.compile import server
from lazytriton.compile.ir_text import front_end

dirs = []
init = triton_cache.FileCacheManager.__init__
def record(self, *a, **k):
    init(self, *a, **k)
    dirs.append(self.cache_dir)
triton_cache.FileCacheManager.__init__ = record
spec, (c,) = demo_candidates()[0], demo_candidates()[1][:1]
def job():
    b = c.bound
    return {{"ir": front_end(spec.fn, TARGET, b.signature, b.constexprs, b.attrs, b.options.__dict__), "target": TARGET}}
mine = os.environ["TRITON_CACHE_DIR"]
early = server._compile(job())  # server._hashed is False: no hash yet
assert dirs and not any(d.startswith(mine) for d in dirs), dirs
assert not os.listdir(mine) if os.path.isdir(mine) else True
assert all(not os.path.exists(d) for d in dirs), dirs  # the private cache went with it
assert os.environ["TRITON_CACHE_DIR"] == mine and triton_cache.FileCacheManager.__init__ is record
os.environ["TRITON_CACHE_MANAGER"] = "triton.runtime.cache:FileCacheManager"  # a manager of the caller's
dirs.clear()
managed = server._compile(job())
assert dirs and all(d.startswith(mine) for d in dirs), dirs
del os.environ["TRITON_CACHE_MANAGER"]
os.environ["USE_IR_LOC"] = "ttgir"  # the IR file's path in Triton's cache goes into the line info
dirs.clear()
located = server._compile(job())
assert dirs and all(d.startswith(mine) for d in dirs), dirs
del os.environ["USE_IR_LOC"]
server._hashed = True
dirs.clear()
late = server._compile(job())
assert dirs and all(d.startswith(mine) for d in dirs), dirs
assert early.cubin == managed.cubin == late.cubin and early.cubin[:4] == b"\x7fELF"
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-4000:]


def test_a_cold_processs_first_call_waits_for_the_starting_server(tmp_path, monkeypatch):
    """A cold process's first call, its compile server still starting: the candidates' front ends
    run here at once, their back ends wait for the server and run in its workers."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    pool = compile_pool.CompilePool(2)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    spec, cands = demo_candidates(DEMO_CONFIGS[:2])
    try:
        assert not pool.ready()
        compile_all(spec, TARGET, cands)
        assert [(c.extra["front_end"], c.extra["compiled_in"]) for c in cands] == [("here", "worker")] * 2
        assert "ready_at" in pool.timeline
    finally:
        pool.close()


def test_a_server_never_ready_is_stopped_and_its_waiting_compiles_run_here(tmp_path, monkeypatch, caplog):
    """A compile server that never becomes ready (stuck at its start) is stopped START_S after it
    started, with its output named, once; the candidates waiting for it compile on threads here, and
    so do later ones, at once: no server is started again in the process. A call never hangs on it."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(compile_pool, "START_S", 1.0)
    monkeypatch.setattr(compile_pool, "BOOTSTRAP", "import sys, time; print('stuck here', file=sys.stderr, "
                                                   "flush=True); time.sleep(600)")
    pool = compile_pool.CompilePool(2)
    monkeypatch.setattr(compile_pool, "_pool", pool)  # the process's pool (get_pool's)
    spec, cands = demo_candidates(DEMO_CONFIGS[:2])
    try:
        with caplog.at_level(logging.WARNING, logger="lazytriton"):
            t0 = time.perf_counter()
            compile_all(spec, TARGET, cands)
            assert time.perf_counter() - t0 >= 1.0
            assert [c.extra["compiled_in"] for c in cands] == ["thread"] * 2 and all(c.binary for c in cands)
            assert compile_pool.get_pool() is None and not pool.starting()
            compile_pool.start()  # a kernel wrapped later starts none
            _, later = demo_candidates(DEMO_CONFIGS[2:4])
            compile_all(spec, TARGET, later)
        assert [c.extra["compiled_in"] for c in later] == ["thread"] * 2 and pool._proc is None
        assert caplog.text.count("not ready 1 s after its start") == 1 and "stuck here" in caplog.text
    finally:
        pool.close()


def test_stream_yields_each_candidate_once(fresh_triton_cache):
    spec, cands = demo_candidates(DEMO_CONFIGS[:3])
    seen = [c.index for c in compile_stream(spec, TARGET, cands)]
    assert sorted(seen) == [0, 1, 2]


def test_kernel_defined_in_a_function_compiles_in_workers(fresh_triton_cache, caplog):
    """No worker imports the kernel: one defined in a function (no module
    path at all) has its back end in the workers too."""
    @triton.autotune(configs=[triton.Config({"B": 64}), triton.Config({"B": 128})], key=["n"])
    @triton.jit
    def local_kernel(x, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)

    spec = kernel_spec(local_kernel)
    binder = Binder(spec, TARGET)
    cands = [Candidate(i, c, binder.bind((P, 4096), c.all_kwargs())) for i, c in enumerate(spec.configs)]
    with caplog.at_level(logging.INFO, logger="lazytriton"):
        compile_all(spec, TARGET, cands)
    assert all(c.binary is not None for c in cands), [c.error for c in cands]
    assert "front end here, back end in 2 worker process(es)" in caplog.text
    assert "in this process" not in caplog.text


HEAVY_MODULE = """
import os, time
with open(os.environ["LT_TEST_IMPORT_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(float(os.environ.get("LT_TEST_IMPORT_SLEEP", "0")))
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"B": b}, num_warps=w) for b in (64, 128) for w in (2, 4)], key=["n"])
@triton.jit
def heavy_kernel(x, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) * 3, mask=o < n)
"""


def test_no_worker_imports_the_kernels_module(fresh_triton_cache, tmp_path, monkeypatch):
    """The kernel's module is imported once, by the caller: compiling its
    candidates costs no import per candidate (before: each forked worker
    imported it, seconds for a module of a real package)."""
    import importlib
    import sys

    pkg = tmp_path / "lt_heavy_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels.py").write_text(HEAVY_MODULE)
    log_file = tmp_path / "imports.log"
    monkeypatch.setenv("LT_TEST_IMPORT_LOG", str(log_file))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("lt_heavy_pkg.kernels")
    try:
        spec = kernel_spec(mod.heavy_kernel)
        binder = Binder(spec, TARGET)
        cands = [Candidate(i, c, binder.bind((P, 4096), c.all_kwargs())) for i, c in enumerate(spec.configs)]
        compile_all(spec, TARGET, cands)
        assert all(c.binary is not None for c in cands), [c.error for c in cands]
        assert log_file.read_text().split() == [str(os.getpid())]  # this process, once; no worker
    finally:
        sys.modules.pop("lt_heavy_pkg.kernels", None)
        sys.modules.pop("lt_heavy_pkg", None)


def test_compile_errors_are_per_candidate(fresh_triton_cache):
    from test_compile import partly_bad_kernel

    spec = kernel_spec(partly_bad_kernel)
    binder = Binder(spec, TARGET)
    cands = [Candidate(i, c, binder.bind((P, 4096), c.all_kwargs())) for i, c in enumerate(spec.configs)]
    compile_all(spec, TARGET, cands)
    assert cands[0].binary is not None
    assert cands[1].error and cands[2].error and cands[1].binary is None


def first_job(spec, bound):
    from lazytriton.compile.ir_text import front_end

    b = bound
    return {"ir": front_end(spec.fn, TARGET, b.signature, b.constexprs, b.attrs, b.options.__dict__),
            "target": TARGET}


def test_a_crashing_worker_fails_its_candidate_only(fresh_triton_cache, monkeypatch):
    """A worker killed mid-compile (as a segfault in the compiler would) names
    the kernel's config in the error; the others compile; nothing hangs."""
    pool = compile_pool.CompilePool(2)
    spec, cands = demo_candidates(DEMO_CONFIGS[:2])
    job = first_job(spec, cands[0].bound)
    fut = pool.submit(dict(job, ir={"text": "not a job"}))  # a job it cannot read: the caller compiles it
    with pytest.raises(compile_pool.WorkerUnavailable):
        fut.result(timeout=120)
    # A real process death: the child for candidate 0 (the first job submitted) is SIGKILLed before compiling.
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    made = []
    submit = pool.submit
    monkeypatch.setattr(pool, "submit", lambda job: made.append(1) or submit(dict(job, crash_for_test=len(made) == 1)))
    compile_all(spec, TARGET, cands)
    assert cands[0].binary is None and "compile worker process killed by SIGKILL" in cands[0].error
    assert cands[1].binary is not None
    pool.close()


def test_dead_server_fails_pending_jobs_and_restarts(fresh_triton_cache):
    pool = compile_pool.CompilePool(1)
    spec, cands = demo_candidates(DEMO_CONFIGS[:1])
    pool.start()
    os.kill(pool._proc.pid, signal.SIGKILL)
    fut = pool.submit(first_job(spec, cands[0].bound))
    # Either it went to the dead server (an error) or to a restarted one (a binary): never a hang.
    try:
        binary, _ = fut.result(timeout=120)
        assert binary.cubin
    except compile_pool.WorkerCrashed as exc:
        assert "compile server" in str(exc)
    binary, _ = pool.submit(first_job(spec, cands[0].bound)).result(timeout=120)
    assert binary.cubin
    pool.close()


def test_many_large_jobs_from_many_threads_do_not_deadlock(fresh_triton_cache):
    """Jobs (TTIR text) and results larger than a pipe's buffer, submitted from
    many threads at once (compile_ahead of a 16-kernel program does this): a
    submit blocked on a full stdin pipe must not keep the results from being
    read, which the server waits for before it reads more jobs."""
    import concurrent.futures as cf

    pool = compile_pool.CompilePool(2)
    try:
        spec, cands = demo_candidates(DEMO_CONFIGS[:1])
        job = first_job(spec, cands[0].bound)
        pad = "\n".join(f"// padding line {i} to make the job larger than a pipe's buffer" for i in range(40000))
        big = dict(job, ir=dict(job["ir"], padding=pad))  # the text itself must read back as printed

        def submit_over_time(i):  # jobs keep arriving while results come back
            time.sleep(0.05 * i)
            return pool.submit(big)

        with cf.ThreadPoolExecutor(8) as threads:
            futs = list(threads.map(submit_over_time, range(40)))
        for f in futs:
            binary, _ = f.result(timeout=300)
            assert binary.cubin[:4] == b"\x7fELF"
    finally:
        pool.close()


class FakePool:
    """A compile server stand-in for the queue's tests: `workers` slots, ready, and
    each job's future completed by the test (`finish`)."""

    def __init__(self, workers: int = 1) -> None:
        import concurrent.futures as cf
        import threading

        self.workers, self.sent, self.lock, self.cf = workers, [], threading.Lock(), cf

    def ready(self) -> bool:
        return True

    def starting(self) -> bool:
        return False

    def start(self) -> None:
        pass

    def submit(self, job):
        fut = self.cf.Future()
        with self.lock:
            self.sent.append((job["name"], job["nice"], fut))
        return fut

    def names(self) -> list:
        with self.lock:
            return [n for n, _, _ in self.sent]

    def finish(self, name) -> None:
        with self.lock:
            fut = next(f for n, _, f in self.sent if n == name)
        fut.set_result((None, 0.0))


def _ticket(name, priority, cost=0.0, order=(), gate=None, ran=None):
    from lazytriton.compile import schedule

    def work():
        if gate is not None:
            gate.wait(30)
        if ran is not None:
            ran.append(name)
        return {"ir": {"local": None}, "target": None, "name": name}

    return schedule.Ticket(work, priority, name, order, cost)


def _until(cond, timeout=30.0):
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.005)
    assert cond()


def test_back_ends_start_by_priority_then_cost_and_a_promoted_one_first(monkeypatch):
    """One worker, busy with a compile made ahead: the ready jobs behind it start
    by priority (a call's before those made ahead), then the costliest first; a
    call's job starts beside the busy worker (those made ahead run niced), and
    a promoted job (a call now waits for it) goes ahead of the others made ahead.
    A call's jobs take at most every worker: a second waits for the first, not for
    the one made ahead."""
    from lazytriton.compile import schedule

    pool = FakePool(1)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    running = _ticket("running", schedule.BACKGROUND)
    schedule.submit(running)
    _until(lambda: pool.names() == ["running"])
    later = [_ticket(n, schedule.BACKGROUND, cost) for n, cost in (("cheap", 1.0), ("dear", 9.0), ("mid", 3.0),
                                                                  ("mid2", 3.0), ("promoted", 0.5))]
    for t in later:
        schedule.submit(t)
    _until(lambda: all(t.state == "ready" for t in later))
    assert pool.names() == ["running"]  # its one slot is taken
    schedule.promote(later[-1])
    _until(lambda: len(pool.names()) == 2)
    assert pool.names()[1] == "promoted"  # beside the busy worker, niced: a call's jobs take every worker
    urgent = _ticket("urgent", schedule.URGENT)
    schedule.submit(urgent)
    _until(lambda: urgent.state == "ready")
    assert len(pool.names()) == 2  # the one worker a call's jobs may take is taken
    pool.finish("running")
    time.sleep(0.05)
    assert len(pool.names()) == 2  # a call's second job waits for its first, not beside it
    pool.finish("promoted")
    _until(lambda: len(pool.names()) == 3)
    assert pool.names()[2] == "urgent" and [nice for _, nice, _ in pool.sent] == [10, 0, 0]
    for name in ("urgent", "dear", "mid", "mid2"):
        pool.finish(name)
        time.sleep(0.02)
    _until(lambda: len(pool.names()) == 7)
    assert pool.names()[3:] == ["dear", "mid", "mid2", "cheap"]
    pool.finish("cheap")
    _until(lambda: all(t.future.done() for t in later + [running, urgent]))


def test_back_ends_made_ahead_start_the_long_poles_first_ties_in_the_order_asked_for(monkeypatch):
    """Kernels compiled ahead (a program's, in the order it calls them), one worker: the costliest
    job of any of them starts first, for the longest compile is what the program's first step
    waits for, wherever it is called; equal guesses start in the order the kernels were asked for.
    With one worker each job left is, in its turn, the pole of what is left."""
    from lazytriton.compile import schedule

    pool = FakePool(1)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    running = _ticket("running", schedule.BACKGROUND)
    schedule.submit(running)
    _until(lambda: pool.names() == ["running"])
    first, second = schedule.next_order(), schedule.next_order()
    later = [_ticket(n, schedule.BACKGROUND, cost, order) for n, cost, order in (
        ("matmul 1", 9.0, (second, 0)), ("matmul 2", 8.0, (second, 1)), ("add 1", 1.0, (first, 0)),
        ("add 2", 2.0, (first, 1)), ("gelu 1", 9.0, (first, 2)))]
    for t in later:
        schedule.submit(t)
    _until(lambda: all(t.state == "ready" for t in later))
    want = ["running", "gelu 1", "matmul 1", "matmul 2", "add 2", "add 1"]
    for name in want[:-1]:
        pool.finish(name)
        time.sleep(0.02)
    _until(lambda: len(pool.names()) == 6)
    assert pool.names() == want
    pool.finish("add 1")
    _until(lambda: all(t.future.done() for t in later + [running]))


def test_while_calls_resolve_threads_switch_sooner_and_the_programs_interval_comes_back():
    """schedule.resolving (Resolution.run): the front ends keep running beside a call, which gets
    the GIL back every 0.5 ms instead of 5; the interval the program had comes back when the last
    call ends, unless the program set one of its own meanwhile."""
    import sys

    from lazytriton.compile import schedule

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        with schedule.resolving():
            assert sys.getswitchinterval() == 0.0005
            with schedule.resolving():  # a second call (another thread's, say): the first still resolves after it
                pass
            assert sys.getswitchinterval() == 0.0005
        assert sys.getswitchinterval() == 0.004
        with schedule.resolving():
            sys.setswitchinterval(0.002)  # the program's own, set meanwhile: kept
        assert sys.getswitchinterval() == 0.002
    finally:
        sys.setswitchinterval(before)


class StartingPool(FakePool):
    """A server still starting until `up()`."""

    def __init__(self, workers: int = 1) -> None:
        super().__init__(workers)
        self.is_ready, self.dead, self.waiting = False, False, []

    def ready(self) -> bool:
        return self.is_ready

    def starting(self) -> bool:
        return not self.is_ready and not self.dead

    def when_ready(self, fn) -> None:
        if self.is_ready:
            fn()
        else:
            self.waiting.append(fn)

    def up(self) -> None:
        self.is_ready = True
        for fn in self.waiting:
            fn()

    def die(self) -> None:
        """Neither ready nor starting; its reader lets what waits for it go."""
        self.dead = True
        for fn in self.waiting:
            fn()


def test_while_the_server_starts_every_job_waits_for_it_and_runs_here_if_it_dies(monkeypatch):
    """A fresh process's first call, its server still starting: none of its back ends runs on a
    thread here, however few its configs (there they share the GIL: an H200's 8-config matmul's
    first call took 1.22 s with two on threads, 0.91 s with all 8 waiting for the workers), nor do
    those made ahead; once it is ready they go to its workers, a call's first,
    costliest first. A server that dies while starting (or is stopped: compile.pool.START_S) sends
    what waits for it to threads here. Fails if any back end runs here while it starts."""
    from lazytriton.compile import schedule

    pool = StartingPool(8)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    here = []
    monkeypatch.setattr(schedule, "_back_end_here", lambda ticket, job: here.append(job["name"]))
    tickets = [_ticket(n, p, cost) for n, p, cost in (("ahead", schedule.BACKGROUND, 9.0), ("one", schedule.URGENT, 1.0),
                                                       ("two", schedule.URGENT, 2.0))]
    for t in tickets:
        schedule.submit(t)
    _until(lambda: all(t.state == "ready" for t in tickets))
    time.sleep(0.05)
    assert here == [] and pool.names() == []
    pool.up()
    _until(lambda: len(pool.names()) == 3)
    assert pool.names() == ["two", "one", "ahead"]
    for n in pool.names():
        pool.finish(n)
    _until(lambda: all(t.future.done() for t in tickets))
    pool.is_ready, pool.waiting = False, []  # a server starting again, which then dies
    alone = _ticket("alone", schedule.URGENT)
    schedule.submit(alone)
    _until(lambda: alone.state == "ready" and pool.waiting)
    time.sleep(0.05)
    assert here == []
    pool.die()
    assert here == ["alone"] and pool.names() == ["two", "one", "ahead"]
    schedule._finish(alone, None, (None, 0.0, "thread"))  # the stand-in ran no back end


def test_compile_cost_ranks_the_slowest_compiles_first():
    """compile_cost on configs whose compile times were measured (one H200, Triton 3.6,
    the field benchmark's four matmuls, each kernel's 8 configs alone on 16 cores): the
    three slowest of each rank first (the guess it replaced, every block size times the
    stages over the warps, ranked mm_gelu's 64x256 tile on 4 warps, 1.50 s, with its
    64x128 ones, 0.79 s); any matmul config ranks above an elementwise one."""
    from lazytriton.compile import schedule

    configs = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4),
               (64, 64, 32, 4, 5), (128, 128, 32, 8, 4), (256, 128, 64, 8, 3), (64, 256, 32, 4, 4)]  # BM BN BK w s
    measured = {"mm_plain": [0.30, 0.44, 0.35, 0.30, 0.18, 0.20, 0.37, 0.37],
                "mm_relu": [0.32, 0.43, 0.34, 0.26, 0.24, 0.24, 0.48, 0.39],
                "mm_gelu": [0.64, 1.38, 0.79, 0.58, 0.54, 0.58, 1.55, 1.50],
                "mm_silu": [0.36, 0.65, 0.51, 0.46, 0.30, 0.39, 0.78, 0.83]}
    cost = [schedule.compile_cost({"BM": bm, "BN": bn, "BK": bk, "EVEN_K": True, "one": 1}, w)
            for bm, bn, bk, w, _ in configs]
    for name, secs in measured.items():
        slowest = sorted(range(8), key=lambda i: -secs[i])[:3]
        assert min(cost[i] for i in slowest) > max(cost[i] for i in range(8) if i not in slowest), (name, cost)
    elementwise = max(schedule.compile_cost({"BLOCK": b}, w) for b, w in ((1024, 4), (4096, 8), (4096, 16)))
    assert min(cost) > elementwise
    assert schedule.compile_cost({"N": 1 << 30}, 4) == schedule.compile_cost({"N": 4096}, 4)


def test_with_their_code_size_the_gelu_matmuls_slowest_tiles_rank_above_every_other_matmuls():
    """The same tiles compile for 0.4 s with no epilogue and 1.5 s with a GELU one (measured as
    above): KernelSpec.code_size (the kernel's operations, its @jit helpers' through the closure
    cell that holds them, tl.erf as the routine it unrolls into) ranks mm_gelu's three slowest
    configs above every config of the field's other matmuls, and its slowest above theirs for
    each tile. Without the code size the four kernels' tiles tie."""
    import importlib.util
    import tempfile

    from lazytriton.bench.field import write_package
    from lazytriton.compile import schedule
    from lazytriton.model.spec import kernel_spec

    # The package's kernels module alone: its __init__ imports torch and jax (a heavy package).
    path = os.path.join(write_package(tempfile.mkdtemp()), "ltfield", "kernels.py")
    found = importlib.util.spec_from_file_location("ltfield_kernels", path)
    K = importlib.util.module_from_spec(found)
    found.loader.exec_module(K)
    specs = {n: kernel_spec(getattr(K, n)) for n in ("mm_plain", "mm_relu", "mm_gelu", "mm_silu")}
    size = {n: s.code_size() for n, s in specs.items()}
    assert size["mm_gelu"] > size["mm_silu"] > size["mm_relu"] > size["mm_plain"] > 10, size
    cost = {n: [schedule.compile_cost(c.kwargs, c.num_warps, size[n]) for c in s.configs] for n, s in specs.items()}
    gelu_slowest = [1, 6, 7]  # 1.38, 1.55, 1.50 s
    others = [c for n, cs in cost.items() if n != "mm_gelu" for c in cs]
    assert min(cost["mm_gelu"][i] for i in gelu_slowest) > max(others)
    assert all(cost["mm_gelu"][i] > cost[n][i] for n in cost if n != "mm_gelu" for i in range(8))
    bare = {n: [schedule.compile_cost(c.kwargs, c.num_warps) for c in s.configs] for n, s in specs.items()}
    assert len({tuple(b) for b in bare.values()}) == 1


def test_code_size_follows_helpers_routines_and_libdevice():
    """KernelSpec.code_size: operations in the kernel, plus at each call of a @jit helper the
    helper's (a global, a closure cell, a module attribute), a routine-sized count for a call
    that unrolls into one (tl.erf, libdevice's functions), 1 for a kernel with no source."""
    import dataclasses
    import types

    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    from lazytriton.model.spec import kernel_spec

    @triton.jit
    def helper(v):
        return v * 2.0 + 1.0

    def make(epilogue):
        @triton.jit
        def k(x, B: tl.constexpr):
            o = tl.arange(0, B)
            tl.store(x + o, epilogue(tl.load(x + o)))
        return k

    @triton.jit
    def ident(v):
        return v

    @triton.jit
    def twice(v):
        return helper(helper(v))

    @triton.jit
    def erf(v):
        return tl.erf(v)

    @triton.jit
    def tanh(v):
        return libdevice.tanh(v)

    n = {name: kernel_spec(make(f)).code_size() for name, f in
         (("ident", ident), ("twice", twice), ("erf", erf), ("tanh", tanh))}
    assert n["twice"] == n["ident"] + 2 * (1 + 2)  # each call site counts the helper's two operations
    assert n["erf"] == n["ident"] + 34 and n["tanh"] == n["ident"] + 25
    unread = dataclasses.replace(kernel_spec(make(ident)), fn=types.SimpleNamespace(src="not python ("))
    assert unread.code_size() == 1  # no source to parse: the guess falls back


def test_jobs_other_than_the_long_poles_run_niced_a_little_more(monkeypatch):
    """A job's nice increment: 0 for a call's, 10 for one made ahead, 5 more unless it is a long
    pole (its cost at least POLE times that of the costliest ticket of its kind not ended yet: the
    step waits for the longest compile, and on a busy machine the others yield the cores to it).
    Relative to what is left: once the longest has ended, the next longest runs at 0."""
    import threading

    from lazytriton.compile import schedule

    pool = FakePool(4)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    before = {p: dict(c) for p, c in schedule._live.items()}  # another test's tickets not ended
    gate = threading.Event()
    first = [_ticket(n, schedule.URGENT, cost, gate=gate) for n, cost in (("dear", 9.0), ("mid", 7.0), ("cheap", 1.0))]
    ahead = _ticket("ahead", schedule.BACKGROUND, 1.0, gate=gate)
    for t in first + [ahead]:
        schedule.submit(t)
    gate.set()
    _until(lambda: len(pool.names()) == 4)
    assert [(n, nice) for n, nice, _ in pool.sent] == [("dear", 0), ("mid", 0), ("cheap", 5), ("ahead", 10)]
    pool.finish("dear")
    pool.finish("ahead")
    later = _ticket("later", schedule.URGENT, 2.0)  # no pole beside mid, still running
    schedule.submit(later)
    _until(lambda: len(pool.names()) == 5)
    pool.finish("mid")
    last = _ticket("last", schedule.URGENT, 1.5)  # the longest left is later's 2.0
    schedule.submit(last)
    _until(lambda: len(pool.names()) == 6)
    assert [nice for _, nice, _ in pool.sent[4:]] == [5, 0]
    for n in ("cheap", "later", "last"):
        pool.finish(n)
    _until(lambda: all(t.future.done() for t in first + [ahead, later, last]))
    assert {p: dict(c) for p, c in schedule._live.items()} == before  # every ended ticket left the live costs


def test_a_programs_compiles_asked_for_soon_queue_as_a_calls(monkeypatch):
    """Compiles asked for `soon` (a JAX program's sites at its lowering: its execution needs them
    all, in an order XLA decides) queue as a call's, in one place (schedule.TOGETHER): costliest
    first across kernels, the poles not niced, ahead of compiles made ahead; a call reaching one
    keeps its place (no promotion reorders them), and they take at most every worker. Like
    compiles made ahead, no call waits for them yet: while the server starts they wait for it
    rather than run on a thread here."""
    import threading

    from lazytriton.compile import schedule

    pool = StartingPool(2)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    here = []
    monkeypatch.setattr(schedule, "_back_end_here", lambda ticket, job: here.append(job["name"]))
    gate = threading.Event()
    blocker = _ticket("blocker", schedule.BACKGROUND, gate=gate)
    schedule.submit(blocker)
    _until(lambda: blocker.state == "running")
    soon = [schedule.Ticket(_ticket(n, schedule.URGENT).work, schedule.URGENT, n, (schedule.TOGETHER, 0), cost)
            for n, cost in (("plain", 1.0), ("gelu", 3.0), ("relu", 2.0), ("silu", 1.5))]  # lowered in this order
    for t in soon:
        schedule.submit(t)
    gate.set()
    _until(lambda: all(t.state == "ready" for t in soon + [blocker]))
    time.sleep(0.05)
    assert here == [] and pool.names() == []  # the server still starts: they wait for it
    schedule.promote(soon[0])  # the program's first site runs
    assert "promoted" not in soon[0].times
    pool.is_ready = True
    schedule._server_ready()
    _until(lambda: len(pool.names()) == 2)
    time.sleep(0.05)
    # Two of the four (every worker), the poles, costliest first, not niced; none left for the one made ahead.
    assert pool.names() == ["gelu", "relu"] and [nice for _, nice, _ in pool.sent] == [0, 0]
    pool.finish("gelu")
    _until(lambda: len(pool.names()) == 3)
    pool.finish("relu")
    _until(lambda: len(pool.names()) == 4)
    assert [s[:2] for s in pool.sent[2:]] == [("silu", 0), ("plain", 0)]  # each the pole of what is left
    pool.finish("silu")
    _until(lambda: len(pool.names()) == 5)
    assert pool.sent[4][:2] == ("blocker", 10)  # on the worker left, niced
    for n in ("blocker", "plain"):
        pool.finish(n)
    _until(lambda: all(t.future.done() for t in soon + [blocker]))


def test_the_front_end_thread_runs_a_waiting_calls_candidates_first(monkeypatch):
    """compile.schedule: one thread runs every front end of the process; a
    ticket a call waits for runs before tickets compiled ahead, and a promoted
    one before the other background ones."""
    import threading

    from lazytriton.compile import schedule

    pool = FakePool(8)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    gate, ran = threading.Event(), []
    first = _ticket("running", schedule.BACKGROUND, gate=gate, ran=ran)
    schedule.submit(first)
    _until(lambda: first.state == "running")
    tickets = [_ticket(n, schedule.BACKGROUND, ran=ran) for n in ("b1", "b2", "b3")]
    tickets.append(_ticket("urgent", schedule.URGENT, ran=ran))
    for t in tickets:
        schedule.submit(t)
    schedule.promote(tickets[2])
    gate.set()
    _until(lambda: len(ran) == 5)
    assert ran == ["running", "urgent", "b3", "b1", "b2"]
    for n in pool.names():
        pool.finish(n)


def test_a_call_promotes_the_candidates_compiled_ahead_that_it_waits_for(fresh_triton_cache, monkeypatch):
    """Two kernels compiled ahead of time on a one-worker server, the second's
    candidates queued behind the first's; a call of the second joins its
    compiles and moves them ahead: they are ready before the first kernel's
    last candidate (without promotion they would start after all of them). A
    stream claims its compile keys and makes their tickets at once (under one
    lock), so a call can never find a claimed candidate it cannot promote."""
    import concurrent.futures as cf
    import uuid

    monkeypatch.setenv("LAZYTRITON_COMPILE_WORKERS", "1")
    monkeypatch.setattr(compile_pool, "_pool", None)
    pool = compile_pool.get_pool()
    try:
        assert pool.workers == 1 and pool.wait_ready()
        tag = uuid.uuid4().hex
        spec, first = demo_candidates(DEMO_CONFIGS[:4])
        _, second = demo_candidates(DEMO_CONFIGS[4:7])
        ready_at: dict[str, float] = {}

        def ahead(name, cands):  # what compile_ahead does: a background stream, read to its end
            for c in compile_stream(spec, TARGET, cands, key=lambda c: f"{tag}-{name}-{c.index}",
                                    ahead=True):
                assert c.binary is not None, c.error
                ready_at[f"{name}{c.index}"] = time.perf_counter()

        with cf.ThreadPoolExecutor(2) as threads:
            a = threads.submit(ahead, "first", first)
            time.sleep(0.05)
            b = threads.submit(ahead, "second", second)
            time.sleep(0.3)  # the server works on the first kernel's first candidate
            _, call = demo_candidates(DEMO_CONFIGS[4:7])
            got = list(compile_stream(spec, TARGET, call, key=lambda c: f"{tag}-second-{c.index}"))
            called_at = time.perf_counter()
            a.result(timeout=300), b.result(timeout=300)
        assert all(c.binary is not None and c.extra.get("joined") for c in got)
        assert called_at < max(ready_at[f"first{i}"] for i in range(4)), ready_at
    finally:
        pool.close()


def _front_ends_held(monkeypatch):
    """A FakePool(8), and the front-end thread held by a ticket made ahead until `gate` is set:
    what is submitted meanwhile queues whole. Returns (pool, gate, ran, blocker); `ran`: for
    the tickets' names as their front ends run."""
    import threading

    from lazytriton.compile import schedule

    pool = FakePool(8)
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pool)
    gate = threading.Event()
    blocker = _ticket("blocker", schedule.BACKGROUND, gate=gate)
    schedule.submit(blocker)
    _until(lambda: blocker.state == "running")
    return pool, gate, [], blocker


def test_queued_in_the_order_the_compiles_were_asked_for(monkeypatch):
    """compile.schedule: among background tickets, the order taken when the
    compiles were asked for (next_order: a program's lowering order) beats the
    order in which the compile-ahead threads queued them; within a stream, the
    costliest front end first (its back end then starts first)."""
    from lazytriton.compile import schedule

    pool, gate, ran, blocker = _front_ends_held(monkeypatch)
    first, second = schedule.next_order(), schedule.next_order()
    late = [_ticket(n, schedule.BACKGROUND, order=(second, i), ran=ran) for i, n in enumerate(("second-a", "second-b"))]
    early = [_ticket(n, schedule.BACKGROUND, cost, order=(first, i), ran=ran)
             for i, (n, cost) in enumerate((("first-cheap", 1.0), ("first-dear", 2.0)))]
    for t in late + early:  # the later-asked stream's thread got to the queue first
        schedule.submit(t)
    gate.set()
    _until(lambda: len(ran) == 4)
    assert ran == ["first-dear", "first-cheap", "second-a", "second-b"]
    for n in pool.names():
        pool.finish(n)


def test_front_ends_run_the_long_poles_first_then_the_others_in_the_order_asked_for(monkeypatch):
    """A program's kernels asked for in its call order: the long poles (cost at least POLE times
    the costliest not ended) first, costliest first, wherever they are called; then the others in
    the order asked for, each stream's costliest first, so that the program's first sites are
    ready to tune while the poles compile (costliest first across the program, the first site's
    cheap candidates went last and it waited for nearly every compile)."""
    from lazytriton.compile import schedule

    pool, gate, ran, blocker = _front_ends_held(monkeypatch)
    o1, o2, o3 = (schedule.next_order() for _ in range(3))
    tickets = [_ticket(n, schedule.URGENT, cost, order, ran=ran) for n, cost, order in (
        ("site1 cheap", 1.0, (o1, 0)), ("site1 dear", 2.0, (o1, 1)), ("site2 pole", 9.0, (o2, 0)),
        ("site2 mid", 5.0, (o2, 1)), ("site3 pole", 6.0, (o3, 0)), ("site3 mid", 3.0, (o3, 1)))]
    for t in tickets:
        schedule.submit(t)
    gate.set()
    _until(lambda: len(ran) == 6)
    assert ran == ["site2 pole", "site3 pole", "site1 dear", "site1 cheap", "site2 mid", "site3 mid"]
    for n in pool.names():
        pool.finish(n)
    _until(lambda: all(t.future.done() for t in tickets + [blocker]))


def test_a_compile_server_that_cannot_start_leaves_the_candidates_to_this_process(fresh_triton_cache, monkeypatch,
                                                                                  caplog):
    """The server's executable is gone (Popen fails): the candidates compile in
    this process, and the stream neither hangs nor raises."""
    monkeypatch.setenv("LAZYTRITON_COMPILE_WORKERS", "2")
    monkeypatch.setattr(compile_pool, "_pool", None)
    pool = compile_pool.get_pool()
    monkeypatch.setattr(compile_pool.sys, "executable", "/nonexistent/python")
    compile_pool.start()  # what wrapping a kernel does: no error there either
    spec, cands = demo_candidates(DEMO_CONFIGS[:2])
    with caplog.at_level(logging.INFO, logger="lazytriton"):
        done = list(compile_stream(spec, TARGET, cands, ahead=True))
    assert len(done) == 2 and all(c.binary is not None for c in done), [c.error for c in done]
    assert "the compile server could not start" in caplog.text


@triton.jit
def _fails_in_its_front_end(x, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)  # BLOCK=3: not a power of 2
    tl.store(x + offs, 1.0)


def test_the_front_end_thread_keeps_nothing_of_a_failed_compile():
    """Once a candidate's front end failed, the thread that ran it waits for the next one holding
    none of it: Triton's error frames (its MLIR objects, which Triton's bindings reported as leaked
    when the test process exited) go with the candidate."""
    import gc

    from lazytriton.compile import schedule

    spec = kernel_spec(_fails_in_its_front_end)
    c = Candidate(0, None, Binder(spec, TARGET).bind((DeviceArray(0x7F0000000000, "fp32", 64, (16,)),), {"BLOCK": 3}))
    compile_all(spec, TARGET, [c])
    assert c.binary is None and "power of 2" in c.error
    del c
    gc.collect()
    alive = [t for t in gc.get_objects() if isinstance(t, schedule.Ticket)
             and t.times.get("label", "").startswith("_fails_in_its_front_end")]
    assert not alive, [t.times for t in alive]
