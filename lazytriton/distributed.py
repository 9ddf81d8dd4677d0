"""Many processes, one answer: the processes of a job agree on every kernel's winner.

Without this, each process of a multi-process job resolves a new kernel
specialization on its own: the first step compiles and tunes N times, and
timing noise can make ranks pick different configs, so data-parallel replicas
run different reduction orders and drift apart numerically.

With a shared key-value store (JAX's coordination service once
`jax.distributed.initialize()` ran with more than one process, or any store
given to `use()`), the first resolution of a tuning key goes through `agree()`:

1. every process that reaches it tries to *claim* ``lazytriton/agree/v1/<key>``
   (an atomic set-if-absent in the store): exactly one wins.  Nobody waits for
   a process that never reaches the kernel: the claimant is one that did;
2. the claimant resolves as a lone process would (its cache, else compile and
   tune) and publishes the winner (config index and tuning record), or the
   error it hit;
3. the others block in the store (a blocking get that releases the GIL: no
   Python busy loop) for at most LAZYTRITON_AGREE_TIMEOUT seconds (default
   600), then launch that exact config: from their cache, else compiled
   alone, no trials.  On a timeout, a store failure or the claimant's error
   they resolve on their own and say so in a warning.

A process with a cached winner takes part too (it may be the claimant, whose
cached winner then becomes everyone's; or a waiter, which then launches the
claimant's winner even if its own cache had another): ranks agree even when
their node-local caches disagree.  Keys are tuning keys (kernel source, call
specialization, configs, GPU model, Triton and ptxas versions...), so ranks on
different GPU models or software never share a winner.

Kernels resolved while a CUDA graph is being captured never wait (they use a
cached winner or fail as without agreement).  LAZYTRITON_AGREE=0 turns it off.

Progress is logged on the ``lazytriton.distributed`` logger: who resolves,
who waits for whom, where each winner came from.
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

from .cache.config import env_flag, env_seconds

log = logging.getLogger("lazytriton.distributed")

AGREE_ENV = "LAZYTRITON_AGREE"
TIMEOUT_ENV = "LAZYTRITON_AGREE_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
PROGRESS_S = 30.0  # a waiter blocks in slices this long and logs between them
PREFIX = "lazytriton/agree/v1/"

T = TypeVar("T")


class Store(Protocol):
    """What agreement needs from a key-value store shared by the processes."""

    def claim(self, key: str, value: str) -> bool:
        """Set ``key`` to ``value`` if it has no value; True if this call set it (atomic)."""

    def set(self, key: str, value: str) -> None:
        """Set ``key`` (overwriting)."""

    def get(self, key: str, timeout_s: float) -> Optional[str]:
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

    def claim(self, key: str, value: str) -> bool:
        try:
            self.client.key_value_set(key, value)  # allow_overwrite=False: refused if the key exists
            return True
        except Exception:
            if self._try_get(key) is not None:
                return False
            raise

    def set(self, key: str, value: str) -> None:
        self.client.key_value_set(key, value, allow_overwrite=True)

    def get(self, key: str, timeout_s: float) -> Optional[str]:
        try:
            # Blocks in C++ with the GIL released.
            return self.client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
        except Exception as exc:
            if "DEADLINE_EXCEEDED" in str(exc):
                return None
            raise

    def _try_get(self, key: str) -> Optional[str]:
        try:
            return self.client.key_value_try_get(key)
        except Exception as exc:
            if "NOT_FOUND" in str(exc):
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

    def resolve(self, kernel: str, key: str, local: Callable[[], tuple[T, dict]],
                adopt: Callable[[dict, dict], T]) -> T:
        return agree(self.store, key, kernel, local, adopt, rank=self.rank, timeout_s=self.timeout_s,
                     clock=self.clock, slice_s=self.slice_s)


# -- the protocol ----------------------------------------------------------------------

_stats = {"resolved_here": 0, "received": 0, "timeouts": 0, "claimant_failed": 0, "store_errors": 0}
_stats_lock = threading.Lock()


def _count(name: str) -> None:
    with _stats_lock:
        _stats[name] += 1


def stats() -> dict:
    """What agreement did in this process: resolutions done here for every
    process (resolved_here), winners received from another (received), and
    local fallbacks (timeouts, claimant_failed, store_errors)."""
    with _stats_lock:
        return dict(_stats)


def _describe(who: dict) -> str:
    return f"rank {who.get('rank', '?')} ({who.get('host', '?')}, pid {who.get('pid', '?')})"


def agree(store: Store, key: str, kernel: str, local: Callable[[], tuple[T, dict]],
          adopt: Callable[[dict, dict], T], *, rank: int, timeout_s: float = DEFAULT_TIMEOUT_S,
          clock: Callable[[], float] = time.monotonic, slice_s: float = PROGRESS_S) -> T:
    """Resolve tuning key ``key`` of ``kernel`` once for every process sharing ``store``.

    ``local()`` resolves as a lone process would and returns (result, record):
    record is the JSON-able winner to publish (a TuningRecord's dict, with
    ``winner_index``).  ``adopt(record, origin)`` launches another process's
    winner (origin: the claimant's rank, host, pid).  The deadline is measured
    with ``clock`` (a test can pass a fake one); each blocking get lasts at
    most ``slice_s`` real seconds.
    """
    me = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "thread": threading.get_ident()}
    claim_key, winner_key = f"{PREFIX}{key}/claim", f"{PREFIX}{key}/winner"
    try:
        mine = store.claim(claim_key, json.dumps(me))
    except Exception as exc:
        _count("store_errors")
        log.warning("kernel %s: the key-value store failed (%s); resolving here, without agreeing with the "
                    "other processes", kernel, exc)
        return local()[0]
    if mine:
        log.info("kernel %s: rank %d resolves specialization %s for every process", kernel, rank, key[:16])
        try:
            result, record = local()
        except BaseException as exc:
            _publish(store, winner_key, {"error": f"{type(exc).__name__}: {exc}", "by": me}, kernel)
            raise
        _publish(store, winner_key, {"record": record, "by": me}, kernel)
        _count("resolved_here")
        return result

    try:
        claimant = json.loads(store.get(claim_key, slice_s) or "{}")
    except Exception:
        claimant = {}
    who = _describe(claimant)
    log.info("kernel %s: rank %d waits for %s to resolve specialization %s", kernel, rank, who, key[:16])
    start = clock()
    deadline = start + timeout_s
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            _count("timeouts")
            log.warning("kernel %s: no winner from %s after %.0f s (%s); tuning here: this process may launch "
                        "another config than the others", kernel, who, timeout_s, TIMEOUT_ENV)
            return local()[0]
        try:
            value = store.get(winner_key, min(slice_s, remaining))
        except Exception as exc:
            _count("store_errors")
            log.warning("kernel %s: the key-value store failed while waiting for %s (%s); resolving here, "
                        "without agreeing with the other processes", kernel, who, exc)
            return local()[0]
        if value is not None:
            break
        log.info("kernel %s: still waiting for %s (%.0f s of %.0f s)", kernel, who, clock() - start, timeout_s)
    doc = json.loads(value)
    origin = doc.get("by") or claimant
    if "error" in doc:
        _count("claimant_failed")
        log.warning("kernel %s: %s could not resolve it (%s); resolving here", kernel, _describe(origin),
                    doc["error"])
        return local()[0]
    record = doc["record"]
    log.info("kernel %s: rank %d launches config %s, the winner of %s (no tuning here)", kernel, rank,
             record.get("winner_index"), _describe(origin))
    _count("received")
    return adopt(record, {k: origin.get(k) for k in ("rank", "host", "pid")})


def _publish(store: Store, key: str, doc: dict, kernel: str) -> None:
    try:
        store.set(key, json.dumps(doc))
    except Exception as exc:  # waiters then time out and resolve on their own
        log.warning("kernel %s: could not publish to the key-value store (%s); the other processes will "
                    "resolve it on their own after %s", kernel, exc, TIMEOUT_ENV)


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
            def claim(self, k, v): return self.s.compare_set(k, "", v) == v.encode()
            def set(self, k, v): self.s.set(k, v)
            def get(self, k, t):
                try: self.s.wait([k], datetime.timedelta(seconds=t))
                except Exception: return None  # timed out
                return self.s.get(k).decode()
    """
    global _explicit
    if store is None:
        _explicit = None
        return
    _explicit = Agreement(store, rank, processes,
                          timeout_s=env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S) if timeout_s is None else timeout_s)


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
    if not env_flag(AGREE_ENV, True):
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
                     timeout_s=env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def provenance(record: dict, origin: dict, compile_key: str) -> dict:
    """What a record adopted from another process says about its origin."""
    out = {"from_rank": origin.get("rank"), "from_host": origin.get("host"), "from_pid": origin.get("pid"),
           "tuned_on": record.get("created"), "winner_index": record.get("winner_index"),
           "times_ms": [c.get("time_ms") for c in record.get("candidates") or []]}
    if record.get("winner") != compile_key:
        # Same tuning key, different compile key: e.g. other TRITON_* settings there.
        out["their_compile_key"] = record.get("winner")
    return out
