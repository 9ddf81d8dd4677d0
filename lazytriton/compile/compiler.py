"""Specialization and compilation of candidate configs, exactly as Triton does
it: Triton's own binder specializes the arguments and triton.compile compiles
each candidate for the device's target in parallel worker processes
(compile_pool), from the kernel's portable recipe (recipe: the worker runs the
front end too) or from its TTIR made here (ir_text), skipping those that fail."""
from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from . import ir_text, pool as compile_pool, recipe, schedule
from .server import reason
from .targets import ast_source, target_label
from ..model import tuples
from ..cache import CompiledBinary
from ..model.spec import KernelSpec
from ..model.specialize import WIDE_FLOAT

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


_specializer_ready = threading.Lock()
_specializer_primed = False


def prime_specializer() -> None:
    """Makes the first use of Triton's native specializer (3.5+), which imports
    modules (Gluon's, about 0.1 s) and, in a process that has not imported
    torch, would import torch only to register a fast path for torch.Tensor:
    seconds of a first call in a JAX process. This first use runs with torch
    hidden from this thread's imports (other threads still import it); torch
    tensors still specialize identically, through the specializer's data_ptr
    fallback."""
    global _specializer_primed
    if _specializer_primed:
        return
    with _specializer_ready:
        if _specializer_primed:
            return
        try:
            from triton._C.libtriton import native_specialize_impl
            from triton.backends.compiler import BaseBackend
        except ImportError:  # a Triton without the native specializer imports nothing extra
            native_specialize_impl = None
        if native_specialize_impl is not None:
            hide = "torch" not in sys.modules
            if hide:
                _HideTorch.thread = threading.get_ident()
                sys.meta_path.insert(0, _HideTorch)  # `import torch` raises ImportError, which Triton clears
            try:
                native_specialize_impl(BaseBackend, 16, False, True, True)
            finally:
                if hide:
                    sys.meta_path.remove(_HideTorch)
                    _HideTorch.thread = None
        _specializer_primed = True


class _HideTorch:
    thread: int | None = None  # the thread priming the specializer

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "torch" and threading.get_ident() == cls.thread:
            raise ModuleNotFoundError("hidden while Triton's specializer starts", name="torch")
        return None


_priming: threading.Thread | None = None


def warm_up() -> None:
    """Starts, in the background, what a first call that compiles will wait
    for: the compile server (a process) and Triton's specializer (a thread).
    Called when a kernel is wrapped; nothing is compiled."""
    global _priming
    compile_pool.start()
    if _priming is None and not _specializer_primed:
        # Not a daemon: a process that ends while it primes (a short script
        # whose first call found its winner on disk) waits for it; a daemon
        # thread stopped inside Triton's C++ at exit aborts the process
        # ("terminate called ... FATAL: exception not rethrown").
        _priming = threading.Thread(target=_prime_quietly, name="lazytriton-prime-specializer", daemon=False)
        _priming.start()


def _prime_quietly() -> None:
    try:
        prime_specializer()
    except Exception as exc:  # the first bind calls it again and raises where a caller sees it
        log.debug("priming Triton's specializer failed: %s", exc)


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

    def bind(self, args: tuple, kwargs: dict) -> Bound:
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
            self.backend, kwargs, bound_args, specialization, options)
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
# and moves it ahead of compiles no call waits for yet.
@dataclass
class _Inflight:
    future: cf.Future
    ticket: schedule.Ticket | None = None
    urgent: bool = False  # a call joined it before its ticket was made: the ticket is promoted when it is


_inflight: dict[str, _Inflight] = {}
_inflight_lock = threading.Lock()


def _copy_future(dst: cf.Future, src: cf.Future) -> None:
    if src.cancelled():
        dst.set_exception(compile_pool.WorkerUnavailable("the compile it waited for was abandoned"))
    elif src.exception() is not None:
        dst.set_exception(src.exception())
    else:
        dst.set_result(src.result())


