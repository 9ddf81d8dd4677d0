"""Many processes, one answer: the processes of a job agree on every kernel's winner.

Without this, each process of a multi-process job resolves a new kernel
specialization on its own: the first step compiles and tunes N times, and
timing noise can make ranks pick different configs, so data-parallel replicas
run different reduction orders and drift apart numerically.

With a shared key-value store (JAX's coordination service once
`jax.distributed.initialize()` ran with more than one process, or any store
given to `use()`), the first resolution of a tuning key goes through `agree()`.
Two keys per tuning key (kernel source, call specialization, configs, GPU
model, Triton and ptxas versions...), whatever the number of processes:

- ``lazytriton/agree/v2/<key>/claim``: who resolves it. Every process that
  reaches the call tries to add it (an atomic set-if-absent): exactly one wins
  and compiles and tunes as a lone process would. Nobody waits for a process
  that never reaches the kernel: the claimant is one that did.
- ``lazytriton/agree/v2/<key>/winner``: the job's choice, also added
  set-if-absent, so **the first winner published is the one every process
  launches**, whoever published it. It holds the tuning record and the
  winner's compiled binary (when under MAX_BINARY bytes), so a waiting process
  launches it at once: no compile, no trials (see docs/distributed.md for why
  transferring beats compiling while waiting).

The others block in the store's blocking get (in C++, the GIL released; one
request, no polling; nobody reads another process's key) for at most
LAZYTRITON_AGREE_TIMEOUT seconds (default 600). Faults:

- the claimant dies or hangs: after the timeout one waiter takes over (it adds
  ``<claim>/1``, then ``<claim>/2``: TAKEOVERS rounds) and resolves for all;
  after those rounds every waiter resolves on its own and launches the first
  winner published (set-if-absent again), so the job still agrees. A slow
  claimant that finishes after a takeover published launches the published
  winner, not its own;
- the claimant fails (every config failed): it publishes the error and the
  others resolve on their own at once;
- the store fails: this process resolves on its own, with a warning.

A process with a cached winner claims and publishes it at once (its cache is
the persisted choice of an earlier run of the job): a process that arrives
later, say one restarted after preemption with an empty cache, takes it
without waiting and without tuning. A process that reaches the call after the
choice was published (in this job) finds it in the store at once. If two
caches disagree, the first published wins everywhere.

Kernels resolved while a CUDA graph is being captured never wait (they use a
cached winner or fail as without agreement).  LAZYTRITON_AGREE=0 turns it off.

Kernels tuned online (runtime/online.py) claim nothing: each process tunes on its
own calls, and the job agrees when a decision is made (`Agreement.decide`: the
first decision published is every process's); a process whose first call comes
after one was published launches it at once (`Agreement.published`).

Progress is logged on the ``lazytriton.distributed`` logger: who resolves,
who waits for whom, who takes over, where each winner came from.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, TypeVar

from . import settings

log = logging.getLogger("lazytriton.distributed")

TIMEOUT_ENV = "LAZYTRITON_AGREE_TIMEOUT"
DEFAULT_TIMEOUT_S = settings.DEFAULT_AGREE_TIMEOUT_S
PROGRESS_S = 30.0  # a waiter blocks in slices this long and logs between them
TAKEOVERS = 2  # rounds in which one waiter resolves for a claimant that did not publish
MAX_BINARY = 1 << 20  # a larger winner binary is not sent: the waiters compile it (gRPC caps messages at 4 MiB)
PREFIX = "lazytriton/agree/v2/"
PUBLISHED_LOOK_S = 0.001  # how long online tuning's first call looks for a winner the job published

T = TypeVar("T")
# What a resolution gives agree(): (its result, the JSON-able record to publish, the winner's binary or None).
Resolved = tuple[T, dict, Optional[bytes]]


class Store(Protocol):
    """What agreement needs from a key-value store shared by the processes."""

    def add(self, key: str, value: bytes) -> Optional[bytes]:
        """Set ``key`` to ``value`` if it has no value (atomic): None if this
        call set it, else the value already there."""

    def get(self, key: str, timeout_s: float) -> Optional[bytes]:
        """``key``'s value, waiting up to ``timeout_s`` for it to be set; None on timeout."""


