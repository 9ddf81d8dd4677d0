"""Specialization and compilation of candidate configs, exactly as Triton does
it: Triton's own binder specializes the arguments, triton.compile builds each
candidate for the device's target, in parallel, skipping those that fail."""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from .cache import CompiledBinary
from .spec import KernelSpec

log = logging.getLogger("lazytriton.compiler")

DEFAULT_ARCH = 90  # target used to compile when no GPU is present (demo, tests)


def default_target() -> GPUTarget:
    return GPUTarget("cuda", int(os.environ.get("LAZYTRITON_DEFAULT_ARCH", DEFAULT_ARCH)), 32)


def device_target(capability: tuple[int, int]) -> GPUTarget:
    major, minor = capability
    return GPUTarget("cuda", major * 10 + minor, 32)


@dataclass
class Bound:
    """One call specialized for one config: what triton.compile needs."""
    signature: dict[str, str]
    constexprs: dict
    attrs: dict
    options: Any  # the backend's options object
    bound_args: dict

    def runtime_types(self) -> list[str]:
        return [t for t in self.signature.values() if t != "constexpr"]


class Binder:
    """Triton's own argument binder/specializer for one kernel and target."""

    def __init__(self, spec: KernelSpec, target: GPUTarget):
        self.spec, self.target = spec, target
        self.backend = make_backend(target)
        self._bind = create_function_from_signature(spec.fn.signature, spec.fn.params, self.backend)

    def bind(self, args: tuple, kwargs: dict) -> Bound:
        kwargs = dict(kwargs)
        kwargs.setdefault("debug", bool(self.spec.fn.debug) or triton.knobs.runtime.debug)
        bound_args, specialization, options = self._bind(*args, **kwargs)
        options, signature, constexprs, attrs = self.spec.fn._pack_args(
            self.backend, kwargs, bound_args, specialization, options)
        return Bound(signature, constexprs, attrs, options, bound_args)


@dataclass
class Candidate:
    index: int  # position in the kernel's config list
    config: triton.Config | None
    bound: Bound
    binary: CompiledBinary | None = None
    error: str | None = None
    compile_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"config {self.index} ({self.config})" if self.config is not None else "default config"


def compile_one(spec: KernelSpec, target: GPUTarget, bound: Bound) -> CompiledBinary:
    src = ASTSource(spec.fn, bound.signature, bound.constexprs, bound.attrs)
    kernel = triton.compile(src, target=target, options=bound.options.__dict__)
    return CompiledBinary.from_triton(kernel)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


def compile_all(spec: KernelSpec, target: GPUTarget, candidates: list[Candidate], load=None, store=None,
                max_workers: int | None = None) -> None:
    """Fills each candidate's binary or error. `load(c)`/`store(c, binary)` consult
    a persistent cache. Failures are logged and kept, never raised here."""
    todo = []
    for c in candidates:
        c.binary = load(c) if load else None
        if c.binary is None:
            todo.append(c)
        else:
            log.debug("kernel %s: %s loaded from cache", spec.name, c.label)
    if not todo:
        return
    workers = max_workers or min(len(todo), os.cpu_count() or 1)
    log.info("kernel %s: compiling %d candidate(s) for sm_%s with %d worker(s)", spec.name, len(todo),
             target.arch, workers)

    def job(c: Candidate):
        t0 = time.perf_counter()
        try:
            c.binary = compile_one(spec, target, c.bound)
        except Exception as exc:  # OutOfResources, PTXASError, CompilationError, ...
            c.error = _reason(exc)
        c.compile_s = time.perf_counter() - t0
        return c

    with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lazytriton-compile") as pool:
        for c in pool.map(job, todo):
            if c.error:
                log.warning("kernel %s: %s skipped: %s", spec.name, c.label, c.error)
            else:
                log.info("kernel %s: compiled %s in %.2fs (shared=%s B, num_warps=%s)", spec.name, c.label,
                         c.compile_s, c.binary.metadata.get("shared"), c.binary.metadata.get("num_warps"))
                if store:
                    store(c, c.binary)


class AllCandidatesFailed(RuntimeError):
    def __init__(self, kernel: str, candidates: list[Candidate]):
        lines = [f"kernel {kernel}: every candidate config failed:"]
        lines += [f"  {c.label}: {c.error}" for c in candidates]
        super().__init__("\n".join(lines))
        self.candidates = candidates
