"""The C launch path (`k[grid](...)`, csrc/python/launcher.cc) on the CPU.

Fake stubs (Python callables put in `k._stubs`, the stubs' Python protocol)
stand in for the generated C++ ones: they return True (launched), a key tuple
(no winner yet: C hands it to LazyKernel._first_call, which resolves it through
the kernel's table, then calls the stub again) or None (not this shape),
exactly as the stubs' C entries answer. Arrays are DeviceArrays at fake addresses."""
import gc
import sys
import threading
import time
import tracemalloc
import types
import weakref

import pytest
import triton
import triton.language as tl

import lazytriton
from lazytriton import _core
from lazytriton.runtime import stubgen
from lazytriton.runtime import kernel as rt
from lazytriton.model.arrays import DeviceArray

from kernels import basic


@triton.jit
def axpy_kernel(x, out, n, alpha=2.0, BLOCK: tl.constexpr = 128):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * alpha, mask=offs < n)


X = DeviceArray(0x7F0000000000, "fp32", 4096)
Y = DeviceArray(0x7F0000010000, "fp32", 4096)
OUT = DeviceArray(0x7F0000020000, "fp32", 4096)
GRID = (4,)


class Stub:
    """A fake generated stub: launch(handle, grid, stream, args) -> `result`."""

    def __init__(self, result=True):
        self.result, self.calls = result, []

    def __call__(self, handle, grid, stream, args):
        self.calls.append((handle, grid, stream, args))
        return self.result


class Spy:
    """Wraps LazyKernel._run (Python's binding of a call C cannot bind) on one
    kernel, recording its calls (instance attributes win)."""

    def __init__(self, k):
        self.calls, self.orig = [], k._run

    def __call__(self, grid, stream, args, kwargs):
        self.calls.append((grid, stream, args, dict(kwargs)))
        return self.orig(grid, stream, args, kwargs)


class KeyStub:
    """A fake stub that answers its call key until its kernel's table holds a
    winner for it, as the built stubs do."""

    def __init__(self, k, key):
        self.k, self.answer, self.calls = k, key, []

    def __call__(self, handle, grid, stream, args):
        self.calls.append(args)
        return True if self.k._core.find(list(self.answer)) else self.answer

    def key(self, args):
        return self.answer


@pytest.fixture(scope="module")
def entry():
    """A real winner (add_kernel compiled for sm_90) for the table to hold."""
    from lazytriton.compile.compiler import Binder, Candidate, compile_all
    from lazytriton.compile.targets import default_target
    from lazytriton.model.arrays import PointerArg
    from lazytriton.model.spec import kernel_spec

    spec, target = kernel_spec(basic.add_kernel), default_target()
    ptr = PointerArg(0x7F0000000000, "fp32")
    cand = Candidate(0, None, Binder(spec, target).bind((ptr, ptr, ptr, 16), {"BLOCK": 1024}))
    compile_all(spec, target, [cand])
    assert cand.binary is not None, cand.error
    return _core.Entry(_core.Kernel(cand.binary.cubin, cand.binary.metadata), [True] * 4 + [False], {})


def kernel_with(*stubs, fn=basic.add_kernel):
    k = lazytriton.kernel(fn)
    k._stubs = (*k._stubs, *stubs)
    return k


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)


def test_getitem_is_c_and_caches_int_grids():
    k = lazytriton.kernel(basic.add_kernel)
    assert isinstance(k, _core.LaunchBase) and "__getitem__" not in rt.LazyKernel.__dict__
    launch = k[GRID]
    assert type(launch) is _core.Launch is rt._Launch
    assert launch.kernel is k and launch.grid is GRID
    assert k[GRID] is launch  # same grid object: the same launch object
    assert k[7] is k[7]
    other = (4, 1)
    assert k[other] is not launch and k[other].grid is other

    def grid(meta):
        return (1,)
    assert k[grid] is not k[grid]  # a callable (maybe a closure over arrays) is not kept by the kernel
    assert k[grid].grid is grid
    assert repr(launch) == "<lazytriton launch lazytriton.LazyKernel(add_kernel)[(4,)]>"


