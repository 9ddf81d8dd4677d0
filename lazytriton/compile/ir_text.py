"""Triton's front end in the caller, its back end anywhere: a candidate's TTIR as text, with everything
the back end reads from the caller's process.

Every candidate's front end (Python AST -> TTIR, about 20-40 ms holding the GIL) runs in the process
that compiles it, at the moment it compiles: it reads what Triton's own front end would read now
(globals and closure cells as they are, default arguments bound at ``def`` time, module attributes
the program patched, what constexpr functions compute, ``tl.target_info``'s answer from this
process's driver, Triton's knobs). A worker of the compile server, which never imports user code,
runs every later stage (TTIR passes, TTGIR, LLIR, PTX/AMDGCN, ptxas/lld) under the caller's knobs
and Triton environment (`process_state`, applied by `apply_state`), so the binary is the one Triton
builds in the caller.

The worker compiles with ``triton.compile`` on a `TextSource`: an ASTSource whose ``make_ir`` parses
the text (and restores the block arguments' locations MLIR's printer leaves out, which the job
carries beside it) instead of walking the AST, and refuses a module that does not read back exactly,
so Triton runs exactly the stages it runs for the kernel itself (an IR file would skip the first
stage's passes). Its ``hash()``, which keys Triton's cache, covers the text and the state beside
Triton's hash of the source: Triton memoises a kernel's ``cache_key``, so a value the kernel reads
that changed since its first compile leaves Triton's hash as it was, and Triton's cache key covers
knobs only through the variables they write (none with ``knobs.propagate_env`` off); keyed by less,
a worker would find another binary in Triton's cache.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import os
import tempfile
from typing import Any

import triton
from triton.compiler import ASTSource, make_backend

from .targets import ast_source

__all__ = ["DoesNotReadBack", "InCaller", "TextSource", "apply_state", "compile_text", "empty_kernel_job", "front_end",
           "process_state", "release"]


def _make_ir(src: ASTSource, target, options, context):
    backend = make_backend(target)
    codegen_fns = backend.get_codegen_implementation(options)
    module_map = backend.get_module_map()
    # Triton 3.5 took no target; 3.6+ take it first.
    if "target" in inspect.signature(src.make_ir).parameters:
        return src.make_ir(target, options, codegen_fns, module_map, context)
    return src.make_ir(options, codegen_fns, module_map, context)


def front_end(fn, target, signature: dict, constexprs: dict, attrs: dict, options: dict) -> dict:
    """Runs Triton's front end for one specialization in this process and
    returns what a back end needs to compile it (picklable, no user objects):
    the module's text (with its source locations), a hash of it, its name, the
    source's language and first stage, the compile options, and this process's
    Triton state now (`process_state`). Raises what Triton's front end raises
    (CompilationError, ...)."""
    from triton._C.libtriton import ir

    src = ast_source(fn, signature, constexprs, attrs)
    backend = make_backend(target)
    merged = dict(options or {}, **src.parse_options())  # as triton.compile merges them
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = _make_ir(src, target, backend.parse_options(merged), context)
    text, locs = module.str(), _arg_locs(module, context)
    state, local = process_state()
    key = hashlib.sha256(f"{src.hash()}\n{text}\n{locs}\n{sorted(state['env'].items(), key=str)}\n".encode())
    key.update(repr(sorted((g, sorted(v.items(), key=str)) for g, v in state["knobs"].items())).encode())
    return {"text": text, "locs": locs, "hash": key.hexdigest(), "name": src.name, "language": src.language,
            "ext": src.ext, "options": merged, "state": state, "local": local, "in_caller": InCaller(module)}


def empty_kernel_job() -> dict:
    """A job of an empty kernel made with Triton's IR builder: a compile server's warm-up without Triton's
    code generator, which its children never run (importing it was 0.15 s of a 0.27 s warm-up on a CPU)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import Language

    context = ir.context()
    ir.load_dialects(context)
    module = _one_function("lt_warm_up", context, lambda builder: None)
    text = module.str()
    return {"text": text, "locs": _arg_locs(module, context), "hash": hashlib.sha256(text.encode()).hexdigest(),
            "name": "lt_warm_up", "language": Language.TRITON, "ext": "ttir", "options": {}, "local": None}


class DoesNotReadBack(Exception):
    """The text and locations, read back, do not print as themselves: a worker does not compile
    them (the caller compiles the front end's own module instead)."""