def compile_stream(spec: KernelSpec, target: GPUTarget, candidates: list[Candidate], load=None, store=None,
                   max_workers: int | None = None, key=None, wait_for_server: bool = False,
                   order: int | None = None) -> Iterator[Candidate]:
    """Compiles the candidates that `load` does not find and yields every
    candidate as soon as it has its binary or its error, so that tuning can
    start on the first. With the compile server (compile_pool), each candidate
    compiles in a worker process, front end included, from the kernel's
    portable recipe (compile.recipe); a kernel without one has its front end
    here, one candidate after another on a thread, and each candidate's back
    end in a worker as soon as its TTIR is ready (ir_text). c.extra["front_end"]
    says where it ran ("worker" or "here"); max_workers=0 (or LAZYTRITON_COMPILE_WORKERS=0) compiles whole
    candidates on threads of this process. `key(c)` (a compile key) lets
    streams of this process share compiles: a candidate that another stream
    is compiling is waited for, not compiled again. Candidates reached while
    the compile server still starts compile on threads here, unless
    `wait_for_server` (background compiles, which no caller waits for).
    `order` (compile.schedule.next_order(), taken when the compiles were asked
    for) places them in the queue among those of their priority."""
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
    futures: dict[cf.Future, Candidate] = {}
    shared: dict[int, tuple[str, _Inflight]] = {}  # id(c) -> (its key, what other streams wait on)
    promote: list[schedule.Ticket] = []
    if key is not None:
        with _inflight_lock:
            for c in list(todo):
                k = key(c)
                other = _inflight.get(k)
                if other is None:
                    shared[id(c)] = (k, _inflight.setdefault(k, _Inflight(cf.Future())))
                    continue
                if not wait_for_server:
                    if other.ticket is not None:
                        promote.append(other.ticket)
                    else:  # its stream has not made its ticket yet: it promotes the ticket it makes
                        other.urgent = True
                waiting: cf.Future = cf.Future()  # one per candidate: two may wait on one compile
                other.future.add_done_callback(functools.partial(_copy_future, waiting))
                futures[waiting] = c
                c.extra["joined"] = True
                todo.remove(c)
        if futures:
            log.info("kernel %s: %d candidate(s) already compiling in this process: waiting for them", spec.name,
                     len(futures))
        for t in promote:
            schedule.promote(t)
    pool = compile_pool.get_pool() if max_workers is None and todo else None
    if pool is not None:
        try:
            pool.start()  # warming up for the candidates to come, if nothing started it yet
        except OSError as exc:  # no compile server: this process compiles them
            log.warning("kernel %s: the compile server could not start (%s): compiling in this process", spec.name,
                        exc)
            pool = None
    threads = None
    stop = threading.Event()
    if todo and pool is not None:
        where = "front end and back end" if recipe.capture(spec.fn).why_not is None else "front end here, back end"
        log.info("kernel %s: compiling %d candidate(s) for %s: %s in %d worker process(es)%s",
                 spec.name, len(todo), target_label(target), where, min(pool.workers, len(todo)),
                 "" if pool.ready() else " once the compile server is ready (until then: in this process)")
        outer = {id(c): cf.Future() for c in todo}
        futures.update({outer[id(c)]: c for c in todo})
        # Candidates reached while the server still starts compile here, on threads: a cold
        # process's first call does not wait for the server's start-up.
        if not wait_for_server:
            threads = cf.ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1),
                                            thread_name_prefix="lazytriton-compile")
        priority = schedule.BACKGROUND if wait_for_server else schedule.URGENT
        if order is None:
            order = schedule.next_order()
        for rank, c in enumerate(todo):
            opts = c.bound.options
            cost = schedule.compile_cost(c.bound.constexprs, getattr(opts, "num_warps", None))
            ticket = schedule.Ticket(functools.partial(_front_end, spec, target, pool, threads, c, outer[id(c)], stop),
                                     priority, f"{spec.name} {c.label}", (order, rank), cost)
            urgent = False
            if id(c) in shared:
                with _inflight_lock:
                    shared[id(c)][1].ticket = ticket
                    urgent = shared[id(c)][1].urgent
            schedule.submit(ticket)
            if urgent:
                schedule.promote(ticket)
    elif todo:
        log.info("kernel %s: compiling %d candidate(s) for %s in this process", spec.name, len(todo),
                 target_label(target))
        workers = max_workers or min(len(todo), os.cpu_count() or 1)
        threads = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lazytriton-compile")
        futures.update({threads.submit(_compile_here, spec, target, c): c for c in todo})
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
                if _settle(spec, c, fut):  # the worker could not read the job (or a shared compile stopped)
                    c.extra.pop("joined", None)
                    threads = threads or cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazytriton-compile")
                    nf = threads.submit(_compile_here, spec, target, c)
                    futures[nf] = c
                    pending.add(nf)
                    continue
                if c.error:
                    failed.append(c)
                else:
                    _report(spec, c, None if c.extra.get("joined") else store, seen)
                _share(shared.pop(id(c), None), c)
                c.extra["ready_s"] = time.perf_counter() - t0
                yield c
    finally:
        for c in sorted(failed, key=lambda c: c.index):
            _report(spec, c, None, seen)
        stop.set()
        if threads is not None:
            # Not waiting: a back end still running on a thread lost to the server's binary
            # (_FirstBinary) and nothing reads it; its thread ends on its own.
            threads.shutdown(wait=False, cancel_futures=True)
        for item in shared.values():  # stopped early: whoever waits compiles them itself
            _share(item, None)
    if not todo:
        return
    ok = sum(c.binary is not None for c in todo)
    log.info("kernel %s: %d of %d candidate(s) compiled in %.2fs", spec.name, ok, len(todo), time.perf_counter() - t0)