def test_positional_call_goes_from_c_to_the_stubs(no_cupy):
    miss, hit = Stub(None), Stub(True)
    k = kernel_with(miss, hit)
    spy = k._run = Spy(k)
    assert k[GRID](X, Y, OUT, 16, 1024, stream=5) is None
    assert k[GRID](X, Y, OUT, 16, 1024) is None
    assert spy.calls == []
    assert len(miss.calls) == len(hit.calls) == 2
    (h, g, s, a), (_, _, s2, _) = hit.calls
    assert h == k._handle == k._core.handle and g is GRID and s == 5 and s2 == 0
    assert a == (X, Y, OUT, 16, 1024) and type(a) is tuple
    k._stubs = [hit]  # the C object reads whatever sequence Python assigns
    assert k._stubs == (hit,)
    k[GRID](X, Y, OUT, 16, 1024)
    assert len(hit.calls) == 3 and len(miss.calls) == 2


def test_stream_argument(monkeypatch, no_cupy):
    stub = Stub()
    k = kernel_with(stub)
    k._run = Spy(k)

    def stream_of(**kw):
        k[GRID](X, Y, OUT, 16, 1024, **kw)
        return stub.calls[-1][2]

    assert stream_of() == 0 and stream_of(stream=None) == 0
    assert stream_of(stream=123) == 123
    assert stream_of(stream=types.SimpleNamespace(cuda_stream=77)) == 77
    assert stream_of(stream=types.SimpleNamespace(ptr=78)) == 78
    assert stream_of(stream=True) == 1  # not an exact int: stream_handle's answer, as before
    with pytest.raises(TypeError, match="stream must be an int CUstream or a stream object, got str"):
        k[GRID](X, Y, OUT, 16, 1024, stream="s")
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=4242)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert stream_of() == 4242 and stream_of(stream=None) == 4242 and stream_of(stream=9) == 9
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert stream_of() == 0
    monkeypatch.setattr(rt, "stream_handle", lambda s: 31)  # a replacement is called, as _run would
    assert stream_of() == 31 and stream_of(stream=types.SimpleNamespace(ptr=1)) == 31 and stream_of(stream=2) == 2
    assert k._run.calls == []


def test_keyword_call_plans():
    stub = Stub()
    k = kernel_with(stub)
    spy = k._run = Spy(k)
    k[GRID](X, Y, OUT, 16, BLOCK=32, stream=3)  # first: Python binds it and keeps a plan
    assert len(spy.calls) == 1 and k._launch_plans == []
    for block in (64, 128):
        k[GRID](X, Y, OUT, 16, BLOCK=block, stream=3)
    kw = {"BLOCK": 256, "stream": 4}
    k[GRID](X, Y, OUT, 16, **kw)  # a new names tuple per call: found by contents
    k[GRID](X, Y, OUT, n=16, BLOCK=512)
    assert len(spy.calls) == 2  # only the first call of each keyword set went to Python
    k[GRID](X, Y, OUT, n=16, BLOCK=1024)
    assert len(spy.calls) == 2
    assert [c[3] for c in stub.calls] == [(X, Y, OUT, 16, b) for b in (32, 64, 128, 256, 512, 1024)]
    assert [c[2] for c in stub.calls][:4] == [3, 3, 3, 4]
    assert [p[0] for p in k._launch_plans] == [4, 3]
    assert all(p[2] == "fast" for p in k._launch_plans)
    assert set(k._launch_plans[0][1]) == {"BLOCK", "stream"}


def test_defaults_plan(no_cupy):
    stub = Stub()
    k = kernel_with(stub, fn=axpy_kernel)
    spy = k._run = Spy(k)
    for _ in range(3):
        k[GRID](X, OUT, 16)
        k[GRID](X, OUT, 16, BLOCK=64, stream=2)
        k[GRID](X, OUT, 16, stream=1)
        k[GRID](X, OUT, 16, 3.0, 256)
    assert len(spy.calls) == 2  # the first call with no keyword, and with BLOCK=; never with stream= alone
    assert [c[3] for c in stub.calls[:4]] == [(X, OUT, 16, 2.0, 128), (X, OUT, 16, 2.0, 64), (X, OUT, 16, 2.0, 128),
                                               (X, OUT, 16, 3.0, 256)]
    assert [c[2] for c in stub.calls[:4]] == [0, 2, 1, 0]
    assert stub.calls[4:8] == stub.calls[:4] and stub.calls[8:] == stub.calls[:4]