def _reads_back(text: str, locs: str, context) -> bool:
    try:
        _read_exactly(text, locs, context)
        return True
    except DoesNotReadBack:
        return False


def _read_exactly(text: str, locs: str, context):
    """`_read`, checked: the module prints as the text and its block arguments' locations as
    `locs`, so what compiles is what the front end made. Checked where it is read (a worker),
    not in the caller, whose GIL the front ends share."""
    from triton._C.libtriton import ir

    module = _read(text, locs, context, ir)
    if module.str() != text or _arg_locs(module, context) != locs:
        raise DoesNotReadBack("its TTIR text does not read back as printed")
    return module


def _read(text: str, locs: str, context, ir):
    """The module of `front_end`'s text, its block arguments' locations restored from `locs`:
    MLIR's printer leaves out those of a loop's induction variable and iteration arguments
    (Triton names them, NameLoc), which later stages read (Triton 3.7's warp specialization
    built another cubin without them)."""
    module = _parse(text, context, ir)
    named = _parse(locs, context, ir)
    found: list = []
    named.walk(lambda op: found.append(op.get_result(0).get_loc()) if op.get_name() == "arith.constant" else None)
    args = _block_args(module)
    if len(args) != len(found):
        raise DoesNotReadBack(f"{len(found)} block argument locations for {len(args)} block arguments")
    for arg, loc in zip(args, found):
        arg.set_loc(loc)
    return module


def _block_args(module) -> list:
    """Every block's arguments, in the order of a walk of the module (the same in any process
    for the same text)."""
    seen: set = set()
    args: list = []

    def visit(op) -> None:
        block = op.get_block()
        if block is not None and block.id() not in seen:
            seen.add(block.id())
            args.extend(block.arg(i) for i in range(block.get_num_arguments()))

    module.walk(visit)
    return args


def _arg_locs(module, context) -> str:
    """Every block argument's location, whole, as text the parser reads: one constant at each, in a module."""
    def body(builder) -> None:
        for arg in _block_args(module):
            # On the op itself: the builder's own location is unknown while line info is disabled.
            builder.get_int32(0).set_loc(arg.get_loc())
    return _one_function("block_argument_locations", context, body).str()


def _one_function(name: str, context, body):
    """A module of one public function of no arguments, `body(builder)` its ops before its return."""
    from triton._C.libtriton import ir

    builder = ir.builder(context)
    module = builder.create_module()
    fn = builder.get_or_insert_function(module, name, builder.get_function_ty([], []), "public", False)
    module.push_back(fn)
    builder.set_insertion_point_to_start(fn.add_entry_block())
    body(builder)
    builder.ret([])
    return module


