"""Specialization and compilation of candidate configs, exactly as Triton does
it: Triton's own binder specializes the arguments, Triton's front end runs
here for each candidate as it compiles (ir_text) and its back end in the
compile server's worker processes (pool) or on threads here, in the order
compile.schedule decides, skipping the candidates that fail."""
from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from . import ir_text, pool as compile_pool, schedule
from .server import reason
from .targets import ast_source, target_label
from ..model import tuples
from ..cache import CompiledBinary
from ..model.spec import KernelSpec, as_read_now
from ..model.specialize import WIDE_FLOAT, prime_in_background, prime_specializer

log = logging.getLogger("lazytriton.compile.compiler")

# CPython 3.11 keeps the depth counter of ast.parse's AST-to-object conversion
# per interpreter, not per thread: two threads parsing at once can fail with
# "SystemError: AST constructor recursion depth mismatch". Triton parses a
# kernel and each @jit function it calls in JITFunction.parse (its front end,
# and cache_key's dependency walk), and lazytriton runs those on threads: the
# candidates' compiles (LAZYTRITON_COMPILE_WORKERS=0, kernels no worker can
# import) and the background specializer warm-up. A parse holds the GIL
# throughout anyway, so running one at a time costs nothing.
PARSE_LOCK = threading.Lock()


def _serialize_parse() -> None:
    from triton.runtime.jit import JITFunction  # GluonJITFunction inherits parse

    parse = JITFunction.parse
    if getattr(parse, "lazytriton_serialized", False):
        return

    @functools.wraps(parse)
    def serialized(self):
        with PARSE_LOCK:
            return parse(self)

    serialized.lazytriton_serialized = True
    JITFunction.parse = serialized


_serialize_parse()


@dataclass
class Bound:
    """One call specialized for one config: what triton.compile needs."""
    signature: dict[str, str]
    constexprs: dict
    attrs: dict
    options: Any  # the backend's options object
    bound_args: dict

    def runtime_types(self) -> list[str]:
        return [t for t in self.flat_signature.values() if t != "constexpr"]

    def is_param(self, leaves) -> list[bool]:
        """Per leaf name: whether it is a kernel parameter of this specialization (not a
        constexpr, nor an int Triton folded into one)."""
        flat = self.flat_signature
        return [flat.get(n, "constexpr") != "constexpr" for n in leaves]

    @property
    def flat_signature(self) -> dict[str, str]:
        """{leaf name: type}: a tuple parameter's elements as "xs[0]", "xs[1][0]"
        (lazytriton.model.tuples), in the order of the kernel's parameters."""
        return tuples.flat_signature(self.signature)


def warm_up() -> None:
    """Starts, in the background, what a first call that compiles will wait
    for: the compile server (a process) and Triton's specializer (a thread).
    Called when a kernel is wrapped; nothing is compiled."""
    compile_pool.start()
    prime_in_background()


# Options JITFunction.run sets from Triton's knobs on every call (3.6: instrumentation_mode;
# 3.7+: fpsan_homomorphic_casts too; 3.5: neither): passed where this Triton has the knob
# and its backend the option. tests/triton_versions/check.py compares with Triton's run.
_KNOB_OPTIONS = ("instrumentation_mode", "fpsan_homomorphic_casts")


class Binder:
    """Triton's own argument binder/specializer for one kernel and target."""

    def __init__(self, spec: KernelSpec, target: GPUTarget):
        prime_specializer()
        self.spec, self.target = spec, target
        self.backend = make_backend(target)
        self._bind = create_function_from_signature(spec.fn.signature, spec.fn.params, self.backend)
        fields = vars(self.backend.parse_options({}))
        self._knob_options = tuple(n for n in _KNOB_OPTIONS if n in fields and hasattr(triton.knobs.compilation, n))

    def bind(self, args: tuple, kwargs: dict, positional: frozenset = frozenset()) -> Bound:
        """Triton's binding of a call; `positional`: names in kwargs the call passed
        positionally (or left to their defaults): a parameter named like a launch
        option (num_warps) is then no launch option, as in Triton."""
        kwargs = dict(kwargs)
        # As JITFunction.run does before binding.
        kwargs["debug"] = kwargs.get("debug", self.spec.fn.debug) or triton.knobs.runtime.debug
        for name in self._knob_options:
            kwargs[name] = getattr(triton.knobs.compilation, name)
        try:
            bound_args, specialization, options = self._bind(*args, **kwargs)
        except ModuleNotFoundError as exc:
            # Triton 3.6's AMD specializer imports torch for its buffer-ops ("within 2 GB") pointer
            # attribute, whatever the argument (3.7+ checks first).
            if exc.name != "torch" or self.target.backend != "hip":
                raise
            raise RuntimeError(f"kernel {self.spec.name}: Triton {triton.__version__}'s AMD backend imports torch to "
                               "specialize pointer arguments (buffer ops), and torch is not installed: install "
                               "torch, or set AMDGCN_USE_BUFFER_OPS=0 (no buffer-op addressing)") from None
        options, signature, constexprs, attrs = self.spec.fn._pack_args(
            self.backend, {k: v for k, v in kwargs.items() if k not in positional}, bound_args, specialization,
            options)
        for p in self.spec.params:  # a float type given by lazytriton, not by the source (JAX's fp64 rule)
            if p.annotation == WIDE_FLOAT and signature.get(p.name) == "fp32":
                signature[p.name] = p.annotation
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
    src = ast_source(spec.fn, bound.signature, bound.constexprs, bound.attrs)
    kernel = triton.compile(src, target=target, options=bound.options.__dict__)
    return CompiledBinary.from_triton(kernel)


