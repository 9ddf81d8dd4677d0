"""Online tuning: the first call of a specialization waits for one compile, not for the tuning;
the tuning is spread over the calls that follow (`lazytriton.kernel(fn, tuning="online")`,
LAZYTRITON_TUNING=online).

- **First call**: every candidate is queued to compile as on a first call that tunes, in the
  order of the evidence there is: the configs' times measured on this kernel's other
  specializations (cache/measurements.py `evidence`), the likeliest winner first; without any,
  the quickest compile first (compile.schedule.compile_cost, lowest first). Those in the cache
  are ready at once. The first candidate ready is launched on the caller's data: no trial, no
  snapshot. The others compile on.
- **The calls that follow** (same specialization): each launches one candidate that still needs
  samples, timed by two CUDA events around that launch on the call's stream (_core.LaunchTimer:
  armed for the call, recorded by the launch core right around the driver's launch, after a write
  of the L2-flush buffer that keeps the GPU busy meanwhile, so that they time the kernel, not the
  host); the events are read on later calls, never waited for. The candidate
  with the fewest samples goes next (the earlier in the queue on a tie), so their launches
  interleave round by round and clock drift hits them alike. A candidate that fails to launch
  is dropped, said once, and the call launches another.
- **The decision**: once every candidate that compiled has `TuneOptions.online_samples` samples,
  the lowest median wins; it is persisted as a tuned winner with each candidate's median (the
  tuning record; the samples in a measurements document of their own), and installed: later
  calls launch it through the C++ fast path, as any tuned winner. Samples are persisted as they
  are read (at most every PERSIST_EVERY_S, and at exit), so a process that restarts continues
  where the last one stopped.
- **While the stream is captured** (a CUDA graph), the best candidate so far (the first ready
  if none was timed yet) is launched untimed: the graph keeps it; tuning goes on with the calls
  that are not captured.
- **Many processes** (lazytriton.distributed): each tunes on its own calls; the first decision
  published is the one every process launches (Agreement.decide).

Each call's result is one complete launch of one compiled candidate on the caller's data, so
in-place kernels and reset_to_zero need nothing saved or zeroed.
"""
from __future__ import annotations

import atexit
import logging
import statistics
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from .. import _core
from ..cache import keys, measurements
from ..compile import schedule
from ..compile.compiler import AllCandidatesFailed, Candidate
from ..model.spec import as_read_now

log = logging.getLogger("lazytriton")


class Resolving(Protocol):
    """What a session reads of the resolution that started it (runtime.resolve.Resolution)."""

    k: Any
    key: tuple
    spec: Any
    device: int
    dev: dict
    target: Any
    shape_sig: dict
    options: dict
    portable_key: tuple

    def family(self) -> str: ...

    def compile_key(self, c: Candidate) -> str: ...

    def load_cached(self, cache: Any, cands: list) -> list: ...

    def compile_candidates(self, cache: Any, cands: list, background: bool = False, order: int | None = None,
                           in_order: bool = False, fn: Any = None) -> Iterator[Candidate]: ...

    def entry_of(self, c: Candidate) -> Any: ...

    def store_record(self, cache: Any, tkey: str, cands: list, winner: Candidate, times: dict,
                     notes: dict, agreed=None, untuned: bool = False, extra: dict | None = None) -> Any: ...


@dataclass
class Arm:
    """One candidate of a session."""

    cand: Candidate
    place: int  # its place in the queue: the rotation's order on a tie
    samples: list = field(default_factory=list)  # milliseconds, read
    pending: list = field(default_factory=list)  # LaunchTimers of launches not read yet
    entry: Any = None  # its _core.Entry, made on its first launch (in the caller's context)
    table: Any = None  # a _core.ResolveTable holding only it: what the Python stubs launch it from
    dropped: str | None = None

    @property
    def label(self) -> str:
        return self.cand.label

    def count(self) -> int:
        return len(self.samples) + len(self.pending)

    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


@dataclass
class Pick:
    """A call's answer: launch `arm` (timed by `timer`, or untimed), or the session is over and
    `winner` (a _core.Entry) is the specialization's winner from now on."""

    arm: Arm | None = None
    timer: Any = None
    winner: Any = None


PERSIST_EVERY_S = 0.25  # samples read are written at most this often (and at exit, and at the decision)

_stats = {"sessions": 0, "timed_launches": 0, "untimed_launches": 0, "dropped": 0, "settled": 0}
_history: list[dict] = []


def counters() -> dict:
    """This process's online tuning: sessions started and settled, launches timed and untimed
    (a first call's, while waiting for events, under capture), candidates dropped."""
    return dict(_stats)