def test_run_is_the_same_c_path(no_cupy):
    stub = Stub()
    k = kernel_with(stub, fn=axpy_kernel)
    spy = k._run = Spy(k)
    assert "run" not in rt.LazyKernel.__dict__  # _core.LaunchBase.run
    for _ in range(2):
        k.run(X, OUT, 16, grid=GRID)
        k.run(X, OUT, 16, grid=GRID, stream=7, warmup=False)
        k.run(X, OUT, 16, 3.0, grid=(2,), BLOCK=64, stream=8)
    assert len(spy.calls) == 2  # the first of each keyword set: Python hands out its plan
    assert [(c[1], c[2], c[3]) for c in stub.calls[:3]] == [
        (GRID, 0, (X, OUT, 16, 2.0, 128)), (GRID, 7, (X, OUT, 16, 2.0, 128)), ((2,), 8, (X, OUT, 16, 3.0, 64))]
    assert stub.calls[3:] == stub.calls[:3]
    grid_fn = lambda meta: (meta["n"] // meta["BLOCK"],)  # noqa: E731
    k.run(X, OUT, 16, grid=grid_fn)
    assert stub.calls[-1][1] is grid_fn
    with pytest.raises(TypeError, match="missing required keyword argument: 'grid'"):
        k.run(X, OUT, 16)
    with pytest.raises(NotImplementedError, match="axpy_kernel: run.warmup=True. is not supported"):
        k.run(X, OUT, 16, grid=GRID, warmup=True)
    with pytest.raises(TypeError, match="stream must be an int CUstream"):
        k.run(X, OUT, 16, grid=GRID, stream="s")


def test_calls_python_binds_every_time_stay_in_python():
    stub = Stub()
    k = kernel_with(stub)
    spy = k._run = Spy(k)
    for _ in range(3):
        k[GRID](X, Y, OUT, 16, 32, num_warps=4)  # a compile option: bound by Python on every call
    assert len(spy.calls) == 3 and k._launch_plans == [(5, ("num_warps",), "slow")]
    opts = stub.calls[-1][3][5]
    assert stub.calls[-1][3][:5] == (X, Y, OUT, 16, 32) and opts == (("num_warps", 4),)


def test_python_binds_what_c_cannot(no_cupy):
    ok = Stub()
    k = kernel_with(ok)
    spy = k._run = Spy(k)
    k[GRID](X, Y, OUT, 16, 1024, stream=types.SimpleNamespace(ptr=5))  # C converts a stream object itself
    assert spy.calls == [] and ok.calls[-1][2] == 5
    k[GRID](X, Y, OUT, n=16, BLOCK=8)  # keywords not seen before: Python binds them (and keeps a plan)
    assert spy.calls == [(GRID, None, (X, Y, OUT), {"n": 16, "BLOCK": 8})]
    assert ok.calls[-1][3] == (X, Y, OUT, 16, 8)
    for flag in ("_python_heuristics", "_needs_probe"):
        setattr(k, flag, True)
        k[GRID](X, Y, OUT, 16, 1024)
        setattr(k, flag, False)
    assert len(spy.calls) == 3 and len(ok.calls) == 4  # Python bound them, C launched them
    k[GRID](X, Y, OUT, 16, 1024)
    assert len(spy.calls) == 3 and len(ok.calls) == 5
    spy.orig = lambda *a: "not a call"
    k._python_heuristics = True
    with pytest.raises(RuntimeError, match="add_kernel.*internal error: _run returned 'not a call'"):
        k[GRID](X, Y, OUT, 16, 1024)


def test_a_new_call_key_crosses_into_python_once(entry, no_cupy):
    k = lazytriton.kernel(basic.add_kernel)
    stub = KeyStub(k, (7, 8))
    k._stubs = [stub]
    seen = []
    k._resolve = lambda key, ctx: seen.append((key, ctx)) or entry
    spy = k._run = Spy(k)
    k[GRID](X, Y, OUT, 16, 1024, stream=3)
    assert seen == [((7, 8), ((X, Y, OUT, 16, 1024), 3, GRID, stub))]  # (call, stream, grid, the stub that keyed it)
    assert len(stub.calls) == 2 and spy.calls == []  # its key, then the launch
    k[GRID](X, Y, OUT, 16, 1024, stream=3)
    k.run(X, Y, OUT, 16, 1024, grid=GRID)
    assert len(seen) == 1 and len(stub.calls) == 4 and spy.calls == []


def test_a_failed_resolution_raises_and_is_retried(entry):
    k = lazytriton.kernel(basic.add_kernel)
    stub = KeyStub(k, (9,))
    k._stubs = [stub]
    answers = [ValueError("kernel add_kernel: no config compiled"), entry]

    def resolve(key, ctx):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    k._resolve = resolve
    with pytest.raises(ValueError, match="kernel add_kernel: no config compiled"):  # the resolver's own exception
        k[GRID](X, Y, OUT, 16, 1024)
    k[GRID](X, Y, OUT, 16, 1024)  # a failed key is resolved again by the next call
    assert answers == [] and len(stub.calls) == 3


def test_concurrent_first_calls_resolve_once(entry):
    k = lazytriton.kernel(basic.add_kernel)
    stub = KeyStub(k, (5, 5))
    k._stubs = [stub]
    seen, errors = [], []
    started = threading.Barrier(6)

    def resolve(key, ctx):
        seen.append(key)
        time.sleep(0.2)  # the others arrive meanwhile, and wait without the GIL
        return entry

    k._resolve = resolve

    def work():
        try:
            started.wait()
            k[GRID](X, Y, OUT, 16, 1024)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and seen == [(5, 5)]
    assert sum(1 for _ in stub.calls) >= 12  # each: its key, then the launch


def test_claim_hands_a_key_to_one_caller(entry):
    """ResolveTable.claim, what _first_call resolves through: one caller owns a new key,
    the others wait without the GIL and get None once the owner publishes."""
    table = _core.ResolveTable("claims")
    owner = table.claim([1, 2])
    assert isinstance(owner, _core.Claim)
    got, started = [], threading.Barrier(5)

    def wait():
        started.wait()
        got.append(table.claim([1, 2]))

    threads = [threading.Thread(target=wait) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.1)  # the waiters block (a Python thread that held the GIL would stall this one)
    assert got == [] and not table.find([1, 2])
    owner.publish(entry)
    for t in threads:
        t.join()
    assert got == [None] * 4 and table.find([1, 2]) and table.claim([1, 2]) is None
    with pytest.raises(Exception, match="already ended"):
        owner.publish(entry)


def test_a_failed_or_abandoned_claim_wakes_its_waiters(entry):
    table = _core.ResolveTable("claims")
    for end in ("raise", "abandon", "no winner"):
        owner, errors = table.claim([7]), []

        def wait():
            try:
                table.claim([7])
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.05)
        if end == "raise":
            with pytest.raises(KeyError, match="no config"):
                with owner:
                    raise KeyError("no config")
            t.join()
            assert len(errors) == 1 and type(errors[0]) is KeyError  # the owner's own exception
        elif end == "abandon":
            del owner  # dropped without publishing
            t.join()
            assert len(errors) == 1 and "a resolution was abandoned" in str(errors[0])
        else:
            with owner:
                pass
            t.join()
            assert len(errors) == 1 and "ended without a winner" in str(errors[0])
        again = table.claim([7])  # a failed key is claimed anew by the next caller
        assert isinstance(again, _core.Claim)
        again.publish(entry) if end == "no winner" else again.__exit__(None, None, None)
    assert table.find([7])
    with pytest.raises(Exception, match="no kernel"):
        table.claim([8]).publish(None)
    assert isinstance(table.claim([8]), _core.Claim)  # refused, so the key stays unresolved