def _parse(text: str, context, ir):
    fd, path = tempfile.mkstemp(suffix=".mlir", prefix="lt-ir-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return ir.parse_mlir_module(path, context)
    finally:
        os.unlink(path)


class InCaller:
    """The front end's module itself, for a back end in this process (which compiles it from
    memory, not from its text); it never travels: a worker gets an empty one."""

    __slots__ = ("module",)

    def __init__(self, module=None) -> None:
        self.module = module

    def __reduce__(self):
        return InCaller, ()

    def take(self):
        module, self.module = self.module, None
        return module


class TextSource(ASTSource):
    """An ASTSource made from `front_end`'s output: Triton compiles it as it
    compiles the kernel's own ASTSource, from the first stage on."""

    def __init__(self, ir: dict) -> None:  # no ASTSource.__init__: there is no fn here
        self.fn = None
        self.name, self.language, self.ext = ir["name"], ir["language"], ir["ext"]
        self.signature, self.constants, self.attrs = {}, {}, {}
        self._hash, self._text, self._locs = ir["hash"], ir["text"], ir["locs"]
        self._in_caller, self._local = ir.get("in_caller"), ir.get("local")

    def hash(self) -> str:
        return self._hash

    def parse_options(self) -> dict:
        return {}

    def make_ir(self, *args: Any):
        module = self._in_caller.take() if self._in_caller is not None else None
        if module is not None:  # in the caller: the front end's own module, in its own context
            return module
        if self._local:  # compiled once already, or a worker given a job that must not travel
            raise RuntimeError(f"lazytriton: internal error: {self.name}'s front end must be compiled in the "
                               f"process that ran it ({self._local})")
        context = args[-1]
        module = _read_exactly(self._text, self._locs, context)
        module.context = context  # as the code generator leaves it: the passes read it
        return module


def compile_text(ir: dict, target):
    """The CompiledBinary of `front_end`'s output: every later stage of Triton's
    compile (a compile server's worker, or a thread of the caller)."""
    from ..cache import CompiledBinary

    try:
        return CompiledBinary.from_triton(triton.compile(TextSource(ir), target=target, options=ir["options"]))
    finally:
        release(ir)


def release(ir: dict) -> None:
    """Drops the front end's module (a hit in Triton's cache never asked for it; a job sent to a
    worker does not need it): MLIR objects left alive at exit are reported as leaks."""
    if ir.get("in_caller") is not None:
        ir["in_caller"].take()


# -- what the back end reads from the process ------------------------------------------

# Knobs holding a callable of the caller's that changes what the back end does: a job made while
# one is set compiles its back end in the caller (it cannot travel to a process without user code).
_LOCAL_ONLY = ("add_stages_inspection_hook",)
_SCALARS = (str, int, float, bool, type(None))
# Variables Triton reads outside its knobs (triton.compile's cache-invalidating set names only TRITON_*).
_ALSO_ENV = ("PTXAS_OPTIONS", "DISABLE_PTXAS_OPT", "USE_IR_LOC", "LLVM_EXTRACT_DI_LOCAL_VARIABLES",
             "NVPTX_ENABLE_DUMP", "CC")


@functools.lru_cache(maxsize=None)
def _knob_layout() -> tuple:
    """(group name, {descriptor name: its variable}, (plain attribute names)) per group of
    Triton's knobs (triton.knobs, 3.5+; their classes do not change at run time)."""
    knobs = getattr(triton, "knobs", None)
    base, desc = getattr(knobs, "base_knobs", None), getattr(knobs, "env_base", None)
    if base is None or desc is None:
        return ()
    layout = []
    for gname, group in vars(knobs).items():
        if not isinstance(group, base):
            continue
        described, plain = {}, []
        for cls in reversed(type(group).__mro__):
            for name, attr in vars(cls).items():
                if name.startswith("_"):
                    continue
                if isinstance(attr, desc):
                    described[name] = attr.key
                elif not callable(attr) and not isinstance(attr, (property, classmethod, staticmethod)) \
                        or name in _LOCAL_ONLY:
                    plain.append(name)
        layout.append((gname, described, tuple(plain)))
    return tuple(layout)


def _portable(value) -> bool:
    # A value a worker unpickles without importing user code: plain data, or Triton's own (NvidiaTool).
    return isinstance(value, _SCALARS) or type(value).__module__.split(".")[0] == "triton"


def process_state() -> tuple[dict, str | None]:
    """Everything Triton's back end reads from this process, now: each knob's
    value set in code (a knob's variable is written only when its value is a
    plain one and ``knobs.propagate_env`` holds), each plain knob attribute
    (``runtime.debug``, ``compilation.instrumentation_mode``: not variables),
    and every variable Triton's knobs read (TRITON_* and the others: None
    where unset). Second: why the back end must run here instead (a knob
    holding a Python callable that changes the compile), or None."""
    keys = {k for k in os.environ if k.startswith("TRITON_")}
    keys.update(_ALSO_ENV)
    knobs, local = {}, None
    for gname, described, plain in _knob_layout():
        group = getattr(triton.knobs, gname)
        keys.update(described.values())
        values = {name: v for name, v in vars(group).items() if name in described and _portable(v)}
        for name in plain:
            v = getattr(group, name, None)
            if name in _LOCAL_ONLY and v is not None:
                local = f"triton.knobs.{gname}.{name} is set"
            elif isinstance(v, _SCALARS):
                values[name] = v
        knobs[gname] = values
    return {"env": {k: os.environ.get(k) for k in keys}, "knobs": knobs}, local


def apply_state(state: dict) -> None:
    """Makes this process's Triton state the caller's (`process_state`): in a
    compile server's forked child, which serves one job and exits."""
    env = state["env"]
    for k in [k for k in os.environ if k.startswith("TRITON_") and k not in env]:
        del os.environ[k]
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for gname, described, plain in _knob_layout():
        values = state["knobs"].get(gname, {})
        group = getattr(triton.knobs, gname)
        for name in described:  # set in code there, or read from the variable as there
            if name in values:
                group.__dict__[name] = values[name]
            else:
                group.__dict__.pop(name, None)
        for name in plain:
            if name in values:
                setattr(group, name, values[name])