def history() -> list[dict]:
    """Per settled session: kernel, calls (the first one included), samples per candidate,
    winner (config index), medians by config index, started/settled (perf_counter). For benchmarks."""
    return list(_history)


def queue_order(cands: list[Candidate], evidence: dict[str, float]) -> list[Candidate]:
    """The order the candidates compile in: the likeliest winner first where other specializations
    of the kernel were measured (`evidence`: a config's time over the best, per config id), the
    configs never measured after them; the quickest compile first among those evidence does not rank."""
    def cost(c: Candidate) -> float:
        return schedule.compile_cost(c.bound.constexprs, getattr(c.bound.options, "num_warps", None))

    def rank(c: Candidate) -> tuple:
        seen = evidence.get(measurements.config_id(c.config))
        return (seen is None, seen if seen is not None else 0.0, cost(c), c.index)

    return sorted(cands, key=rank)


class Session:
    """One specialization tuned online: its candidates, their samples, the decision."""

    def __init__(self, res: Resolving, cache: Any, tkey: str, cands: list[Candidate], pruned: list[Candidate],
                 samples: int, fresh: bool = False, agreement: Any = None):
        _stats["sessions"] += 1
        self.res, self.cache, self.tkey, self.cands, self.samples = res, cache, tkey, cands, samples
        self.agreement = agreement
        self.name = res.k.name
        self.calls = 0
        self.started = time.perf_counter()
        self._cv = threading.Condition()
        self._arms: list[Arm] = []
        self._compiled = False  # every candidate compiled (or failed)
        self._compile_error: BaseException | None = None
        self._settled: Any = None  # the winner's Entry once decided
        self._seen: list[Candidate] = []
        self._persisted_at = 0.0  # perf_counter() of the last write of the samples
        self._unsaved = False  # samples read since
        _live.add(self)
        dev = res.dev
        # The samples' own document: an online sample is one launch among the program's work (after an
        # L2 flush, no warm-up, no repetitions), not comparable with a first call's trials.
        self.mkey = measurements.measure_key(res.spec.fn, res.shape_sig, res.options, res.target, dev["name"],
                                             res.portable_key, dev["driver_version"], {"online_samples": samples})
        self.family = res.family()
        ids = [measurements.config_id(c.config) for c in pruned]
        self._prior = {} if fresh else {
            cid: [float(v) for v in r.get("samples", []) if isinstance(v, (int, float)) and v > 0]
            for cid, r in measurements.lookup(cache, self.mkey, self.name, ids).items()}
        if any(self._prior.values()):
            log.info("kernel %s: online tuning continues from %d sample(s) persisted before", self.name,
                     sum(map(len, self._prior.values())))
        evidence = measurements.evidence(cache, self.family, self.name)
        ordered = queue_order(pruned, evidence)
        log.info("kernel %s: online tuning of %d candidate(s): the first call launches the first compiled (%s first)",
                 self.name, len(ordered), "the likeliest winner on other specializations" if evidence
                 else "the quickest compile")
        self._places = {id(c): i for i, c in enumerate(ordered)}
        # Those the cache holds are ready before the first call picks: which call launches what
        # does not depend on how soon a thread loads them.
        for c in res.load_cached(cache, ordered):
            self._arrive(c)
        todo = [c for c in ordered if c.binary is None]
        if not todo:
            self._compiled = True
            return
        # The first in the queue compiles alone: the others, compiled beside it, would slow it down
        # (the first call waits for it); they start once it is ready (or failed). Both streams
        # are made now: their keys and front ends read the kernel as it is at this call, one
        # reading for both.
        now = as_read_now(res.spec.fn)
        ready = res.compile_candidates(cache, todo[:1], in_order=True, fn=now)
        rest = res.compile_candidates(cache, todo[1:], in_order=True, fn=now) if len(todo) > 1 else iter(())
        threading.Thread(target=self._arrivals, args=(ready, rest), name=f"lazytriton-online-{self.name}",
                         daemon=True).start()

    # -- candidates as they compile -----------------------------------------------------------

    def _arrivals(self, ready: Iterator[Candidate], rest: Iterator[Candidate]) -> None:
        try:
            for stream in (ready, rest):  # the rest's compiles are queued once the first is ready
                for c in stream:
                    self._arrive(c)
        except BaseException as exc:  # noqa: BLE001  (said by the call that finds no candidate)
            self._compile_error = exc
        finally:
            with self._cv:
                self._compiled = True
                self._cv.notify_all()

    def _arrive(self, c: Candidate) -> None:
        """A candidate compiled (or failed): it joins the rotation if it fits the device."""
        with self._cv:
            self._seen.append(c)
            if c.binary is not None:
                why = _core.check_fits(c.binary.metadata, self.res.device)
                if why:
                    c.error = f"does not fit the device: {why}"
                    log.warning("kernel %s: %s skipped: %s", self.name, c.label, c.error)
                else:
                    prior = self._prior.get(measurements.config_id(c.config), [])
                    self._arms.append(Arm(c, self._places[id(c)], samples=list(prior)))
            self._cv.notify_all()

    @property
    def compiling(self) -> bool:
        """Whether candidates are still compiling."""
        return not self._compiled

    def _live(self) -> list[Arm]:
        return [a for a in self._arms if a.dropped is None]

    def _wait_for_one(self) -> list[Arm]:
        """The live candidates, waiting for a first one to compile; AllCandidatesFailed if none can."""
        while not self._live():
            if self._compiled:
                if self._compile_error is not None and not self._arms:
                    raise self._compile_error
                raise AllCandidatesFailed(self.name, self._seen or self.cands)
            self._cv.wait()
        return self._live()

    # -- each call -------------------------------------------------------------------------

    def pick(self, first: bool = False, capturing: bool = False) -> Pick:
        """What this call launches. `first`: the session's first call (the first candidate
        ready, untimed); `capturing`: the call's stream is being captured (the best so far, untimed)."""
        with self._cv:
            if self._settled is not None:
                return Pick(winner=self._settled)
            self.calls += 1
            if not first:
                self._read()
            while True:
                live = self._wait_for_one()
                if first:  # the first ready: arms are in the order they compiled
                    arm, timed = live[0], False
                elif capturing:
                    arm, timed = self._best(live), False
                elif self._compiled and all(len(a.samples) >= self.samples for a in live):
                    return Pick(winner=self._decide(live))
                else:
                    needy = [a for a in live if a.count() < self.samples]
                    # None needy: every launch needed is made, their events not passed yet.
                    arm, timed = (min(needy, key=lambda a: (a.count(), a.place)), True) if needy else \
                        (self._best(live), False)
                if self._ready(arm):
                    break
            if not timed:
                _stats["untimed_launches"] += 1
                return Pick(arm)
            timer = _core.LaunchTimer()
            arm.pending.append(timer)
            _stats["timed_launches"] += 1
            return Pick(arm, timer)

    def _ready(self, arm: Arm) -> bool:
        """Makes the candidate's entry (its module loaded in this call's context); False: it
        could not be (dropped)."""
        if arm.entry is None:
            try:
                arm.entry = self.res.entry_of(arm.cand)
            except _core.RuntimeFailure as exc:
                self._drop(arm, str(exc))
                return False
            arm.table = _core.ResolveTable(self.name)
            arm.table.install(list(self.res.key), arm.entry)
        return True

    def _best(self, live: list[Arm]) -> Arm:
        timed = [a for a in live if a.samples]
        if timed:
            return min(timed, key=lambda a: (a.median(), a.cand.index))
        return min(live, key=lambda a: a.place)

    def failed(self, pick: Pick, exc: BaseException) -> None:
        """This call's candidate did not launch: it is dropped (said once); the caller picks again."""
        with self._cv:
            if pick.timer is not None and pick.timer in pick.arm.pending:
                pick.arm.pending.remove(pick.timer)
            self._drop(pick.arm, str(exc))

    def _drop(self, arm: Arm, why: str) -> None:
        if arm.dropped is not None:
            return
        arm.dropped = why
        arm.cand.error = arm.cand.error or f"failed to launch: {why}"
        _stats["dropped"] += 1
        log.warning("kernel %s: %s failed to launch (%s); dropped from online tuning, the call launches another",
                    self.name, arm.label, why)

    def _read(self) -> None:
        """Reads the events the GPU has passed; persists the new samples."""
        new = False
        for arm in self._arms:
            for timer in list(arm.pending):
                if timer.failure is not None:  # its launch failed in C++ (the JAX handler's call site)
                    arm.pending.remove(timer)
                    self._drop(arm, timer.failure)
                    continue
                if timer.done and not timer.launched:  # its call launched nothing (an empty grid)
                    arm.pending.remove(timer)
                    continue
                ms = timer.elapsed_ms()
                if ms is None:
                    continue
                arm.pending.remove(timer)
                if arm.dropped is None:
                    arm.samples.append(float(ms))
                    new = True
        if new:
            self._unsaved = True
            if time.perf_counter() - self._persisted_at >= PERSIST_EVERY_S:
                self._persist_samples()

    def persist_unsaved(self) -> None:
        """Writes the samples read since the last write (at exit: a restart continues from them)."""
        with self._cv:
            if self._unsaved and self._settled is None:
                self._persist_samples()

    def _persist_samples(self) -> None:
        self._persisted_at, self._unsaved = time.perf_counter(), False
        measurements.record(self.cache, self.mkey, self.name, {
            measurements.config_id(a.cand.config): {
                "config": keys.config_parts(a.cand.config) if a.cand.config is not None else {},
                "time_ms": a.median(), "samples": list(a.samples), "compile_key": self.res.compile_key(a.cand)}
            for a in self._arms if a.samples}, family=self.family, publish=False)

    # -- the decision -------------------------------------------------------------------------

    def _decide(self, live: list[Arm]) -> Any:
        winner = min(live, key=lambda a: (a.median(), a.cand.index))
        medians = {a.cand.index: a.median() for a in live}
        log.info("kernel %s: online tuning settled after %d calls: winner %s at %.4f ms (medians of %d: %s)",
                 self.name, self.calls, winner.label, medians[winner.cand.index], self.samples,
                 ", ".join(f"{i}: {m:.4f}" for i, m in sorted(medians.items())))
        if self.agreement is not None:
            entry = self._agree(winner, medians)
        else:
            entry = self._store(winner, medians)
        self._settled = entry
        _live.discard(self)
        self._arms = []  # the candidates' modules and tables go (the winner's stays loaded)
        _stats["settled"] += 1
        _history.append({"kernel": self.name, "calls": self.calls, "winner": winner.cand.index,
                         "medians": medians, "samples": self.samples, "started": self.started,
                         "settled": time.perf_counter()})
        return entry

    def _store(self, winner: Arm, medians: dict, agreed=None) -> Any:
        self._persist_samples()
        with self.cache.lock(self.tkey):
            self.res.store_record(self.cache, self.tkey, self.cands, winner.cand, medians,
                                  {a.cand.index: {"online_samples": len(a.samples)} for a in self._arms},
                                  agreed=agreed, extra={"online": True})
        return self._settled_entry(winner.cand)

    def _settled_entry(self, c: Candidate) -> Any:
        return self.res.entry_of(c)

    def _agree(self, winner: Arm, medians: dict) -> Any:
        """Publishes this decision unless another process published one first; launches the job's."""
        from ..cache import encode_binary

        entry = self._store(winner, medians)
        rec = self.res.record
        binary = encode_binary(rec.winner, winner.cand.binary)
        return self.agreement.decide(self.name, self.tkey, (entry, rec.to_dict(), binary), self._adopt)

    def _adopt(self, rec: dict, origin: dict, binary: bytes | None) -> Any:
        """Another process decided first: its winner, compiled here if it is not among ours."""
        from ..cache import BadEntry, decode_binary

        index = rec["winner_index"]
        c = next(c for c in self.cands if c.index == index)
        if c.binary is None and binary is not None and self.res.compile_key(c) == rec.get("winner"):
            try:
                self.cache.store_binary(rec["winner"], decode_binary(rec["winner"], binary))
            except BadEntry as exc:
                log.warning("kernel %s: the winner's binary from rank %s is unusable (%s); compiling it here",
                            self.name, origin.get("rank"), exc)
        if c.binary is None:
            for _ in self.res.compile_candidates(self.cache, [c]):
                pass
            if c.binary is None:
                raise AllCandidatesFailed(self.name, [c])
        times = {n: line.get("time_ms") for n, line in enumerate(rec.get("candidates") or [])}  # in config order
        with self.cache.lock(self.tkey):
            self.res.store_record(self.cache, self.tkey, self.cands, c, times, {},
                                  agreed=(rec, origin), extra={"online": True})
        log.info("kernel %s: rank %s decided first: this process launches its winner, config %d", self.name,
                 origin.get("rank"), index)
        return self._settled_entry(c)


_live: "weakref.WeakSet[Session]" = weakref.WeakSet()  # sessions still deciding


@atexit.register
def persist_live() -> None:
    """Writes every deciding session's unsaved samples: at exit, and after each call of C++ lazy
    mode (its embedded interpreter is never finalized, so atexit never runs there)."""
    for session in list(_live):
        try:
            session.persist_unsaved()
        except Exception as exc:  # noqa: BLE001  (an exit is no place to fail: said, not raised)
            log.warning("kernel %s: online tuning's last samples were not persisted: %s", session.name, exc)
