"""Differential test: the compile path builds exactly the binary Triton builds in
the caller, now, for kernels that read state Triton's cache key does not cover
(tests/exact_corpus/kernels.py), on the CPU (sm_90 cubins: Triton ships ptxas).

Each case compiles a candidate through the production path (Triton's binder,
compile.compiler.compile_stream, the compile server's workers: as a first call
would) and through Triton in this process (``triton.compile(ASTSource(...))``
with the same signature, constexprs, attributes and options, Triton's cache
bypassed), and compares the TTIR text and the cubin bytes. The classes:
- default arguments of a ``@jit`` helper and of a ``constexpr_function``,
  bound at ``def`` time, the global they read rebound later;
- ``tl.target_info`` (``cuda_capability_geq``, ``is_cuda``): asked of this
  process's driver, here a stand-in that reports an sm_90 (the CPU has none);
- attributes of modules that travel by name, added by the program (a compat
  shim adding a function to ``triton.language``; ``math.<attr>``);
- ``getattr(module, name[, default])`` on a user module;
- what the kernel reads, changed after its first compile (constexpr and dtype
  globals, a module attribute, a helper replaced on its module, a closure cell,
  ``math``'s attribute, what ``getattr``'s default stood for): Triton memoises
  the kernel's cache key, so its hash stays that of the first compile;
- what the program changes while the compile waits in the queue (globals, a
  helper replaced by name or on its module, a closure cell, a module attribute),
  and a global it assigns while the front end runs, which iterates the globals
  (a front end runs on the queue's thread, later than the call: it reads the
  kernel as the call did, ``model.spec.as_read_now``);
- Triton's knobs set in code (``nvidia.disable_ptxas_opt``,
  ``compilation.disable_line_info``, with ``knobs.propagate_env`` off too: no
  variable written; ``compilation.use_ir_loc``).

What each relies on, and how it fails when that is removed (tried, see the
issue 47 report): without the caller's state applied in the worker
(compile.ir_text.apply_state a no-op) the knob cases fail (the worker's ptxas
optimises, or keeps line info); with the worker keyed by Triton's memoised hash
alone (TextSource.hash = Triton's source hash) every "changed after" case fails
(the worker's Triton cache returns the first compile's binary); a front end run
in a process without this one's driver sees no target (`test_the_target_is_this_processs`
checks the case would notice), and one that re-ran the module's defs, or read
modules by name there, would see SCALE = 3 and no shim; a front end given the
live kernel (``spec.fn``) instead of its view fails every queued case (the
change compiled in, and "dictionary changed size during iteration").
"""
import gc
import math
import re
import weakref

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from lazytriton.compile import ir_text, pool as compile_pool
from lazytriton.compile.compiler import Binder, Candidate, compile_stream
from lazytriton.compile.targets import ast_source
from lazytriton.model.arrays import DeviceArray
from lazytriton.model.spec import as_read_now, kernel_spec

from exact_corpus import helpers, kernels as ek

TARGET = GPUTarget("cuda", 90, 32)
X = DeviceArray(0x7F0000000000, "fp32", 1 << 20)