def _share(item: tuple[str, _Inflight] | None, c: Candidate | None) -> None:
    """Settles the future other streams wait on for `c`'s compile key."""
    if item is None:
        return
    k, entry = item
    fut = entry.future
    with _inflight_lock:
        if _inflight.get(k) is entry:
            del _inflight[k]
    if c is None:
        fut.set_exception(compile_pool.WorkerUnavailable("the stream compiling it stopped first"))
    elif c.binary is not None:
        fut.set_result((c.binary, c.compile_s))
    else:
        fut.set_exception(compile_pool.CompileFailed(c.error or "no binary"))


def _front_end(spec: KernelSpec, target: GPUTarget, pool, threads: cf.ThreadPoolExecutor | None, c: Candidate,
               fut: cf.Future, stop: threading.Event, ticket: schedule.Ticket) -> None:
    """One candidate, on the front-end thread (compile.schedule): to the
    compile server as soon as possible, as a portable recipe (compile.recipe:
    the worker runs Triton's front end too) or, for a kernel that has none,
    as the TTIR text of its front end here (ir_text). While the server is not
    ready yet its front end runs here and its back end on `threads` instead
    (None: it queues for the server): a call's own candidates first, ahead of
    those compiled ahead of time, instead of contending for the GIL with them.
    `fut` gets the result."""
    if stop.is_set():  # the caller stopped reading (an error, or it had what it needed)
        fut.cancel()
        return
    here = threads is not None and not pool.ready()
    c.extra["compiled_in"] = "thread" if here else "worker"
    t0 = time.perf_counter()
    b = c.bound
    if not here:
        source = recipe.job_source(spec.fn, b.signature, b.constexprs, b.attrs, b.options.__dict__)
        job = compile_pool.portable_job(source, target) if source is not None else None
        if job is not None:
            c.extra["front_end"] = "worker"
            # front_s: making the job. A job the worker refuses comes back to this function.
            _hand_to(ticket, pool, job, fut, functools.partial(_forward, fut, time.perf_counter() - t0, fn=spec.fn,
                                                               ticket=ticket))
            return
    c.extra["front_end"] = "here"
    try:
        ir = ir_text.front_end(spec.fn, target, b.signature, b.constexprs, b.attrs, b.options.__dict__)
    except Exception as exc:  # CompilationError and the like: Triton's whole message
        fut.set_exception(compile_pool.CompileFailed(reason(exc)))
        return
    c.extra["front_end_s"] = front_s = time.perf_counter() - t0
    job = compile_pool.worker_job(ir, target)  # None: its compile options do not pickle
    if here:
        first = _FirstBinary(fut, front_s, c, stop)
        try:
            threads.submit(_back_end_here, ir, target).add_done_callback(functools.partial(first.settle, "thread"))
        except RuntimeError:  # the stream stopped since (its threads are shut down)
            fut.cancel()
            return
        # The server is often ready before the threads are done (a cold process's first call:
        # on an H200, 0.3 s into 1.2 s of back ends on threads): the same back end goes to it
        # then too, and the first binary is kept; the two are alike (one TTIR, one compiler).
        if job is not None:
            pool.when_ready(functools.partial(first.also, ticket, pool, job))
        return
    if job is None:
        fut.set_exception(compile_pool.WorkerUnavailable("its compile options do not pickle"))
        return
    _hand_to(ticket, pool, job, fut, functools.partial(_forward, fut, front_s))