def compile_all(spec: KernelSpec, target: GPUTarget, candidates: list[Candidate], load=None, store=None,
                max_workers: int | None = None) -> None:
    """Fills each candidate's binary or error. `load(c)`/`store(c, binary)` consult
    a persistent cache. Failures are logged and kept, never raised here."""
    for _ in compile_stream(spec, target, candidates, load, store, max_workers):
        pass


# Compiles under way in this process, by compile key: a stream that needs one of them waits for it
# (a first call while compile_ahead still compiles its candidates) instead of compiling it again,
# and promotes it ahead of compiles no call waits for yet.
_inflight: dict[str, schedule.Ticket] = {}
_inflight_joined: set[int] = set()  # id() of the tickets another stream waits for
_inflight_lock = threading.Lock()


def _follow(src: cf.Future) -> cf.Future:
    """A future of its own for one candidate that waits for another stream's compile."""
    dst: cf.Future = cf.Future()

    def copy(f: cf.Future) -> None:
        if f.cancelled():
            dst.set_exception(compile_pool.WorkerUnavailable("the compile it waited for was abandoned"))
        elif f.exception() is not None:
            dst.set_exception(f.exception())
        else:
            dst.set_result(f.result())

    src.add_done_callback(copy)
    return dst


def _forget(k: str, ticket: schedule.Ticket, _=None) -> None:
    with _inflight_lock:
        if _inflight.get(k) is ticket:
            del _inflight[k]
        _inflight_joined.discard(id(ticket))


def compile_stream(spec: KernelSpec, target: GPUTarget, candidates: list[Candidate], load=None, store=None,
                   max_workers: int | None = None, key=None, ahead: bool = False,
                   order: int | None = None, in_order: bool = False, soon: bool = False,
                   fn: Any = None) -> Iterator[Candidate]:
    """Compiles the candidates that `load` does not find and yields every candidate as soon as it has its
    binary or its error, so that tuning can start on the first. Each candidate takes one of three
    routes: a candidate another stream of this process is compiling (same compile key `key(c)`:
    compile_ahead, another first call, a JAX lowering) is waited for, not compiled again; else Triton's
    front end runs here (compile.schedule's thread) and its back end in the compile server; or, with no
    server (max_workers set, LAZYTRITON_COMPILE_WORKERS=0, or it could not start or died), on a thread
    here. `ahead`: compiles made ahead, no call waits for them yet (they go after a call's and run niced,
    unless `soon`: a program about to run needs them all).
    `order` (compile.schedule.next_order(), taken when asked for) places them among those of their
    priority. `in_order`: the candidates' own order is the queue's (online tuning lists the likeliest
    winner, or the quickest compile, first), not the costliest first. `fn`: the kernel the front ends
    read (model.spec.as_read_now, taken when the compile was asked for; by default when the stream
    starts)."""
    fn = as_read_now(spec.fn) if fn is None else fn
    todo = []
    for c in candidates:
        c.binary = load(c) if load else None
        if c.binary is None:
            todo.append(c)
        else:
            log.debug("kernel %s: %s loaded from cache", spec.name, c.label)
    for c in candidates:
        if c.binary is not None:
            yield c
    if not todo:
        return
    t0 = time.perf_counter()
    pool = compile_pool.get_pool() if max_workers is None else None
    if pool is not None:
        try:
            pool.start()  # warming up for the candidates to come, if nothing started it yet
        except OSError as exc:  # no compile server: this process compiles them
            log.warning("kernel %s: the compile server could not start (%s): compiling in this process", spec.name,
                        exc)
            pool = None
    priority = schedule.BACKGROUND if ahead and not soon else schedule.URGENT
    order = schedule.next_order() if order is None else order
    code = None  # spec.code_size(), read once a candidate is queued here (not for those joined)
    futures: dict[cf.Future, Candidate] = {}
    mine: list[tuple[str | None, schedule.Ticket]] = []
    joined: list[schedule.Ticket] = []
    with _inflight_lock:
        for rank, c in enumerate(todo):
            k = key(c) if key is not None else None
            other = _inflight.get(k) if k is not None else None
            if other is not None:
                _inflight_joined.add(id(other))
                joined.append(other)
                futures[_follow(other.future)] = c
                c.extra["joined"] = True
                continue
            code = code or (1 if in_order else spec.code_size())
            cost = (schedule.in_order_cost(rank, len(todo)) if in_order else
                    schedule.compile_cost(c.bound.constexprs, getattr(c.bound.options, "num_warps", None), code))
            t = schedule.Ticket(functools.partial(_front_end, spec, fn, target, c), priority, f"{spec.name} {c.label}",
                                (order, rank), cost, here=pool is None)
            if k is not None:
                _inflight[k] = t
                t.future.add_done_callback(functools.partial(_forget, k, t))
            futures[t.future] = c
            mine.append((k, t))
    if joined:
        log.info("kernel %s: %d candidate(s) already compiling in this process: waiting for them", spec.name,
                 len(joined))
        if not ahead:
            for t in joined:
                schedule.promote(t)
    if mine:
        where = f"in {min(pool.workers, len(mine))} worker process(es)" if pool is not None else "in this process"
        log.info("kernel %s: compiling %d candidate(s) for %s: front end here, back end %s", spec.name, len(mine),
                 target_label(target), where)
    for _, t in mine:
        schedule.submit(t)
    seen: dict[str, str] = {}  # an error's text -> the first candidate that failed with it
    # Failures are said once the stream ends, in config order: alike errors then name the first
    # config whatever order the compiles finished in (one finishing first under load changed it).
    failed: list[Candidate] = []
    try:
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                c = futures[fut]
                _settle(c, fut)
                if c.error:
                    failed.append(c)
                else:
                    _report(spec, c, None if c.extra.get("joined") else store, seen)
                c.extra["ready_s"] = time.perf_counter() - t0
                yield c
    finally:
        # When every candidate failed, the caller raises AllCandidatesFailed with Triton's whole
        # message: said here too, it would be printed twice.
        if failed and len(failed) == len(candidates):
            log.debug("kernel %s: every candidate failed: %s", spec.name, "; ".join(c.error for c in failed))
        else:
            for c in sorted(failed, key=lambda c: c.index):
                _report(spec, c, None, seen)
        # Stopped early: what no other stream waits for is dropped.
        with _inflight_lock:
            drop = [(k, t) for k, t in mine if id(t) not in _inflight_joined and not t.future.done()]
        for k, t in drop:
            if t.cancel() and k is not None:
                _forget(k, t)
    ok = sum(c.binary is not None for c in todo)
    log.info("kernel %s: %d of %d candidate(s) compiled in %.2fs", spec.name, ok, len(todo), time.perf_counter() - t0)