class _Driver:
    """What tl.target_info asks: this process's device."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_target(self) -> GPUTarget:
        return self.target


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm compile server under this module's Triton cache (both production
    compiles of a "changed after" case go through it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton")))
        pool = compile_pool.get_pool()
        if pool is None:
            pytest.skip("LAZYTRITON_COMPILE_WORKERS=0")
        pool.close()
        assert pool.wait_ready()
        yield pool
        pool.close()


@pytest.fixture(autouse=True)
def sm90_device(monkeypatch):
    from triton.runtime import driver

    monkeypatch.setattr(driver, "_active", _Driver(TARGET))


def production(kernel, B: int = 128, where: str = "worker") -> Candidate:
    spec = kernel_spec(kernel)
    c = Candidate(0, None, Binder(spec, TARGET).bind((X, X, 1000), {"B": B}))
    (c,) = compile_stream(spec, TARGET, [c])
    assert c.error is None, c.error
    assert c.extra["compiled_in"] == where, c.extra
    return c


def reference(kernel, c: Candidate, cache_dir):
    """Triton in this process, its cache bypassed (a compile now, not a hit keyed by a memoised hash)."""
    b = c.bound
    with triton.knobs.compilation.scope(), triton.knobs.cache.scope():
        triton.knobs.compilation.always_compile = True
        triton.knobs.cache.dir = str(cache_dir)
        return triton.compile(ast_source(kernel, b.signature, b.constexprs, b.attrs), target=TARGET,
                              options=b.options.__dict__)


def same_bytes(cubin: bytes) -> bytes:
    """The cubin less the name of ptxas's temporary input, which unoptimised
    cubins carry (Triton's own two compiles of one kernel differ there)."""
    return re.sub(rb"tmp\w{8}\.ptx", b"tmpXXXXXXXX.ptx", cubin)


def check(kernel, tmp_path, B: int = 128, where: str = "worker"):
    c = production(kernel, B, where)
    ck = reference(kernel, c, tmp_path / "reference")
    assert c.binary.ttir == ck.asm["ttir"]
    assert same_bytes(c.binary.cubin) == same_bytes(ck.asm["cubin"])
    return c.binary


@pytest.mark.parametrize("kernel", [ek.defaults, ek.target_checks, ek.patched_modules, ek.via_getattr],
                         ids=lambda k: k.__name__)
def test_state_read_at_definition_and_from_this_process(server, tmp_path, kernel):
    check(kernel, tmp_path)


def test_the_target_is_this_processs(server, tmp_path, monkeypatch):
    """The target case notices a front end that does not see this process's
    device: another device's answer gives another TTIR."""
    from triton.runtime import driver

    sm90 = check(ek.target_checks, tmp_path)
    assert "inline_asm" in sm90.ttir
    monkeypatch.setattr(driver, "_active", _Driver(GPUTarget("cuda", 80, 32)))
    assert "inline_asm" not in check(ek.target_checks, tmp_path).ttir


def _closure_case():
    kernel, set_cell = ek.make_closure()
    return kernel, lambda mp: set_cell(9)


CHANGED = {
    "constexpr and dtype globals": lambda: (ek.reads_globals, lambda mp: (
        mp.setattr(ek, "K", tl.constexpr(5)), mp.setattr(ek, "DT", tl.bfloat16))),
    "module attribute": lambda: (ek.reads_module, lambda mp: mp.setattr(helpers, "FACTOR", tl.constexpr(4))),
    "helper replaced on its module": lambda: (ek.reads_module, lambda mp: mp.setattr(helpers, "op", helpers.op_b)),
    "closure cell": _closure_case,
    "attribute of a module read by name": lambda: (ek.patched_modules,
                                                   lambda mp: mp.setattr(math, "lt_exact_scale", 2.5)),
    "getattr's default now found": lambda: (ek.via_getattr, lambda mp: mp.setattr(helpers, "MISSING", 11,
                                                                                  raising=False)),
}


@pytest.mark.parametrize("case", list(CHANGED))
def test_state_changed_after_a_first_compile(server, tmp_path, monkeypatch, case):
    kernel, change = CHANGED[case]()
    first = check(kernel, tmp_path)
    change(monkeypatch)
    second = check(kernel, tmp_path)
    assert same_bytes(first.cubin) != same_bytes(second.cubin)  # the change matters


@pytest.mark.parametrize("propagate", [True, False], ids=["env", "no_env"])
@pytest.mark.parametrize("group,knob", [("nvidia", "disable_ptxas_opt"), ("compilation", "disable_line_info")])
def test_knobs_set_in_code(server, tmp_path, monkeypatch, group, knob, propagate):
    """A knob set in code after the server started; with propagate_env off
    Triton writes no variable, and only the knob's value tells."""
    off = check(ek.plain, tmp_path)
    knobs = getattr(triton.knobs, group)
    with knobs.scope():
        monkeypatch.setattr(triton.knobs, "propagate_env", propagate)
        setattr(knobs, knob, True)
        on = check(ek.plain, tmp_path)
    assert same_bytes(on.cubin) != same_bytes(off.cubin)


def test_use_ir_loc_set_in_code(server, tmp_path, monkeypatch):
    """compilation.use_ir_loc: Triton writes the path of the IR file in its
    cache (named by the source's hash) into the binary's line info, so the
    reference is Triton in this process compiling the same TTIR under the same
    cache and hash."""
    off = production(ek.plain)
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.use_ir_loc = "ttgir"
        c = production(ek.plain)
        b = c.bound
        ir = ir_text.front_end(ek.plain, TARGET, b.signature, b.constexprs, b.attrs, b.options.__dict__)
        triton.knobs.compilation.always_compile = True
        ck = triton.compile(ir_text.TextSource(ir), target=TARGET, options=ir["options"])
    assert same_bytes(c.binary.cubin) == same_bytes(ck.asm["cubin"]) and c.binary.ttir == ck.asm["ttir"]
    assert c.binary.cubin != off.binary.cubin


class _Assigns:
    """A global that assigns another global in its module whenever its ``__module__`` is read:
    the program's thread, assigning a global at the moment a front end iterates the module's
    globals (Triton's CodeGenerator reads each one's ``__module__`` as it copies them)."""

    def __init__(self, module):
        self.module, self.assigned = module, []

    def __getattribute__(self, name):
        if name == "__module__":
            module, assigned = object.__getattribute__(self, "module"), object.__getattribute__(self, "assigned")
            assigned.append(f"_assigned_{len(assigned)}")
            setattr(module, assigned[-1], len(assigned))
        return object.__getattribute__(self, name)


QUEUED = {  # a kernel, and what the program changes while its compile waits in the queue
    "constexpr and dtype globals": lambda: (ek.reads_globals, lambda mp: (
        mp.setattr(ek, "K", tl.constexpr(5)), mp.setattr(ek, "DT", tl.bfloat16))),
    "helper called by name replaced": lambda: (ek.defaults, lambda mp: mp.setattr(ek, "_scaled", helpers.op_b)),
    "closure cell": _closure_case,
    "module attribute and a helper replaced on its module": lambda: (ek.reads_module, lambda mp: (
        mp.setattr(helpers, "FACTOR", tl.constexpr(4)), mp.setattr(helpers, "op", helpers.op_b))),
}


@pytest.mark.parametrize("case", list(QUEUED))
def test_a_front_end_run_later_reads_the_kernel_as_it_was_when_its_compile_was_asked_for(server, tmp_path,
                                                                                          monkeypatch, case):
    """Front ends run on the queue's thread, after the call that asked for them and beside the
    program (online tuning's other candidates, compile_ahead, a JAX program's sites). They read
    the kernel as it was when its compile was asked for (model.spec.as_read_now, which
    Resolution.compile_candidates passes with the keys it reads then), never the live globals:
    - the program changes what the kernel reads before the front end runs: the binary is the one
      Triton builds at the call (on the live globals: the changed value, under the call's key);
    - it assigns a global while the front end runs: Triton's front end iterates the globals (on the
      live dict: "dictionary changed size during iteration", the candidate lost; CI, stop 57).
    The next compile asked for reads the change."""
    kernel, change = QUEUED[case]()
    spec = kernel_spec(kernel)
    c = Candidate(0, None, Binder(spec, TARGET).bind((X, X, 1000), {"B": 128}))
    stream = compile_stream(spec, TARGET, [c], fn=as_read_now(spec.fn))  # nothing runs until it is read
    asked = reference(kernel, c, tmp_path / "asked")  # Triton in the caller, at the call
    change(monkeypatch)
    assigners = {module: _Assigns(module) for module in (ek, helpers)}  # the kernel's module, and its helpers'
    for module, assigns in assigners.items():
        monkeypatch.setattr(module, "_assigns", assigns, raising=False)
    try:
        (c,) = stream
    finally:
        for module, assigns in assigners.items():
            for name in assigns.assigned:
                delattr(module, name)
    assert c.error is None, c.error
    assert c.binary.ttir == asked.asm["ttir"] and same_bytes(c.binary.cubin) == same_bytes(asked.asm["cubin"])
    for module in assigners:
        monkeypatch.delattr(module, "_assigns")
    now = check(kernel, tmp_path)
    assert same_bytes(now.cubin) != same_bytes(c.binary.cubin)  # the change matters, and the next compile sees it


def test_dropped_kernels_are_not_kept_alive(server):
    """Nothing the user dropped is kept alive by the compile path: 200 closure
    kernels compiled, then dropped, are all collected."""
    alive = []
    specs = []
    for i in range(200):
        kernel, _ = ek.make_closure()
        alive.append(weakref.ref(kernel))
        spec = kernel_spec(kernel)
        specs.append((spec, [Candidate(0, None, Binder(spec, TARGET).bind((X, X, 1000), {"B": 64}))]))
        del kernel, spec
    done = 0
    for spec, cands in specs:  # what compile_ahead of many kernels does: their streams, one after another
        for c in compile_stream(spec, TARGET, cands):
            assert c.binary is not None, c.error
            done += 1
    assert done == 200
    del specs, cands, spec, c
    gc.collect()
    # Triton 3.9 keeps the last JITFunction of each qualified name (triton.runtime.jit's
    # _triton_jit_function_registry): the 200th closure, which is Triton's to keep, not ours.
    registry = getattr(triton.runtime.jit, "_triton_jit_function_registry", {})
    kept = [r() for r in alive if r() is not None]
    assert [k for k in kept if all(k is not v for v in registry.values())] == [] and len(kept) <= 1


@triton.jit
def looped(x, y, n, B: tl.constexpr):
    # A loop: the locations of its induction variable and iteration arguments (Triton names
    # them, NameLoc) are left out of the TTIR text by MLIR's printer.
    acc = tl.zeros([B], dtype=tl.float32)
    for k in tl.range(0, n, B):
        acc += tl.load(x + k + tl.arange(0, B), mask=k + tl.arange(0, B) < n, other=0.0)
    tl.store(y + tl.arange(0, B), acc)


def test_a_loop_compiles_in_a_worker_with_its_block_arguments_locations(server, tmp_path):
    """The job carries every block argument's location beside the text (ir_text._arg_locs) and
    the worker restores them (ir_text._read): the same TTIR and cubin as Triton's in the caller
    (Triton 3.7 built another cubin for a warp-specialized loop from the text alone:
    tests/triton_versions' warp_specialized_matmul)."""
    check(looped, tmp_path)


def test_without_the_locations_a_loop_does_not_read_back(monkeypatch):
    """What the locations restore: the text alone reads back with other block arguments (the
    check fails, so such a module would compile here, from memory)."""
    from triton._C.libtriton import ir
    from triton.compiler import make_backend

    spec = kernel_spec(looped)
    b = Binder(spec, TARGET).bind((X, X, 1000), {"B": 128})
    job = ir_text.front_end(looped, TARGET, b.signature, b.constexprs, b.attrs, b.options.__dict__)
    try:
        assert job["local"] is None and "k" in job["locs"]
        context = ir.context()
        ir.load_dialects(context)
        make_backend(TARGET).load_dialects(context)
        assert ir_text._reads_back(job["text"], job["locs"], context)
        monkeypatch.setattr(ir_text, "_block_args", lambda module: [])  # no location restored or compared
        empty = ir_text._arg_locs(ir_text._parse(job["text"], context, ir), context)
        assert not ir_text._reads_back(job["text"], empty, context)
    finally:
        ir_text.release(job)


def test_a_module_whose_text_does_not_read_back_compiles_here_from_memory(server, tmp_path, monkeypatch):
    """The worker checks that the job reads back as printed (ir_text._read_exactly) and refuses
    one that does not; its back end then runs in this process on the front end's own module,
    kept until the worker answered. Here the job's locations are emptied (so the worker's
    reading differs); remove the worker's check and the worker compiles it anyway."""
    monkeypatch.setattr(ir_text, "_block_args", lambda module: [])  # here only: the worker is the server's child
    check(looped, tmp_path, B=64, where="thread")