def _hand_to(ticket: schedule.Ticket, pool, job: dict, fut: cf.Future, done) -> None:
    try:
        job_future = ticket.hand_to(pool, job)
    except OSError as exc:  # the compile server could not be started: this process compiles it
        fut.set_exception(compile_pool.WorkerUnavailable(f"the compile server could not start ({exc})"))
        return
    job_future.add_done_callback(done)


def _forward(outer: cf.Future, front_s: float, inner: cf.Future, fn=None, ticket=None) -> None:
    if inner.cancelled():  # the stream stopped first
        outer.cancel()
        return
    exc = inner.exception()
    if isinstance(exc, compile_pool.RecipeRefused) and ticket is not None:
        # The worker could not rebuild the kernel exactly: from now on its front ends run here,
        # this candidate's too (queued again where it was).
        recipe.refuse(fn, str(exc))
        schedule.resubmit(ticket)
        return
    if exc is not None:
        outer.set_exception(exc)
    else:
        binary, seconds = inner.result()
        outer.set_result((binary, front_s + seconds))


class _FirstBinary:
    """One candidate's back end run two ways (on a thread here, and in the compile server
    once it is ready): `outer` gets the first binary, or an error once every way that
    started has ended (the thread's, which has Triton's message from this process)."""

    def __init__(self, outer: cf.Future, front_s: float, c: Candidate, stop: threading.Event) -> None:
        self.outer, self.front_s, self.c, self.stop = outer, front_s, c, stop
        self.lock = threading.Lock()
        self.running = 1  # the thread's
        self.errors: list[BaseException] = []

    def also(self, ticket: schedule.Ticket, pool, job: dict) -> None:
        with self.lock:
            if self.outer.done() or self.stop.is_set():  # nobody reads it any more
                return
            self.running += 1
        try:
            ticket.hand_to(pool, job).add_done_callback(functools.partial(self.settle, "worker"))
        except OSError as exc:  # the server is gone again: the thread's result stands
            self.settle("worker", None, exc)

    def settle(self, where: str, inner: cf.Future | None, error: BaseException | None = None) -> None:
        with self.lock:
            self.running -= 1
            if self.outer.done():
                return
            if inner is not None and inner.cancelled():  # the stream stopped first
                if not self.running:
                    self.outer.cancel()
                return
            error = error if inner is None else inner.exception()
            if error is None:
                binary, seconds = inner.result()
                self.c.extra["compiled_in"] = where
                self.outer.set_result((binary, self.front_s + seconds))
                return
            if where == "thread":
                self.errors.insert(0, error)
            else:
                self.errors.append(error)
            if not self.running:
                self.outer.set_exception(self.errors[0])


def _back_end_here(ir: dict, target: GPUTarget):
    t0 = time.perf_counter()
    return ir_text.compile_text(ir, target), time.perf_counter() - t0


def _compile_here(spec: KernelSpec, target: GPUTarget, c: Candidate):
    t0 = time.perf_counter()
    return compile_one(spec, target, c.bound), time.perf_counter() - t0


def _settle(spec: KernelSpec, c: Candidate, fut: cf.Future) -> bool:
    """Records a finished compile on `c`; True: compile it in this process instead."""
    try:
        c.binary, c.compile_s = fut.result()
    except compile_pool.WorkerUnavailable as exc:
        log.info("kernel %s: %s: %s; compiling it in this process", spec.name, c.label, exc)
        return True
    except (compile_pool.WorkerCrashed, compile_pool.CompileFailed) as exc:
        c.error = str(exc)
    except Exception as exc:  # OutOfResources, PTXASError, CompilationError, ...
        c.error = reason(exc)
    return False


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
    alike, else per candidate."""

    def __init__(self, kernel: str, candidates: list[Candidate]):
        errors = [c.error or "no binary" for c in candidates]
        if len(candidates) > 1 and len(set(errors)) == 1:
            lines = [f"kernel {kernel}: every candidate config ({len(candidates)}) failed with:", errors[0]]
        else:
            lines = [f"kernel {kernel}: every candidate config failed:"]
            lines += [f"  {c.label}: " + e.replace("\n", "\n    ") for c, e in zip(candidates, errors)]
        super().__init__("\n".join(lines))
        self.candidates = candidates