class JaxStore:
    """The key-value store of JAX's coordination service (`jax.distributed`)."""

    def __init__(self, client: Any = None):
        if client is None:
            state = _jax_state()
            client = state.client if state is not None else None
            if client is None:
                raise RuntimeError("jax.distributed is not initialized: call jax.distributed.initialize() first")
        self.client = client

    def add(self, key: str, value: bytes) -> Optional[bytes]:
        try:
            self.client.key_value_set_bytes(key, value)  # allow_overwrite=False: refused if the key exists
            return None
        except Exception:
            try:
                return self.client.key_value_try_get_bytes(key)
            except Exception as exc:
                if "NOT_FOUND" in str(exc):  # refused, yet absent: the store failed
                    raise RuntimeError(f"could not add {key} to the key-value store") from None
                raise

    def get(self, key: str, timeout_s: float) -> Optional[bytes]:
        try:
            # Blocks in C++ with the GIL released.
            return self.client.blocking_key_value_get_bytes(key, max(1, int(timeout_s * 1000)))
        except Exception as exc:
            if "DEADLINE_EXCEEDED" in str(exc):
                return None
            raise


@dataclass
class Agreement:
    """How this process agrees with the others: through which store, as which rank."""

    store: Store
    rank: int
    processes: int
    timeout_s: float = DEFAULT_TIMEOUT_S
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    slice_s: float = PROGRESS_S
    takeovers: int = TAKEOVERS

    def resolve(self, kernel: str, key: str, local: Callable[[], Resolved],
                adopt: Callable[[dict, dict, Optional[bytes]], T],
                cached: Optional[Callable[[], Optional[Resolved]]] = None) -> T:
        return agree(self.store, key, kernel, local, adopt, cached=cached, rank=self.rank,
                     timeout_s=self.timeout_s, clock=self.clock, slice_s=self.slice_s, takeovers=self.takeovers)

    # Online tuning (runtime/online.py): no process claims a key; each tunes on its own calls,
    # and the job agrees when a decision is made: the first one published is every process's.

    def published(self, kernel: str, key: str) -> Optional[tuple[dict, dict, Optional[bytes]]]:
        """The winner the job published for ``key`` already, as (record, origin, binary), or None
        (a short look, no waiting: PUBLISHED_LOOK_S)."""
        try:
            value = self.store.get(f"{PREFIX}{key}/winner", PUBLISHED_LOOK_S)
        except Exception as exc:
            _count("store_errors")
            log.warning("kernel %s: the key-value store failed (%s); tuning here, without agreeing with the "
                        "other processes", kernel, exc)
            return None
        if value is None:
            return None
        doc, binary = _decode(value)
        if "record" not in doc:
            return None
        origin = doc.get("by") or {}
        _count("received")
        log.info("kernel %s: rank %d launches config %s, the winner %s published (no tuning here)", kernel,
                 self.rank, doc["record"].get("winner_index"), _peer_name(origin))
        return doc["record"], {k: origin.get(k) for k in ("rank", "host", "pid")}, binary

    def decide(self, kernel: str, key: str, mine: Resolved, adopt: Callable[[dict, dict, Optional[bytes]], T],
               cached: bool = False) -> T:
        """Publishes this process's decision for ``key`` unless another was published first; the
        result to launch: ``mine``'s, or ``adopt(record, origin, binary)`` of the published one."""
        me = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), "thread": threading.get_ident()}
        return _settle(self.store, f"{PREFIX}{key}/winner", kernel, mine, me, adopt, cached=cached)


# -- the protocol ----------------------------------------------------------------------

_stats = {"resolved_here": 0, "received": 0, "published_cached": 0, "superseded": 0, "timeouts": 0,
          "takeovers": 0, "claimant_failed": 0, "store_errors": 0}
_stats_lock = threading.Lock()


def _count(name: str) -> None:
    with _stats_lock:
        _stats[name] += 1


def stats() -> dict:
    """What agreement did in this process: winners resolved here and published
    (resolved_here; published_cached: from this process's cache), winners
    received from another (received; superseded: this process resolved one too,
    but another process published first, the same config or not), waits that timed out (timeouts),
    resolutions for a claimant that did not publish (takeovers), and local
    fallbacks (claimant_failed, store_errors)."""
    with _stats_lock:
        return dict(_stats)


def _peer_name(who: dict) -> str:
    return f"rank {who.get('rank', '?')} ({who.get('host', '?')}, pid {who.get('pid', '?')})"


def _encode(doc: dict, binary: Optional[bytes]) -> bytes:
    # One value: a JSON line (json.dumps escapes newlines), then the binary raw.
    return json.dumps(doc).encode() + b"\n" + (binary or b"")


def _decode(value: bytes) -> tuple[dict, Optional[bytes]]:
    head, _, binary = bytes(value).partition(b"\n")
    return json.loads(head), (binary or None)


