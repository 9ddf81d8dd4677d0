"""The Cache: an on-disk (or, degraded, in-memory) store of compiled binaries
and tuning records.

Layout under ``<root>/v{FORMAT_VERSION}/``::

    binaries/<compile_key>.ltb   one compiled kernel (JSON header + raw cubin)
    records/<tuning_key>.ltr     one tuning result (JSON)
    locks/<key>.lock             flock targets; empty, never deleted

A file failing any check (entries.py) is logged, deleted and treated as a
miss: the caller rebuilds, it never sees an exception.  Writes are atomic
(files.py), so a killed writer leaves at most a ``*.tmp`` file (ignored by
readers, removed once older than an hour) and never a half entry.

If the directory cannot be written (read-only, full, not a directory) the
cache degrades to an in-memory store with one warning and keeps working.

With LAZYTRITON_REMOTE_CACHE set, a local miss asks the remote tier
(lazytriton.cache.remote) and keeps what it finds; a stored tuning record is
published there with its winner's binary.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from .keys import FORMAT_VERSION
from . import archive, files, measurements, verdicts
from ..settings import cache_lock_timeout, cache_locks, file_in_the_way, remote_cache_url, settings, used_keys_dir
from .entries import (KEY_RE, KIND_BINARY, KIND_NAMES, KIND_RECORD, SUBDIRS, BadEntry, CompiledBinary, EntryInfo,
                      TuningRecord, check_key, decode, decode_record, encode_binary, encode_record, peek_binary_head)
from .remote import RemoteCache, from_settings as remote_from_settings

log = logging.getLogger("lazytriton.cache")



# --------------------------------------------------------------------------
# Locks
# --------------------------------------------------------------------------


class _KeyLock:
    """Process-wide lock for one key: an RLock for threads plus flock for processes.

    flock already excludes separate open() calls within one process on Linux,
    but the RLock makes nested use by one thread re-entrant instead of a
    self-deadlock, and covers the in-memory mode where there is no file.
    """

    def __init__(self) -> None:
        self.rlock = threading.RLock()
        self.depth = 0
        self.fd = -1


_key_locks: dict[str, _KeyLock] = {}
_key_locks_guard = threading.Lock()


def _key_lock(ident: str) -> _KeyLock:
    with _key_locks_guard:
        lock = _key_locks.get(ident)
        if lock is None:
            lock = _key_locks[ident] = _KeyLock()
        return lock


# --------------------------------------------------------------------------
# Which records a process used (for `lazytriton pretune`)
# --------------------------------------------------------------------------

USED_KEYS_ENV = "LAZYTRITON_USED_KEYS"
_used_guard = threading.Lock()
_used_file: Optional[tuple[str, Any]] = None  # (directory, open file)
_used_seen: set[str] = set()


def note_used_record(key: str) -> None:
    """With $LAZYTRITON_USED_KEYS set to a directory, append each tuning record
    this process loads or stores to a file of its own there, written at once
    (line-buffered): a process that ends in os._exit has still said what it used."""
    global _used_file
    where = used_keys_dir()
    if not where:
        return
    with _used_guard:
        if _used_file is None or _used_file[0] != where:
            _used_seen.clear()
            try:
                name = f"{socket.gethostname()}.{os.getpid()}.keys"
                _used_file = (where, open(os.path.join(where, name), "a", buffering=1))
            except OSError as exc:
                log.warning("cannot record used cache entries in %s ($%s): %s", where, USED_KEYS_ENV, exc)
                _used_file = (where, None)
        if _used_file[1] is not None and key not in _used_seen:
            _used_seen.add(key)
            _used_file[1].write(f"record {key}\n")


# --------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------


class NotWritable(OSError):
    """The cache directory cannot be written where only the disk will do (Cache.import_(disk_only=True))."""


class Cache:
    """On-disk (or, degraded, in-memory) store of binaries and tuning records."""

    def __init__(self, root: Optional[os.PathLike | str] = None, *, disk: Optional[bool] = None) -> None:
        conf = settings()
        self.root = Path(root).expanduser() if root is not None else conf.cache_dir
        self.dir = self.root / f"v{FORMAT_VERSION}"
        # disk_requested: what the user asked for; _disk: whether we still
        # write to disk (False once degraded to memory).
        self.disk_requested = conf.disk_cache if disk is None else bool(disk)
        self._disk = self.disk_requested
        self._dirs_ready = False
        self._warned = False
        self._temp_cleaned = False
        self._mem: dict[tuple[int, str], bytes] = {}
        self._mem_mtime: dict[tuple[int, str], float] = {}
        self._stats_lock = threading.Lock()
        self.stats = {
            "binary_hits": 0, "binary_misses": 0, "binary_stores": 0,
            "record_hits": 0, "record_misses": 0, "record_stores": 0,
            "discarded": 0,
        }
        if not self.disk_requested:
            log.debug("disk cache disabled (LAZYTRITON_CACHE=0); using memory only")
        # The fleet's server behind this cache (LAZYTRITON_REMOTE_CACHE), or None: asked on a
        # local miss, published to after a tune (lazytriton.cache.remote).
        self.remote: Optional[RemoteCache] = remote_from_settings()

    @classmethod
    def given(cls, cache: Any, what: str) -> Optional["Cache"]:
        """What a kernel's `cache=` names: a Cache, or a directory (str or path: a Cache there, one per
        directory in the process); None: the default cache. Checked when the kernel is wrapped."""
        if cache is None or isinstance(cache, cls):
            return cache
        if not isinstance(cache, (str, os.PathLike)):
            raise TypeError(f"{what}: cache takes a lazytriton.cache.Cache or a directory (str or path), "
                            f"got {type(cache).__name__} {cache!r}")
        root = Path(cache).expanduser().absolute()
        blocker = file_in_the_way(root)
        if blocker is not None:
            raise ValueError(f"{what}: cache={str(cache)!r} is not a directory ({blocker} is a file)")
        with _default_guard:
            return _by_dir.setdefault(root, cls(root))

    def warm_up(self) -> None:
        """Connect to the remote tier in the background (a kernel is wrapped: its first call follows)."""
        if self.remote is not None:
            self.remote.warm_up()

    def __repr__(self) -> str:
        mode = "disk" if self._disk else "memory"
        return f"Cache({str(self.dir)!r}, {mode})"

    @property
    def on_disk(self) -> bool:
        """False when disabled or degraded to memory."""
        return self._disk

    # -- paths ---------------------------------------------------------------

    def entry_path(self, kind: int, key: str) -> Path:
        sub, ext = SUBDIRS[kind]
        return self.dir / sub / f"{key}{ext}"

    def _lock_path(self, key: str) -> Path:
        return self.dir / "locks" / f"{key}.lock"

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self.stats[name] += 1

    # -- degradation -----------------------------------------------------------

    def _degrade(self, exc: BaseException) -> None:
        # One warning per Cache: a read-only cache dir is a setup problem the
        # user should know about, not something to repeat on every kernel.
        self._disk = False
        if not self._warned:
            self._warned = True
            log.warning("lazytriton cache directory %s is not writable (%s); keeping entries in memory only "
                        "for this process. Set LAZYTRITON_CACHE_DIR to a writable directory to persist them.",
                        self.dir, exc)

    def _ensure_dirs(self) -> bool:
        if self._dirs_ready:
            return True
        try:
            for sub in ("binaries", "records", "locks"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._degrade(exc)
            return False
        self._dirs_ready = True
        return True

    # -- raw storage -------------------------------------------------------------

    def _store_raw(self, kind: int, key: str, data: bytes) -> None:
        if self._disk and self._write_disk(self.entry_path(kind, key), data):
            self._mem.pop((kind, key), None)  # the disk copy is now the newest
            return
        self._mem[(kind, key)] = data
        self._mem_mtime[(kind, key)] = time.time()

    def _write_disk(self, path: Path, data: bytes) -> bool:
        for attempt in (1, 2):
            if not self._ensure_dirs():
                return False
            self._clean_temp_once()
            try:
                files.atomic_write(path, data)
                return True
            except FileNotFoundError as exc:
                # The directory vanished under us (e.g. rm -rf): recreate once.
                self._dirs_ready = False
                if attempt == 2:
                    self._degrade(exc)
            except OSError as exc:  # read-only, full, quota, not a directory...
                self._degrade(exc)
                return False
        return False

    def _load(self, kind: int, key: str) -> Any:
        data = self._mem.get((kind, key))
        if data is not None:
            try:
                return decode(kind, key, data)
            except BadEntry as exc:  # cannot happen unless memory is corrupted
                log.warning("discarding in-memory cache entry %s: %s", key, exc)
                self._mem.pop((kind, key), None)
                return None
        if not self.disk_requested:
            return None
        path = self.entry_path(kind, key)
        try:
            data, st = files.read_file(path)
        except OSError:
            return None  # missing (the normal miss) or unreadable: rebuild
        try:
            return decode(kind, key, data)
        except BadEntry as exc:
            self._discard(path, st, exc)
            return None

    def _discard(self, path: Path, st: os.stat_result, reason: BaseException) -> None:
        log.warning("discarding invalid cache entry %s: %s", path, reason)
        self._count("discarded")
        # Only delete what we read: a writer may have just replaced it.
        if files.same_file(path, st):
            with contextlib.suppress(OSError):
                os.unlink(path)

    # -- public entry API ----------------------------------------------------------

    def load_binary(self, key: str) -> Optional[CompiledBinary]:
        result = self._load(KIND_BINARY, check_key(key))
        if result is None and self.remote is not None:
            result = self._from_remote(KIND_BINARY, key, self.remote.fetch_binary(key))
        self._count("binary_hits" if result is not None else "binary_misses")
        return result

    def store_binary(self, key: str, binary: CompiledBinary) -> None:
        self._store_raw(KIND_BINARY, check_key(key), encode_binary(key, binary))
        self._count("binary_stores")

    def load_record(self, key: str, expect: Optional[dict] = None) -> Optional[TuningRecord]:
        """The tuning record `key`: local, else the remote tier's, when it says what `expect`
        says ({"device_name":, "driver_version":} of this process's device)."""
        result = self._load(KIND_RECORD, check_key(key))
        if result is None and self.remote is not None:
            result = self._from_remote(KIND_RECORD, key, self.remote.fetch_record(key, expect))
        self._count("record_hits" if result is not None else "record_misses")
        if result is not None:
            note_used_record(key)
        return result

    def store_record(self, key: str, record: TuningRecord) -> None:
        data = encode_record(key, record)
        self._store_raw(KIND_RECORD, check_key(key), data)
        self._count("record_stores")
        note_used_record(key)
        if self.remote is not None:
            self.remote.publish(key, record, data, self._load(KIND_BINARY, record.winner), record.winner)

    def _from_remote(self, kind: int, key: str, data: Optional[bytes]) -> Any:
        """A remote tier's entry (checked there), kept in this cache too: in memory at once, on disk
        by a thread (an atomic write's fsyncs cost milliseconds the first call does not wait for;
        the process waits for it at exit). None for a miss."""
        if data is None:
            return None
        obj = decode(kind, key, data)
        if isinstance(obj, TuningRecord) and self.remote is not None:
            obj.origin = f"the remote cache {self.remote.shown}"
        self._mem[(kind, key)] = data
        self._mem_mtime[(kind, key)] = time.time()
        if self._disk:
            _write_behind(lambda: self._store_raw(kind, key, data))
        return obj

    # -- locking ---------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive lock on ``key`` across threads and, best effort, processes.

        Usage: ``with cache.lock(k): rec = cache.load_record(k); if rec is None:
        tune and store_record(k, ...)``.  Waiters then find the stored result.
        The flock dies with its process, so a crashed tuner never wedges others.
        Correctness never depends on it (entries are published by rename): a
        filesystem without flock, LAZYTRITON_CACHE_LOCKS=0 or a wait longer
        than LAZYTRITON_CACHE_LOCK_TIMEOUT (default 600 s) only means that
        two processes may do the same work.
        """
        check_key(key)
        path = self._lock_path(key)
        klock = _key_lock(str(path))
        with klock.rlock:
            if klock.depth == 0:
                klock.fd = self._open_lock_file(path, key)
            klock.depth += 1
            try:
                yield
            finally:
                klock.depth -= 1
                if klock.depth == 0 and klock.fd >= 0:
                    os.close(klock.fd)  # closing releases the flock
                    klock.fd = -1

    def _open_lock_file(self, path: Path, key: str) -> int:
        if not (self._disk and self._ensure_dirs()) or not cache_locks():
            return -1  # memory mode or locks off: the in-process RLock is all there is
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            self._degrade(exc)
            return -1
        timeout = cache_lock_timeout()
        files.flock_bounded(fd, key[:16], timeout)
        return fd

    # -- temp files --------------------------------------------------------------------

    def _clean_temp_once(self) -> None:
        if not self._temp_cleaned:
            self._temp_cleaned = True
            self.clean_temp()

    def clean_temp(self, max_age_s: float = files.STALE_TEMP_AGE_S) -> int:
        """Remove temp files older than ``max_age_s`` (left by killed writers)."""
        removed = 0
        cutoff = time.time() - max_age_s
        for sub, _ in SUBDIRS.values():
            for path in self._list_dir(self.dir / sub):
                if not files.is_temp(path.name):
                    continue
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
        if removed:
            log.info("removed %d stale temp file(s) from %s", removed, self.dir)
        return removed

    # -- management (CLI) ------------------------------------------------------------

    @staticmethod
    def _list_dir(path: Path) -> list[Path]:
        try:
            return sorted(path.iterdir())
        except OSError:
            return []

    def _disk_entries(self, kind: int) -> Iterator[tuple[str, Path]]:
        sub, ext = SUBDIRS[kind]
        for path in self._list_dir(self.dir / sub):
            key = path.name[:-len(ext)] if path.name.endswith(ext) else ""
            if KEY_RE.match(key):
                yield key, path

    def all_raw(self) -> Iterator[tuple[int, str, Optional[Path]]]:
        """(kind, key, path-or-None) of every entry, memory ones included."""
        seen = set()
        for (kind, key) in list(self._mem):
            seen.add((kind, key))
            yield kind, key, None
        if not self.disk_requested:
            return
        for kind in SUBDIRS:
            for key, path in self._disk_entries(kind):
                if (kind, key) not in seen:
                    yield kind, key, path

    def read_raw(self, kind: int, key: str, path: Optional[Path]) -> Optional[bytes]:
        if path is None:
            return self._mem.get((kind, key))
        try:
            return files.read_file(path)[0]
        except OSError:
            return None

    def _info(self, kind: int, key: str, path: Optional[Path]) -> Optional[EntryInfo]:
        if path is None:
            data = self._mem.get((kind, key), b"")
            size, mtime = len(data), self._mem_mtime.get((kind, key), 0.0)
        else:
            try:
                st = path.stat()
            except OSError:
                return None
            size, mtime = st.st_size, st.st_mtime
        info = EntryInfo(kind=KIND_NAMES[kind], key=key, kernel_name="?", size=size, mtime=mtime,
                         path=str(path) if path is not None else None)
        if kind == KIND_BINARY:
            # Listing reads only the JSON header, not the (possibly large) cubin.
            head = peek_binary_head(path) if path is not None else None
            if head is None and path is None:
                obj = self._load(kind, key)
                head = {"name": obj.name} if obj is not None else None
            info.kernel_name = str(head.get("name", "?")) if head else "<invalid>"
        else:
            data = self.read_raw(kind, key, path)
            try:
                rec = decode_record(key, data or b"")
                info.kernel_name = rec.kernel_name
                info.device_name = rec.device_name
                info.winner_config = rec.winner_config
            except BadEntry:
                info.kernel_name = "<invalid>"
        return info

    def entries(self) -> list[EntryInfo]:
        """Every stored entry (records first, then binaries; newest first)."""
        infos = [i for i in (self._info(*raw) for raw in self.all_raw()) if i is not None]
        infos.sort(key=lambda i: (i.kind != "record", -i.mtime, i.key))
        return infos

    def _match(self, key_prefix: str) -> tuple[int, str, Optional[Path]]:
        prefix = key_prefix.strip().lower()
        if not prefix:
            raise KeyError("empty key prefix")
        matches = [raw for raw in self.all_raw() if raw[1].startswith(prefix)]
        if not matches:
            raise KeyError(f"no cache entry matches {key_prefix!r}")
        if len(matches) > 1:
            listed = ", ".join(f"{KIND_NAMES[k]}:{key[:16]}" for k, key, _ in matches[:5])
            raise ValueError(f"{len(matches)} entries match {key_prefix!r} ({listed}...); give more characters")
        return matches[0]

    def show(self, key_prefix: str) -> dict:
        """Full, verified content of the one entry whose key starts with ``key_prefix``.

        Raises KeyError (no match) or ValueError (ambiguous prefix).
        """
        kind, key, path = self._match(key_prefix)
        info = self._info(kind, key, path)
        out: dict[str, Any] = info.to_dict() if info else {"kind": KIND_NAMES[kind], "key": key}
        data = self.read_raw(kind, key, path)
        try:
            obj = decode(kind, key, data or b"")
        except BadEntry as exc:
            out["valid"] = False
            out["error"] = str(exc)
            return out
        out["valid"] = True
        if kind == KIND_RECORD:
            out["record"] = obj.to_dict()
        else:
            out["binary"] = {
                "name": obj.name,
                "metadata": obj.metadata,
                "asm_names": obj.asm_names,
                "cubin_size": len(obj.cubin),
                "cubin_sha256": hashlib.sha256(obj.cubin).hexdigest(),
                "ttir": obj.ttir,
            }
        return out

    def _kernel_of(self, kind: int, key: str, path: Optional[Path]) -> Optional[str]:
        info = self._info(kind, key, path)
        return info.kernel_name if info else None

    def clear(self, kernel: Optional[str] = None) -> int:
        """Remove all entries (or those of one kernel name) and their lock files; return how many."""
        removed = 0
        cleared: set[str] = set()
        for kind, key, path in list(self.all_raw()):
            if kernel is not None and self._kernel_of(kind, key, path) != kernel:
                continue
            if path is None:
                self._mem.pop((kind, key), None)
                self._mem_mtime.pop((kind, key), None)
                removed += 1
                continue
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove %s: %s", path, exc)
            cleared.add(key)
        for path in self._list_dir(self.dir / "locks"):  # the lock files of what was removed, unless held
            if path.name.endswith(".lock") and (kernel is None or path.name[:-len(".lock")] in cleared):
                files.remove_unheld_lock(path)
        if kernel is None:
            self.clean_temp(max_age_s=files.STALE_TEMP_AGE_S)
        return removed + measurements.clear(self, kernel) + verdicts.clear(self, kernel)

    # -- export / import -------------------------------------------------------------

    def export(self, path: os.PathLike | str, kernel: Optional[str] = None,
               records: Optional[list[str]] = None) -> int:
        """Write every valid entry (or those of one kernel, or the tuning records
        named in ``records`` with their winners' binaries) to a .tar.gz archive.
        Returns the number of entries exported."""
        return archive.export(self, path, kernel=kernel, records=records)

    def import_(self, path: os.PathLike | str, *, disk_only: bool = False) -> int:
        """Verify every member of an archive, then install them; return the count.

        Nothing is installed unless the whole archive verifies.  Raises
        ValueError for an archive of another format version or one that fails
        verification.  disk_only (`lazytriton cache import`, whose memory ends
        with it): an entry that cannot be written into the cache directory
        raises NotWritable, saying how many were imported, instead of being
        kept in memory.
        """
        verified = archive.verify(path)
        for done, (kind, key, data) in enumerate(verified):
            if disk_only:
                try:
                    self.entry_path(kind, key).parent.mkdir(parents=True, exist_ok=True)
                    files.atomic_write(self.entry_path(kind, key), data)
                except OSError as exc:
                    raise NotWritable(f"cannot write into the cache directory {self.dir} ({exc.strerror or exc}): "
                                      f"{done} of {len(verified)} entries imported") from None
            else:
                self._store_raw(kind, key, data)
            self._count("binary_stores" if kind == KIND_BINARY else "record_stores")
        return len(verified)


# --------------------------------------------------------------------------
# Writes off the caller's path
# --------------------------------------------------------------------------

_behind: list[threading.Thread] = []
_behind_guard = threading.Lock()
WRITE_BEHIND_EXIT_WAIT_S = 10.0


def _write_behind(write) -> None:
    thread = threading.Thread(target=write, name="lazytriton-cache-write", daemon=True)
    with _behind_guard:
        _behind[:] = [t for t in _behind if t.is_alive()] + [thread]
    thread.start()


@atexit.register
def _finish_writes() -> None:
    # A daemon thread dies at exit: an entry whose write was cut stays a temp file (removed later), never
    # a half entry; waiting a little keeps it for the next process.
    deadline = time.monotonic() + WRITE_BEHIND_EXIT_WAIT_S
    for thread in list(_behind):
        thread.join(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------
# Process-wide default
# --------------------------------------------------------------------------

_default: Optional[Cache] = None
_default_guard = threading.Lock()
_by_dir: dict[Path, Cache] = {}  # the caches kernels named by directory (Cache.given)


def get_cache() -> Cache:
    """The process-wide Cache for the current settings (rebuilt if they change)."""
    global _default
    conf = settings()
    with _default_guard:
        if (_default is None or _default.root != conf.cache_dir or _default.disk_requested != conf.disk_cache
                or (_default.remote.url if _default.remote else None) != remote_cache_url()):
            _default = Cache(conf.cache_dir, disk=conf.disk_cache)
        return _default