def test_a_new_argument_shape_crosses_into_python_once(entry, no_cupy):
    k = lazytriton.kernel(basic.add_kernel)
    stub, added, seen = KeyStub(k, (3, 4)), [], []

    def add_stub(args):
        added.append(args)
        k._stubs = (stub,)
        return stub

    k._add_stub = add_stub
    k._resolve = lambda key, ctx: seen.append(key) or entry
    spy = k._run = Spy(k)
    k[GRID](X, Y, OUT, 16, 1024, stream=4)
    # One call into Python (_first_call: the stub made, its key resolved), then the stub launches.
    assert added == [(X, Y, OUT, 16, 1024)] and seen == [(3, 4)] and len(stub.calls) == 1 and spy.calls == []
    k[GRID](X, Y, OUT, 16, 1024)
    assert len(added) == 1 and len(seen) == 1 and len(stub.calls) == 2
    k._stubs = [Stub(None)]
    k._add_stub = lambda args: k._stubs[0]
    k._stubs[0].key = lambda args: None
    with pytest.raises(RuntimeError, match="kernel .*add_kernel.*: internal error: the stub made for these arguments "
                                           "rejected them"):
        k[GRID](X, Y, OUT, 16, 1024)
    k._add_stub = lambda args: KeyStub(k, (3, 4))  # made, but not put in k._stubs
    with pytest.raises(RuntimeError, match="kernel .*add_kernel.*: internal error: the stub made for these arguments "
                                           "rejected them"):
        k[GRID](X, Y, OUT, 16, 1024)