def agree(store: Store, key: str, kernel: str, local: Callable[[], Resolved],
          adopt: Callable[[dict, dict, Optional[bytes]], T], *, rank: int,
          cached: Optional[Callable[[], Optional[Resolved]]] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
          clock: Callable[[], float] = time.monotonic, slice_s: float = PROGRESS_S,
          takeovers: int = TAKEOVERS) -> T:
    """Resolve tuning key ``key`` of ``kernel`` once for every process sharing ``store``.

    ``local()`` resolves as a lone process would and returns (result, record,
    binary): record is the JSON-able winner to publish (a TuningRecord's dict,
    with ``winner_index``), binary the winner's compiled binary (bytes) or None.
    ``cached()``, if given, returns the same from this process's cache, or None
    (it must not compile). ``adopt(record, origin, binary)`` launches another
    process's winner (origin: its rank, host, pid). The deadline is measured
    with ``clock`` (a test can pass a fake one); each blocking get lasts at most
    ``slice_s`` real seconds.
    """
    me = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "thread": threading.get_ident()}
    claim_key, winner_key = f"{PREFIX}{key}/claim", f"{PREFIX}{key}/winner"
    hit = cached() if cached is not None else None
    try:
        claimed_by = store.add(claim_key, json.dumps({**me, "cached": hit is not None}).encode())
    except Exception as exc:
        _count("store_errors")
        log.warning("kernel %s: the key-value store failed (%s); resolving here, without agreeing with the "
                    "other processes", kernel, exc)
        return (hit or local())[0]
    if hit is not None:
        log.info("kernel %s: rank %d publishes its cached winner of specialization %s", kernel, rank, key[:16])
        return _settle(store, winner_key, kernel, hit, me, adopt, cached=True)
    if claimed_by is None:
        log.info("kernel %s: rank %d resolves specialization %s for every process", kernel, rank, key[:16])
        return _resolve_for_all(store, winner_key, kernel, local, me, adopt)

    try:
        claimant = json.loads(claimed_by)
    except ValueError:
        claimant = {}
    who = _peer_name(claimant)
    log.info("kernel %s: rank %d waits for %s to resolve specialization %s", kernel, rank, who, key[:16])
    value = None
    try:
        for round_ in range(takeovers + 1):
            value = _wait(store, winner_key, kernel, who, timeout_s, clock, slice_s)
            if value is not None:
                break
            _count("timeouts")
            if round_ == takeovers:
                break
            taker = store.add(f"{claim_key}/{round_ + 1}", json.dumps(me).encode())
            if taker is None:
                _count("takeovers")
                log.warning("kernel %s: no winner from %s after %.0f s (%s): rank %d takes over and resolves it "
                            "for every process", kernel, who, timeout_s, TIMEOUT_ENV, rank)
                return _resolve_for_all(store, winner_key, kernel, local, me, adopt)
            try:
                taken_by = _peer_name(json.loads(taker))
            except ValueError:
                taken_by = "another rank"
            log.warning("kernel %s: no winner from %s after %.0f s (%s); %s took over, waiting for it", kernel, who,
                        timeout_s, TIMEOUT_ENV, taken_by)
            who = taken_by
    except Exception as exc:
        _count("store_errors")
        log.warning("kernel %s: the key-value store failed while waiting for %s (%s); resolving here, "
                    "without agreeing with the other processes", kernel, who, exc)
        return local()[0]
    if value is None:
        log.warning("kernel %s: still no winner after %d takeovers; resolving here: every process launches the "
                    "first winner published", kernel, takeovers)
        return _settle(store, winner_key, kernel, local(), me, adopt)
    return _launch_published(value, kernel, rank, claimant, local, adopt)


def _wait(store: Store, key: str, kernel: str, who: str, timeout_s: float, clock, slice_s: float):
    """``key``'s value within ``timeout_s`` (blocking gets of at most ``slice_s``), or None."""
    start = clock()
    deadline = start + timeout_s
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return None
        value = store.get(key, min(slice_s, remaining))
        if value is not None:
            return value
        log.info("kernel %s: still waiting for %s (%.0f s of %.0f s)", kernel, who, clock() - start, timeout_s)


def _resolve_for_all(store: Store, winner_key: str, kernel: str, local: Callable[[], Resolved], me: dict,
                     adopt) -> Any:
    try:
        mine = local()
    except BaseException as exc:
        _add(store, winner_key, {"error": f"{type(exc).__name__}: {exc}", "by": me}, None, kernel)
        raise
    return _settle(store, winner_key, kernel, mine, me, adopt)


