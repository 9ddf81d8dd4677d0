"""Autotuning on the caller's real buffers. Every trial starts from the
original data: buffers the kernel may write are snapshotted once and restored
before each trial, reset_to_zero buffers are zeroed; after tuning the buffers
are restored (and zeroed) once more, so the caller's result is exactly one
launch of the winner on the original data. A candidate whose binary was never
launched before is first launched once in a helper process, on copies of what
its trial would read (runtime/isolation.py): one that faults or hangs there is
never launched here."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .. import _core
from .. import settings
from ..compile.compiler import AllCandidatesFailed, Candidate
from ..cache import CompiledBinary
from ..model.ir_analysis import written_pointer_args
from . import fixed

log = logging.getLogger("lazytriton.runtime.tuner")


@dataclass
class TuneOptions:
    """How a kernel's candidates are timed on the first call of a specialization
    (`lazytriton.kernel(fn, tune_options=TuneOptions(target_ms=10))`).

    First pass, per candidate: `warmup` untimed launches, then timed launches for
    about `target_ms` milliseconds (at least `min_reps`, at most `max_reps`), the
    L2 cache flushed before each when `flush_l2` says so (None: when the call's
    buffers fit in L2; LAZYTRITON_FLUSH_L2 sets the default). Second pass: the
    candidates within `retime_within` (a fraction) of the best, at most
    `retime_top` of them, timed again with their launches interleaved, about
    `retime_target_ms` each (at most `retime_max_reps` launches). The values are
    checked when the options are made and when a kernel takes them. Online tuning
    (`tuning="online"`) times each candidate on `online_samples` calls of the program
    instead, and takes the median."""
    warmup: int = 2
    target_ms: float = 25.0  # timed budget per candidate in the first pass
    min_reps: int = 5
    max_reps: int = 100
    # None: flush L2 before every timed launch when the call's buffers fit in
    # L2 (else a trial would time cache hits left by the previous one);
    # LAZYTRITON_FLUSH_L2=0/1 forces it.
    flush_l2: bool | None = dataclasses.field(default_factory=settings.flush_l2)
    # Second pass: the candidates within `retime_within` of the first pass's
    # best (at most `retime_top`) are timed again against each other, their
    # launches interleaved one by one, so that clock and power drift (a GPU at
    # its power cap moves its clocks by 10-20% within a second) hit them
    # alike: `retime_target_ms` of launches each, at most `retime_max_reps`.
    retime_within: float = 0.15
    retime_top: int = 4
    retime_target_ms: float = 20.0
    retime_max_reps: int = 200
    # Online tuning (lazytriton.kernel(fn, tuning="online")): timed launches per candidate,
    # each on a call of the program; the median of these decides.
    online_samples: int = 5

    def __post_init__(self):
        self._check("TuneOptions")

    @classmethod
    def given(cls, options: Any, what: str) -> "TuneOptions":
        """The options a kernel was given (None: the defaults), checked; `what` names the kernel."""
        if options is None:
            return cls()
        if not isinstance(options, cls):
            raise TypeError(f"{what}: tune_options takes a lazytriton.TuneOptions (TuneOptions(target_ms=10)), "
                            f"got {type(options).__name__} {options!r}")
        options._check(f"{what}: tune_options")  # again: a field may have been set since
        return options

    def _check(self, what: str) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "flush_l2":
                ok = v is None or isinstance(v, bool)
                takes = "True, False or None (auto)"
            elif f.name in _INT_FIELDS:
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= _INT_FIELDS[f.name]
                takes = f"an int >= {_INT_FIELDS[f.name]}"
            elif f.name.endswith("_ms"):  # no time to time in is no timing
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v != float("inf")
                takes = "a number > 0 (milliseconds)"
            else:  # retime_within: a fraction of the best time
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                takes = "a fraction from 0 to 1 (0.15: within 15% of the best)"
            if not ok:
                raise (TypeError if not isinstance(v, (int, float)) or isinstance(v, bool) else ValueError)(
                    f"{what}: {f.name}={v!r}: {f.name} takes {takes}")
        if self.min_reps > self.max_reps:
            raise ValueError(f"{what}: min_reps={self.min_reps} is more than max_reps={self.max_reps}")

    def as_dict(self, flush_l2: bool | None = None) -> dict:
        flush = self.flush_l2 if flush_l2 is None else flush_l2
        return dict(warmup=self.warmup, target_ms=self.target_ms, min_reps=self.min_reps,
                    max_reps=self.max_reps, flush_l2=bool(flush))


# TuneOptions' int fields and the least value each takes.
_INT_FIELDS = {"warmup": 0, "min_reps": 1, "max_reps": 1, "retime_top": 1, "retime_max_reps": 1, "online_samples": 1}


def trial_entry(kernel_name: str, c: Candidate, names: list[str], values: tuple, arrays: dict, table: list,
                grid: Any) -> tuple[Any, list[int]]:
    """A candidate's launch in its trials, made as the JAX call site makes a winner's
    (runtime.fixed): its _core.Entry, and the call's buffer addresses it reads (each array
    or descriptor leaf's, in leaf order). `table`: the call's slot table row per leaf."""
    return fixed.entry(f"kernel {kernel_name}", _loaded(c), c.bound.is_param(names), c.extra.get("meta") or {},
                       grid, table, names, values, {n: arrays[n][0] for n in names if n in arrays})


def writes(binary: CompiledBinary, bound: Any, names: list[str]) -> list[str]:
    """The parameters (of the call's leaf `names`) a binary may write, from its TTIR; every
    runtime parameter where the TTIR is not understood. Kept on the binary, so that it is read
    once: when the binary is stored (resolve), or here for one stored without it."""
    if binary.written is None:
        sig = bound.flat_signature
        runtime = [n for n in names if sig.get(n, "constexpr") != "constexpr"]
        written = written_pointer_args(binary.ttir, runtime) if binary.ttir else None
        binary.written = sorted(written) if written is not None else runtime
    return binary.written


def written_buffers(candidates: list[Candidate], names: list[str], arrays: dict, restore_value: list[str]) -> list[str]:
    """Pointer arguments any candidate may write (from its TTIR), plus restore_value."""
    out = set(restore_value)
    for c in candidates:
        out |= set(writes(c.binary, c.bound, names))
    return sorted(n for n in out if n in arrays and arrays[n][1] != 0)  # an empty buffer: nothing to save


def _buffers(arrays: dict, names) -> list[tuple[int, int]]:
    """(address, bytes) for the C++ snapshot and zeroing: 0 bytes there means unknown
    (up to the end of the allocation); a buffer known to be empty is left out (its
    address may be no allocation at all: XLA's zero-size buffers)."""
    return [(arrays[n][0], arrays[n][1] or 0) for n in names if n in arrays and arrays[n][1] != 0]


class _Saved:
    """The snapshot of the buffers the candidates timed so far may write,
    grown as candidates arrive (tuning starts before every candidate is
    compiled). A buffer first needed by a later candidate was written by no
    earlier trial (their TTIR says so), so it still holds the caller's data:
    the current snapshot is restored, then one snapshot of the larger set is
    taken. reset_to_zero buffers are zeroed around every trial anyway."""

    def __init__(self, kernel_name: str, names: list[str], arrays: dict, restore_value: list[str],
                 scratch: frozenset, stream: int):
        self.kernel_name, self.names, self.arrays = kernel_name, names, arrays
        self.restore_value, self.scratch, self.stream = restore_value, scratch, stream
        self.names_saved: list[str] = []
        self.snapshot = None
        self.covered: set[int] = set()  # id() of the candidates covered (its isolated launch, then its trial)

    def cover(self, c: Candidate) -> None:
        if id(c) in self.covered:  # its TTIR read once: the saved set only grows
            return
        self.covered.add(id(c))
        need = [n for n in written_buffers([c], self.names, self.arrays, self.restore_value) if n not in self.scratch]
        more = [n for n in need if n not in self.names_saved]
        if not more:
            return
        if self.snapshot is not None:
            self.snapshot.restore(self.stream)  # every saved buffer back to the caller's data first
        self.names_saved = sorted(set(self.names_saved) | set(more))
        log.info("kernel %s: saving %s for the trials%s", self.kernel_name, ", ".join(self.names_saved),
                 f" ({c.label} writes {', '.join(more)})" if self.snapshot is not None else "")
        self.snapshot = _core.Snapshot(self.stream, _buffers(self.arrays, self.names_saved))
        if self.snapshot.host_bytes:
            log.info("kernel %s: device memory is short: %d bytes of the snapshot are in pinned host memory",
                     self.kernel_name, self.snapshot.host_bytes)


def tune(kernel_name: str, candidates: Iterable[Candidate], names: list[str], values: tuple, arrays: dict,
         table: list, grid_of: Callable[[Candidate], Any], stream: int, device: int, reset_to_zero: list[str],
         restore_value: list[str], options: TuneOptions, scratch: frozenset = frozenset(),
         time_alone: bool = False, isolation: Any = None) -> Candidate:
    """Times every compiled candidate on the real arguments; returns the fastest.
    `candidates` may be a stream (compiler.compile_stream): trials start as soon
    as two candidates are ready, while the others still compile. A lone
    candidate that compiles is never timed, unless `time_alone` (its time is
    compared with times measured before: lazytriton.cache.measurements).
    With `isolation` (runtime.isolation.Isolation), a candidate whose binary was
    never launched before is launched first in a helper process, on copies of
    exactly what its trial would read; one that faults or hangs there is never
    launched here (it gets its error, as a candidate that does not compile)."""
    options = TuneOptions.given(options, f"kernel {kernel_name}")  # k.tune_options may be set after wrapping
    seen: list[Candidate] = []
    ok: list[Candidate] = []
    zero = _buffers(arrays, reset_to_zero)
    saved = _Saved(kernel_name, names, arrays, restore_value, scratch, stream)
    resolved: list[TuneOptions] = []  # decided at the first trial (none: no device query)

    spent = [0.0]  # seconds in trials, re-timing and the last restore: the tune itself, not the compiles between

    def trial(c: Candidate) -> None:
        t0 = time.perf_counter()
        saved.cover(c)  # the snapshot first: it is needed, the flush buffer is not
        if not resolved:
            resolved.append(_resolved_options(kernel_name, options, arrays, device))
        _time_one(kernel_name, c, names, values, arrays, table, grid_of(c), stream, saved.snapshot, zero,
                  resolved[0])
        spent[0] += time.perf_counter() - t0

    def isolated_first_launch(c: Candidate) -> bool:
        if isolation is None:
            return True
        saved.cover(c)  # its written buffers saved before anything it could write is read back

        def prepare() -> None:  # what its trial would start from
            if saved.snapshot is not None:
                saved.snapshot.restore(stream)
            for ptr, nbytes in zero:
                _core.zero(stream, ptr, nbytes)

        return isolation.first_launch(c, names, values, arrays, table, grid_of(c), stream, prepare)

    try:
        for c in candidates:
            seen.append(c)
            if c.binary is None:
                continue
            why = _core.check_fits(c.binary.metadata, device)
            if why:
                c.error = f"does not fit the device: {why}"
                log.warning("kernel %s: %s skipped: %s", kernel_name, c.label, c.error)
                continue
            if not isolated_first_launch(c):
                continue
            ok.append(c)
            if len(ok) == 2 and not time_alone:
                log.info("kernel %s: tuning on the call's buffers, starting as candidates compile", kernel_name)
                trial(ok[0])
            if len(ok) >= 2 or time_alone:
                trial(c)
        if len(ok) > 1:
            t0 = time.perf_counter()
            _retime(kernel_name, [c for c in ok if c.error is None], names, values, arrays, table, grid_of,
                    stream, saved, zero, resolved[0])
            spent[0] += time.perf_counter() - t0
    except BaseException:
        # A faulted trial leaves a broken context: restoring fails too, and
        # must not hide which config broke it.
        try:
            _finish(saved.snapshot, zero, stream)
        except _core.RuntimeFailure as exc:
            log.warning("kernel %s: buffers not restored after the failed trial: %s", kernel_name, exc)
        saved.snapshot = None
        raise
    else:
        t0 = time.perf_counter()
        _finish(saved.snapshot, zero, stream)
        spent[0] += time.perf_counter() - t0
    finally:
        saved.snapshot = None  # frees the copies after the queued restore has run
        for c in seen:  # the trials' modules (the winner is launched from its own)
            c.extra.pop("loaded", None)
    if not ok:
        raise AllCandidatesFailed(kernel_name, seen)
    if len(ok) == 1 and not time_alone:
        return ok[0]
    timed = [c for c in ok if c.error is None]
    if not timed:
        raise AllCandidatesFailed(kernel_name, seen)
    best = min(timed, key=lambda c: (c.extra["time_ms"], c.index))  # a tie: the earlier config, whatever compiled first
    best.extra["tune_s"] = spent[0]
    log.info("kernel %s: winner %s at %.4f ms (%s)", kernel_name, best.label, best.extra["time_ms"],
             ", ".join(f"{c.index}: {c.extra['time_ms']:.4f}" for c in sorted(timed, key=lambda c: c.index)))
    return best


def _time_one(kernel_name, c, names, values, arrays, table, grid, stream, snapshot, zero, options) -> None:
    try:
        entry, buffers = trial_entry(kernel_name, c, names, values, arrays, table, grid)
        r = _core.bench(entry, stream, buffers, snapshot, zero, options.as_dict())
    except _core.RuntimeFailure as exc:
        # Load-time refusals (resources) are per-candidate; a failed launch
        # (e.g. an illegal address) poisons the context and must surface.
        if "cuLaunchKernelEx" in str(exc) or "cuEventSynchronize" in str(exc):
            # Nothing is recorded: the caller sees which config broke the context.
            raise _core.RuntimeFailure(f"kernel {kernel_name}: {c.label} failed in a tuning trial on the call's "
                                       f"buffers, nothing was persisted: {exc}") from exc
        c.error = str(exc)
        log.warning("kernel %s: %s skipped: %s", kernel_name, c.label, c.error)
        return
    c.extra.update(time_ms=r["median_ms"], min_ms=r["min_ms"], reps=r["reps"])
    log.info("kernel %s: %s: %.4f ms (median of %d)", kernel_name, c.label, r["median_ms"], r["reps"])


def _resolved_options(kernel_name: str, options: TuneOptions, arrays: dict, device: int) -> TuneOptions:
    """`options` with flush_l2 decided: on when the call's buffers fit in L2,
    and where the device has memory for the flush buffer: tuning degrades (no
    flush, said once per process), it never fails for lack of scratch."""
    global _no_flush_warned
    flush = options.flush_l2
    if flush is None:
        total = sum(nbytes or 0 for _, nbytes in arrays.values())
        try:
            l2 = int(_core.device_info(device).get("l2_bytes", 0))
        except Exception:
            l2 = 0
        flush = bool(l2) and 0 < total <= l2
    if flush and _core.reserve_l2_flush() == 0:
        flush = False
        if not _no_flush_warned:
            _no_flush_warned = True
            log.warning("kernel %s: no device memory for the tuner's L2-flush buffer; tuning without flushing L2 "
                        "between trials (said once per process)", kernel_name)
    return options if flush == options.flush_l2 else dataclasses.replace(options, flush_l2=flush)


_no_flush_warned = False


def _loaded(c: Candidate):
    """The candidate's module, loaded once for all of its trials."""
    k = c.extra.get("loaded")
    if k is None:
        k = _core.Kernel(c.binary.cubin, c.binary.metadata)
        k.load()
        c.extra["loaded"] = k
    return k


def _retime(kernel_name, timed, names, values, arrays, table, grid_of, stream, saved, zero, options) -> None:
    """Times the close contenders again, against each other (see TuneOptions)."""
    if len(timed) < 2 or options.retime_top < 2:
        return
    best = min(c.extra["time_ms"] for c in timed)
    close = sorted((c for c in timed if c.extra["time_ms"] <= best * (1 + options.retime_within)),
                   key=lambda c: c.extra["time_ms"])[:options.retime_top]
    if len(close) < 2:
        return
    opts = dataclasses.replace(options, warmup=1, target_ms=options.retime_target_ms,
                               max_reps=options.retime_max_reps).as_dict()
    try:
        launches = [trial_entry(kernel_name, c, names, values, arrays, table, grid_of(c)) for c in close]
        results = _core.bench_interleaved([e for e, _ in launches], stream, launches[0][1], saved.snapshot, zero,
                                          opts)
    except _core.RuntimeFailure as exc:  # each ran in the first pass: a failure now is the context's
        raise _core.RuntimeFailure(f"kernel {kernel_name}: re-timing {', '.join(c.label for c in close)} on the "
                                   f"call's buffers failed, nothing was persisted: {exc}") from exc
    for c, r in zip(close, results):
        c.extra.update(first_pass_ms=c.extra["time_ms"], time_ms=r["median_ms"], min_ms=r["min_ms"], reps=r["reps"])
    log.info("kernel %s: re-timed %d close candidates, launches interleaved (%d each): %s", kernel_name, len(close),
             results[0]["reps"], ", ".join(f"{c.index}: {c.extra['first_pass_ms']:.4f} -> {c.extra['time_ms']:.4f}"
                                           for c in close))


def _finish(snapshot, zero, stream: int) -> None:
    if snapshot is not None:
        snapshot.restore(stream)
    for ptr, nbytes in zero:
        _core.zero(stream, ptr, nbytes)