def test_stub_errors_propagate():
    def broken(handle, grid, stream, args):
        raise ValueError("grid must be an int or a tuple of 1 to 3 non-negative ints")

    k = kernel_with(broken)
    spy = k._run = Spy(k)
    with pytest.raises(ValueError, match="grid must be"):
        k[GRID](X, Y, OUT, 16, 1024)
    assert spy.calls == []


def test_argument_errors_unchanged():
    k = kernel_with(Stub())
    with pytest.raises(TypeError, match=r"kernel add_kernel: takes 5 arguments \(x, y, out, n, BLOCK\), got 6"):
        k[GRID](X, Y, OUT, 16, 1, 2)
    with pytest.raises(TypeError, match="kernel add_kernel: unexpected keyword argument 'nope'"):
        k[GRID](X, Y, OUT, 16, 1024, nope=1)
    with pytest.raises(TypeError, match="kernel add_kernel: missing argument 'BLOCK'"):
        k[GRID](X, Y, OUT, 16, stream=0)
    with pytest.raises(TypeError, match="kernel add_kernel: unexpected keyword argument 'x'"):
        k[GRID](X, Y, OUT, 16, 1024, x=X)
    kt = lazytriton.kernel(basic.add_tuned_kernel)
    with pytest.raises(TypeError, match="'BLOCK' is chosen by its autotune configs"):
        kt[GRID](X, Y, OUT, 16, BLOCK=64)
    with pytest.raises(TypeError, match="BLOCK"):
        kt[GRID](X, Y, OUT, 16, BLOCK=64)  # again: no plan was kept for it
    assert kt._launch_plans == [(4, ("BLOCK",), "slow")]


@pytest.mark.skipif(lazytriton.gpu_available()[0], reason="resolves on fake addresses: CPU only")
def test_cpu_call_reaches_resolution(cache_dir):
    k = lazytriton.kernel(basic.add_kernel)
    for _ in range(2):  # the second call: the stub's key, resolved from C (and failing again: no driver)
        with pytest.raises(lazytriton.RuntimeFailure, match="kernel add_kernel: .*driver"):
            k[GRID](X, Y, OUT, 16, BLOCK=1024, stream=0)
    assert len(k._stubs) == 1
    with pytest.raises(TypeError, match="kernel add_kernel, argument y: unsupported argument type str"):
        k[GRID](X, "nope", OUT, 16, BLOCK=16)


def _refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


def _same_refcounts(objs, work):
    """Counts after `work` equal those before it. Garbage left by earlier tests is collected first and the
    collector stays off meanwhile: freed mid-count it would read as a fall, and garbage made per launch as a rise."""
    gc.collect()
    gc.disable()
    try:
        before = _refcounts(objs)
        work()
        assert _refcounts(objs) == before
    finally:
        gc.enable()


def test_reference_counts_exact(entry):
    k = lazytriton.kernel(axpy_kernel)
    k._stubs = [Stub()]
    k[GRID](X, OUT, 16, BLOCK=64, stream=2)  # Python binds these once and keeps their plans
    k[GRID](X, OUT, 16)
    alpha, block, stream = 2.5, 4096, 12345678901
    launch = k[GRID]

    def launched(handle, grid, stream, args):
        return True

    key = (1, 2)

    class Unresolved:  # its key, then (resolved) the launch
        n = 0

        def __call__(self, handle, grid, stream, args):
            self.n += 1
            return key if self.n % 2 else True

    def not_mine(handle, grid, stream, args):
        return None

    unresolved = Unresolved()
    k._resolve = lambda key, ctx: entry
    k._stubs = [not_mine, launched]
    objs = [k, launch, GRID, X, OUT, alpha, block, stream, k._handle, key, launched, unresolved, not_mine, entry]

    def run(n, stream_object=False):
        for _ in range(n):
            launch(X, OUT, 16, alpha, block, stream=stream)  # positional
            launch(X, OUT, 16, BLOCK=block, stream=stream)  # keyword plan
            k[GRID](X, OUT, 16)  # defaults plan
            launch(X, OUT, 16, BLOCK=block, stream=types.SimpleNamespace(ptr=3))
            k.run(X, OUT, 16, alpha, block, grid=GRID, stream=stream, warmup=False)  # k.run's keyword split

    def check():
        run(10)
        _same_refcounts(objs, lambda: run(1000))

    check()
    k._stubs = [not_mine, unresolved]  # a call key: resolved through the table (the resolver once)
    check()
    k._python_heuristics = True  # Python binds every call
    check()
    k._python_heuristics = False

    class Once:  # made for the call, launches it once, then taken away
        def __call__(self, handle, grid, stream, args):
            k._stubs = [not_mine]
            return True

        def key(self, args):
            return key

    once = Once()
    objs.append(once)

    def add_once(args):
        k._stubs = [not_mine, once]
        return once

    k._stubs = [not_mine]
    k._add_stub = add_once  # no stub takes the call: Python adds one (its key has a winner: no resolution)
    check()


