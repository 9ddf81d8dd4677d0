"""Triton's front end in the caller, its back end anywhere: a candidate's TTIR
as text, for kernels whose front end cannot run in a worker.

A kernel that lives in a real package cannot be compiled by name in another
process without importing that package there (torch, jax and everything they
pull in: seconds per process). Most kernels travel as a portable recipe
(compile.recipe: the worker rebuilds them and runs the front end itself);
for those that have none, or whose recipe a worker refused, the caller,
which has the kernel's module imported already, runs Triton's front end
(Python AST -> TTIR, about 20-40 ms: a few percent of a compile, but holding
the GIL) and hands the module's text to the compile server's workers, which
run every later stage (TTIR passes, TTGIR, LLIR, PTX/AMDGCN, ptxas/lld)
without importing any user code. Candidates compiled in this process while
the compile server starts take this path too (their back end on threads).

The worker compiles with ``triton.compile`` on a `TextSource`: an ASTSource
whose ``make_ir`` parses the text instead of walking the AST and whose
``hash()`` is the caller's ASTSource hash, so Triton runs exactly the stages
it runs for the kernel itself (an IR file would skip the first stage's
passes) and keys its own cache exactly as it keys the kernel's. The cubin is
the one Triton builds from the AST (tests/test_compile_pool.py compares).
"""
from __future__ import annotations

import inspect
import os
import tempfile
from typing import Any

from triton.compiler import ASTSource, make_backend

from .targets import ast_source

__all__ = ["TextSource", "compile_text", "front_end"]


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
    returns what a worker needs to compile it (picklable, no user objects):
    the module's text (with its source locations), Triton's source hash and
    name, the source's language and first stage, and the compile options.
    Raises what Triton's front end raises (CompilationError, ...)."""
    from triton._C.libtriton import ir

    src = ast_source(fn, signature, constexprs, attrs)
    backend = make_backend(target)
    merged = dict(options or {}, **src.parse_options())  # as triton.compile merges them
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = _make_ir(src, target, backend.parse_options(merged), context)
    return {"text": module.str(), "hash": src.hash(), "name": src.name, "language": src.language, "ext": src.ext,
            "options": merged}


class TextSource(ASTSource):
    """An ASTSource made from `front_end`'s output: Triton compiles it as it
    compiles the kernel's own ASTSource, from the first stage on."""

    def __init__(self, ir: dict) -> None:  # no ASTSource.__init__: there is no fn here
        self.fn = None
        self.name, self.language, self.ext = ir["name"], ir["language"], ir["ext"]
        self.signature, self.constants, self.attrs = {}, {}, {}
        self._hash, self._text = ir["hash"], ir["text"]

    def hash(self) -> str:
        return self._hash

    def parse_options(self) -> dict:
        return {}

    def make_ir(self, *args: Any):
        from triton._C.libtriton import ir

        context = args[-1]
        fd, path = tempfile.mkstemp(suffix=".mlir", prefix="lt-ir-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self._text)
            module = ir.parse_mlir_module(path, context)
        finally:
            os.unlink(path)
        module.context = context  # as the code generator leaves it: the passes read it
        return module


def compile_text(ir: dict, target):
    """The CompiledBinary of `front_end`'s output: every later stage of Triton's
    compile (a compile server's worker, or a thread of the caller)."""
    import triton

    from ..cache import CompiledBinary

    return CompiledBinary.from_triton(triton.compile(TextSource(ir), target=target, options=ir["options"]))