def _settle(store: Store, winner_key: str, kernel: str, mine: Resolved, me: dict, adopt, cached: bool = False):
    """Publish this process's winner unless one was published first; launch the published one."""
    result, record, binary = mine
    if binary is not None and len(binary) > MAX_BINARY:
        binary = None
    published = _add(store, winner_key, {"record": record, "by": me}, binary, kernel)
    if published is None:
        _count("published_cached" if cached else "resolved_here")
        return result
    doc, their_binary = _decode(published)
    theirs = doc.get("record")
    if theirs is None:
        return result  # the first publication was an error: the others resolve on their own too
    _count("superseded")
    if theirs.get("winner_index") == record.get("winner_index"):
        return result  # the same config
    origin = doc.get("by") or {}
    log.info("kernel %s: %s published its winner (config %s) first; rank %d launches it instead of config %s",
             kernel, _peer_name(origin), theirs.get("winner_index"), me["rank"], record.get("winner_index"))
    return adopt(theirs, {k: origin.get(k) for k in ("rank", "host", "pid")}, their_binary)


def _launch_published(value: bytes, kernel: str, rank: int, claimant: dict, local, adopt):
    doc, binary = _decode(value)
    origin = doc.get("by") or claimant
    if "error" in doc:
        _count("claimant_failed")
        log.warning("kernel %s: %s could not resolve it (%s); resolving here", kernel, _peer_name(origin),
                    doc["error"])
        return local()[0]
    record = doc["record"]
    log.info("kernel %s: rank %d launches config %s, the winner of %s (no tuning here%s)", kernel, rank,
             record.get("winner_index"), _peer_name(origin), ", its binary received" if binary else "")
    _count("received")
    return adopt(record, {k: origin.get(k) for k in ("rank", "host", "pid")}, binary)


def _add(store: Store, key: str, doc: dict, binary: Optional[bytes], kernel: str) -> Optional[bytes]:
    try:
        return store.add(key, _encode(doc, binary))
    except Exception as exc:  # waiters then time out and take over
        log.warning("kernel %s: could not publish to the key-value store (%s); the other processes will "
                    "resolve it without this process after %s", kernel, exc, TIMEOUT_ENV)
        return None


# -- which store, if any -----------------------------------------------------------------

_explicit: Optional[Agreement] = None
_jax_stores: dict[int, JaxStore] = {}


def use(store: Optional[Store], *, rank: int = 0, processes: int = 2, timeout_s: Optional[float] = None) -> None:
    """Agree through ``store`` from now on (any object with the methods of
    `Store`), as process ``rank`` of ``processes``; ``use(None)`` goes back to
    the default (JAX's store when jax.distributed runs more than one process).

    For example, over a torch.distributed store (a sketch: torch is not in the tests)::

        class TorchStore:
            def __init__(self, s): self.s = s
            def add(self, k, v):  # values are unique (they name a pid and a thread)
                cur = self.s.compare_set(k, b"", v)
                return None if cur == v else cur
            def get(self, k, t):
                try: self.s.wait([k], datetime.timedelta(seconds=t))
                except Exception: return None  # timed out
                return self.s.get(k)
    """
    global _explicit
    if store is None:
        _explicit = None
        return
    _explicit = Agreement(store, rank, processes,
                          timeout_s=settings.agree_timeout() if timeout_s is None else timeout_s)


def _jax_state():
    # Only if the program imported JAX: importing it here would cost seconds.
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src.distributed import global_state
    except ImportError:
        return None
    return global_state


def agreement() -> Optional[Agreement]:
    """The agreement the runtime uses now, or None: LAZYTRITON_AGREE=0, or a
    single process (no store given to use(), jax.distributed not initialized
    or running one process)."""
    if not settings.agree():
        return None
    if _explicit is not None:
        return _explicit
    state = _jax_state()
    client = getattr(state, "client", None)
    processes = getattr(state, "num_processes", None) or 1
    if client is None or processes <= 1:
        return None
    store = _jax_stores.get(id(client))
    if store is None or store.client is not client:
        store = _jax_stores[id(client)] = JaxStore(client)
    return Agreement(store, int(state.process_id or 0), int(processes),
                     timeout_s=settings.agree_timeout())


def provenance(record: dict, origin: dict, compile_key: str) -> dict:
    """What a record adopted from another process says about its origin."""
    out = {"from_rank": origin.get("rank"), "from_host": origin.get("host"), "from_pid": origin.get("pid"),
           "tuned_on": record.get("created"), "winner_index": record.get("winner_index"),
           "times_ms": [c.get("time_ms") for c in record.get("candidates") or []]}
    if record.get("winner") != compile_key:
        # Same tuning key, different compile key: e.g. other TRITON_* settings there.
        out["their_compile_key"] = record.get("winner")
    return out