def test_no_memory_growth():
    k = lazytriton.kernel(axpy_kernel)
    k._run = Spy(k)
    k._stubs = [lambda handle, grid, stream, args: True]

    def run(n):
        for i in range(n):
            k[GRID](X, OUT, 16, 2.0, 128, stream=i)
            k[GRID](X, OUT, 16, BLOCK=64)
            k[GRID](X, OUT, n=16, **{"BLOCK": 64})
            k[(i % 3 + 1,)](X, OUT, 16)
            k.run(X, OUT, 16, grid=GRID, stream=i, warmup=False)
            k.run(X, OUT, 16, grid=(i % 3 + 1,), BLOCK=64)

    run(100)
    stubgen.wait_for_builds(120)  # a background stub build allocates too (and, niced, may still run)
    tracemalloc.start()
    try:
        run(100)
        start = tracemalloc.get_traced_memory()[0]
        run(5000)
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 4096, grown


def test_kernel_and_cached_launch_are_collected():
    class Kernel(_core.LaunchBase):
        pass

    k = Kernel()
    k._stubs, k._handle = [Stub()], 0
    launch = k[GRID]
    assert k[GRID] is launch  # kernel -> launch -> kernel: a cycle for the collector
    ref, lref = weakref.ref(k), weakref.ref(k._stubs[0])
    del k, launch
    gc.collect()
    assert ref() is None and lref() is None


def test_threads():
    stub = Stub()
    k = kernel_with(stub)
    k._run = Spy(k)
    errors = []

    def work(i):
        try:
            for j in range(500):
                k[GRID](X, Y, OUT, 16, BLOCK=j, stream=i)
                k[(i,)](X, Y, OUT, 16, j)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert len(stub.calls) == 8 * 1000
    assert sorted(c[3][4] for c in stub.calls) == sorted(list(range(500)) * 16)


def test_the_stream_of_a_call_that_names_none(monkeypatch, no_cupy):
    """Issue 46's rule (launcher.cc default_stream), read from torch's getters per call as Triton's
    driver reads them: a torch tensor among the arguments -> torch's current stream of the launch
    device; else CuPy's current stream if CuPy is imported; else torch's; stream= wins."""
    torch = pytest.importorskip("torch")
    stub = Stub()
    k = kernel_with(stub)
    k._run = Spy(k)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7000 + device, raising=False)
    # The launch device: the current context's (device 0 where a GPU test made one), else torch's.
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    t = torch.zeros(4)

    def stream_of(*args, **kw):
        k[GRID](*args, **kw)
        return stub.calls[-1][2]

    assert stream_of(X, Y, OUT, 16, 1024) == 7000  # torch imported: Triton's rule for any call
    assert stream_of(t, Y, OUT, 16, 1024) == 7000 and stream_of(X, Y, OUT, 16, 1024, stream=5) == 5
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=4242)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert stream_of(X, Y, OUT, 16, 1024) == 4242  # CuPy's arrays: CuPy's stream
    assert stream_of(t, Y, OUT, 16, 1024) == 7000  # a torch tensor among them: torch's
    assert stream_of((X, t), Y, OUT, 16, 1024) == 7000  # inside a tuple too
    assert k._run.calls == []
    # Python's callers (resolve, _run's calls) read the same rule.
    assert lazytriton._core.default_stream((t, 1)) == 7000 and lazytriton._core.default_stream((X,)) == 4242
    assert k._run(GRID, None, (t, Y, OUT, 16), {"BLOCK": 1024})[1] == 7000