def _front_end(spec: KernelSpec, fn: Any, target: GPUTarget, c: Candidate) -> dict:
    """One candidate's front end, on compile.schedule's thread, reading `fn`: its job, or
    CompileFailed with Triton's whole message."""
    t0 = time.perf_counter()
    b = c.bound
    try:
        ir = ir_text.front_end(fn, target, b.signature, b.constexprs, b.attrs, b.options.__dict__)
    except Exception as exc:  # CompilationError and the like
        raise compile_pool.CompileFailed(reason(exc)) from None
    c.extra["front_end"] = "here"
    c.extra["front_end_s"] = time.perf_counter() - t0
    if ir["local"]:
        log.debug("kernel %s: %s: back end in this process (%s)", spec.name, c.label, ir["local"])
    return {"ir": ir, "target": target}  # a worker's job; compile.schedule adds its nice increment


def _settle(c: Candidate, fut: cf.Future) -> None:
    """Records a finished compile on `c`."""
    try:
        c.binary, back_s, c.extra["compiled_in"] = fut.result()
        c.compile_s = c.extra.get("front_end_s", 0.0) + back_s
    except (compile_pool.WorkerUnavailable, compile_pool.WorkerCrashed, compile_pool.CompileFailed) as exc:
        c.error = str(exc)
    except Exception as exc:  # OutOfResources, PTXASError, CompilationError, ...
        c.error = reason(exc)


def _report(spec: KernelSpec, c: Candidate, store, seen: dict) -> None:
    if c.error:
        # Triton's whole message, once: candidates that fail alike point at the first.
        short = f"config {c.index}" if c.config is not None else "the default config"
        first = seen.setdefault(c.error, short)
        if first is short:
            log.warning("kernel %s: %s skipped: %s", spec.name, c.label, c.error)
        else:
            log.warning("kernel %s: %s skipped: the same error as %s", spec.name, c.label, first)
        return
    log.info("kernel %s: compiled %s in %.2fs (shared=%s B, num_warps=%s)", spec.name, c.label, c.compile_s,
             c.binary.metadata.get("shared"), c.binary.metadata.get("num_warps"))
    if store:
        store(c, c.binary)


class AllCandidatesFailed(RuntimeError):
    """Every candidate failed: Triton's whole message, once when they all failed
    alike (then naming the configs), else per candidate."""

    def __init__(self, kernel: str, candidates: list[Candidate]):
        errors = [c.error or "no binary" for c in candidates]
        if len(candidates) > 1 and len(set(errors)) == 1:
            lines = [f"kernel {kernel}: every candidate config ({len(candidates)}) failed with:", errors[0],
                     "the configs: " + "; ".join(c.label for c in candidates)]
        else:
            lines = [f"kernel {kernel}: every candidate config failed:"]
            lines += [f"  {c.label}: " + e.replace("\n", "\n    ") for c, e in zip(candidates, errors)]
        super().__init__("\n".join(lines))
        self.candidates = candidates
