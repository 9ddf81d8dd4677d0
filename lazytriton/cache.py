"""Safe on-disk store for compiled binaries and tuning records.

Layout under ``<root>/v{FORMAT_VERSION}/``::

    binaries/<compile_key>.ltb   one compiled kernel (JSON header + raw cubin)
    records/<tuning_key>.ltr     one tuning result (JSON)
    locks/<key>.lock             flock targets; empty, never deleted

Every entry file is ``header || payload`` where the header is
``magic b"LTC1" | u16 format version | u16 kind | u64 payload length |
sha256(payload)``.  A file failing any check is logged, deleted and treated
as a miss: the caller rebuilds, it never sees an exception.

Writes go to a temp file in the same directory, are fsync'ed and then
os.replace'd, so a killed writer leaves at most a ``*.tmp`` file (ignored by
readers, removed once older than an hour) and never a half entry.

If the directory cannot be written (read-only, full, not a directory) the
cache degrades to an in-memory store with one warning and keeps working.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import struct
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .keys import FORMAT_VERSION, lazytriton_version

log = logging.getLogger("lazytriton.cache")

MAGIC = b"LTC1"
# magic, format version, kind, payload length, sha256(payload)
_HEADER = struct.Struct("<4sHHQ32s")
_JSON_LEN = struct.Struct("<I")  # binary payloads: length of the JSON part

KIND_BINARY = 1
KIND_RECORD = 2
_KIND_NAMES = {KIND_BINARY: "binary", KIND_RECORD: "record"}
_SUBDIRS = {KIND_BINARY: ("binaries", ".ltb"), KIND_RECORD: ("records", ".ltr")}

_KEY_RE = re.compile(r"^[0-9a-f]{8,128}$")
_TEMP_SUFFIX = ".tmp"
STALE_TEMP_AGE_S = 3600.0
_WRITE_CHUNK = 1 << 20

BUNDLE_FORMAT = "lazytriton-cache-bundle"
_MANIFEST = "manifest.json"

# Test hook: called as hook(temp_path, bytes_written) after each chunk of an
# entry write.  Lets a test kill a writer at a precise point.
_chunk_hook: Optional[Callable[[str, int], None]] = None


# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """User settings, read from the environment by settings().

    - cache_dir: LAZYTRITON_CACHE_DIR, else $XDG_CACHE_HOME/lazytriton, else
      ~/.cache/lazytriton.
    - disk_cache: False when LAZYTRITON_CACHE=0 (memory only).
    - retune: LAZYTRITON_RETUNE=1 ignores stored tuning records, re-tunes and
      overwrites them.
    - tuning: False when LAZYTRITON_TUNING=off: no benchmarking, the first
      config left after pruning is used.  Heuristics (@triton.heuristics) and
      config pruning still apply; only the timing step is skipped.
    """

    cache_dir: Path
    disk_cache: bool = True
    retune: bool = False
    tuning: bool = True


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    log.warning("ignoring %s=%r (expected one of %s / %s)", name, raw, sorted(_TRUE), sorted(_FALSE))
    return default


def default_cache_dir() -> Path:
    explicit = os.environ.get("LAZYTRITON_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "lazytriton"


def settings() -> Settings:
    """Read the settings from the environment now (not cached)."""
    return Settings(
        cache_dir=default_cache_dir(),
        disk_cache=_env_flag("LAZYTRITON_CACHE", True),
        retune=_env_flag("LAZYTRITON_RETUNE", False),
        tuning=_env_flag("LAZYTRITON_TUNING", True),
    )


# --------------------------------------------------------------------------
# Data types
# --------------------------------------------------------------------------


def _jsonable(value: Any) -> tuple[bool, Any]:
    """(ok, converted): tuples become lists, GPUTarget-like become dicts."""
    if value is None or isinstance(value, (bool, int, str)):
        return True, value
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf")), value
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            ok, conv = _jsonable(item)
            if not ok:
                return False, None
            out.append(conv)
        return True, out
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            ok, conv = _jsonable(v)
            if not ok or not isinstance(k, str):
                return False, None
            out[k] = conv
        return True, out
    if all(hasattr(value, f) for f in ("backend", "arch", "warp_size")):
        return _jsonable({"backend": value.backend, "arch": value.arch, "warp_size": value.warp_size})
    return False, None


def _metadata_dict(metadata: Any) -> dict:
    if hasattr(metadata, "_asdict"):  # KernelMetadata namedtuple (3.x)
        return dict(metadata._asdict())
    if isinstance(metadata, dict):
        return dict(metadata)
    return dict(vars(metadata))


@dataclasses.dataclass
class CompiledBinary:
    """A compiled kernel as stored: the GPU binary plus launch metadata."""

    name: str
    cubin: bytes
    metadata: dict
    asm_names: list[str] = dataclasses.field(default_factory=list)
    ttir: Optional[str] = None

    @classmethod
    def from_triton(cls, kernel: Any) -> "CompiledBinary":
        """Build from a triton.compiler.CompiledKernel, keeping JSON-able metadata."""
        metadata = {}
        for name, value in _metadata_dict(kernel.metadata).items():
            ok, conv = _jsonable(value)
            if ok:
                metadata[name] = conv
            else:
                log.debug("dropping non-JSON metadata field %s=%r", name, value)
        asm = getattr(kernel, "asm", {}) or {}
        asm_names = [str(k) for k in asm.keys()]
        binary = getattr(kernel, "kernel", None)
        if binary is None:  # no .kernel attribute: take the binary asm entry
            binary = next((v for v in asm.values() if isinstance(v, (bytes, bytearray))), b"")
        ttir = asm["ttir"] if "ttir" in asm_names else None
        name = getattr(kernel, "name", None) or metadata.get("name", "")
        return cls(name=str(name), cubin=bytes(binary), metadata=metadata, asm_names=asm_names,
                   ttir=ttir if isinstance(ttir, str) else None)


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _triton_version() -> str:
    try:
        import triton
        return str(getattr(triton, "__version__", "unknown"))
    except ImportError:
        return "unknown"


@dataclasses.dataclass
class TuningRecord:
    """The outcome of tuning one kernel for one key on one device.

    candidates: one dict per config, in config order, with keys ``config``
    (dict), ``compile_key`` (str|None), ``time_ms`` (float|None) and
    ``error`` (str|None).
    """

    kernel_name: str
    winner: str
    winner_index: int
    candidates: list[dict]
    device_name: str
    compute_capability: Any = None
    driver_version: Any = None
    triton_version: str = dataclasses.field(default_factory=_triton_version)
    lazytriton_version: str = dataclasses.field(default_factory=lazytriton_version)
    created: str = dataclasses.field(default_factory=_now_iso)
    tune_key_values: list = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TuningRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in names})
        if not isinstance(record.winner_index, int) or not isinstance(record.candidates, list):
            raise ValueError("malformed tuning record")
        return record

    @property
    def winner_config(self) -> Optional[dict]:
        if 0 <= self.winner_index < len(self.candidates):
            return self.candidates[self.winner_index].get("config")
        return None


@dataclasses.dataclass
class EntryInfo:
    kind: str  # "binary" or "record"
    key: str
    kernel_name: str
    size: int
    mtime: float
    path: Optional[str] = None  # None for in-memory entries
    device_name: Optional[str] = None
    winner_config: Optional[dict] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------
# Entry encoding
# --------------------------------------------------------------------------


class BadEntry(Exception):
    """An entry failed verification; the message says why."""


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr).encode("utf-8")


def _frame(kind: int, payload: bytes) -> bytes:
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, kind, len(payload), hashlib.sha256(payload).digest())
    return header + payload


def _unframe(data: bytes, kind: int) -> bytes:
    if len(data) < _HEADER.size:
        raise BadEntry(f"truncated header ({len(data)} bytes)")
    magic, version, got_kind, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadEntry(f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise BadEntry(f"format version {version}, expected {FORMAT_VERSION}")
    if got_kind != kind:
        raise BadEntry(f"kind {got_kind}, expected {kind}")
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise BadEntry(f"payload is {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise BadEntry("checksum mismatch")
    return payload


def encode_binary(key: str, binary: CompiledBinary) -> bytes:
    # The cubin goes in raw after the JSON header: no base64 bloat.
    head = _json_bytes({
        "key": key,
        "name": binary.name,
        "metadata": binary.metadata,
        "asm_names": list(binary.asm_names),
        "ttir": binary.ttir,
        "cubin_size": len(binary.cubin),
    })
    return _frame(KIND_BINARY, _JSON_LEN.pack(len(head)) + head + bytes(binary.cubin))


def _binary_head(payload: bytes) -> tuple[dict, int]:
    if len(payload) < _JSON_LEN.size:
        raise BadEntry("payload too short")
    (head_len,) = _JSON_LEN.unpack_from(payload)
    start = _JSON_LEN.size
    if start + head_len > len(payload):
        raise BadEntry("JSON header overruns payload")
    try:
        head = json.loads(payload[start:start + head_len])
    except ValueError as exc:
        raise BadEntry(f"bad JSON header: {exc}") from None
    if not isinstance(head, dict):
        raise BadEntry("JSON header is not an object")
    return head, start + head_len


def decode_binary(key: str, data: bytes) -> CompiledBinary:
    payload = _unframe(data, KIND_BINARY)
    head, cubin_start = _binary_head(payload)
    _check_stored_key(head, key)
    cubin = payload[cubin_start:]
    if head.get("cubin_size") != len(cubin):
        raise BadEntry("cubin size mismatch")
    try:
        return CompiledBinary(name=head["name"], cubin=cubin, metadata=head["metadata"],
                              asm_names=list(head.get("asm_names") or []), ttir=head.get("ttir"))
    except (KeyError, TypeError) as exc:
        raise BadEntry(f"malformed binary header: {exc!r}") from None


def encode_record(key: str, record: TuningRecord) -> bytes:
    return _frame(KIND_RECORD, _json_bytes({"key": key, "record": record.to_dict()}))


def decode_record(key: str, data: bytes) -> TuningRecord:
    payload = _unframe(data, KIND_RECORD)
    try:
        doc = json.loads(payload)
    except ValueError as exc:
        raise BadEntry(f"bad JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadEntry("record is not an object")
    _check_stored_key(doc, key)
    try:
        return TuningRecord.from_dict(doc["record"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadEntry(f"malformed record: {exc!r}") from None


def _check_stored_key(doc: dict, key: str) -> None:
    # Guards against an entry copied or renamed under the wrong key.
    if doc.get("key") != key:
        raise BadEntry(f"entry is for key {str(doc.get('key'))[:16]}..., not {key[:16]}...")


def _decode(kind: int, key: str, data: bytes) -> Any:
    return decode_binary(key, data) if kind == KIND_BINARY else decode_record(key, data)


def _check_key(key: str) -> str:
    # Keys become file names: only accept what our hashes produce.
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"invalid cache key {key!r} (expected lowercase hex)")
    return key


# --------------------------------------------------------------------------
# Low-level file helpers
# --------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    # Makes the rename durable; best effort (not all filesystems allow it).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_TEMP_SUFFIX}"
    # 0o666 & ~umask, like a normal file, so shared caches stay shareable.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:written + _WRITE_CHUNK])
            if _chunk_hook is not None:
                _chunk_hook(str(tmp), written)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _read_file(path: Path) -> tuple[bytes, os.stat_result]:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        return f.read(), st


def _same_file(path: Path, st: os.stat_result) -> bool:
    try:
        now = os.stat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


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
# The cache
# --------------------------------------------------------------------------


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

    def __repr__(self) -> str:
        mode = "disk" if self._disk else "memory"
        return f"Cache({str(self.dir)!r}, {mode})"

    @property
    def on_disk(self) -> bool:
        """False when disabled or degraded to memory."""
        return self._disk

    # -- paths ---------------------------------------------------------------

    def _path(self, kind: int, key: str) -> Path:
        sub, ext = _SUBDIRS[kind]
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
        if self._disk and self._write_disk(self._path(kind, key), data):
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
                atomic_write(path, data)
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
                return _decode(kind, key, data)
            except BadEntry as exc:  # cannot happen unless memory is corrupted
                log.warning("discarding in-memory cache entry %s: %s", key, exc)
                self._mem.pop((kind, key), None)
                return None
        if not self.disk_requested:
            return None
        path = self._path(kind, key)
        try:
            data, st = _read_file(path)
        except OSError:
            return None  # missing (the normal miss) or unreadable: rebuild
        try:
            return _decode(kind, key, data)
        except BadEntry as exc:
            self._discard(path, st, exc)
            return None

    def _discard(self, path: Path, st: os.stat_result, reason: BaseException) -> None:
        log.warning("discarding invalid cache entry %s: %s", path, reason)
        self._count("discarded")
        # Only delete what we read: a writer may have just replaced it.
        if _same_file(path, st):
            with contextlib.suppress(OSError):
                os.unlink(path)

    # -- public entry API ----------------------------------------------------------

    def load_binary(self, key: str) -> Optional[CompiledBinary]:
        result = self._load(KIND_BINARY, _check_key(key))
        self._count("binary_hits" if result is not None else "binary_misses")
        return result

    def store_binary(self, key: str, binary: CompiledBinary) -> None:
        self._store_raw(KIND_BINARY, _check_key(key), encode_binary(key, binary))
        self._count("binary_stores")

    def load_record(self, key: str) -> Optional[TuningRecord]:
        result = self._load(KIND_RECORD, _check_key(key))
        self._count("record_hits" if result is not None else "record_misses")
        return result

    def store_record(self, key: str, record: TuningRecord) -> None:
        self._store_raw(KIND_RECORD, _check_key(key), encode_record(key, record))
        self._count("record_stores")

    # -- locking ---------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive lock on ``key`` across threads and processes.

        Usage: ``with cache.lock(k): rec = cache.load_record(k); if rec is None:
        tune and store_record(k, ...)``.  Waiters then find the stored result.
        The flock dies with its process, so a crashed tuner never wedges others.
        """
        _check_key(key)
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
        if not (self._disk and self._ensure_dirs()):
            return -1  # memory mode: the in-process RLock is all there is
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            self._degrade(exc)
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process working on %s...", key[:16])
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. filesystem without flock support
            log.warning("cannot lock %s (%s); continuing without a cross-process lock", path, exc)
        return fd

    # -- temp files --------------------------------------------------------------------

    def _clean_temp_once(self) -> None:
        if not self._temp_cleaned:
            self._temp_cleaned = True
            self.clean_temp()

    def clean_temp(self, max_age_s: float = STALE_TEMP_AGE_S) -> int:
        """Remove temp files older than ``max_age_s`` (left by killed writers)."""
        removed = 0
        cutoff = time.time() - max_age_s
        for sub, _ in _SUBDIRS.values():
            for path in self._list_dir(self.dir / sub):
                if not path.name.endswith(_TEMP_SUFFIX):
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
        sub, ext = _SUBDIRS[kind]
        for path in self._list_dir(self.dir / sub):
            key = path.name[:-len(ext)] if path.name.endswith(ext) else ""
            if _KEY_RE.match(key):
                yield key, path

    def _all_raw(self) -> Iterator[tuple[int, str, Optional[Path]]]:
        """(kind, key, path-or-None) of every entry, memory ones included."""
        seen = set()
        for (kind, key) in list(self._mem):
            seen.add((kind, key))
            yield kind, key, None
        if not self.disk_requested:
            return
        for kind in _SUBDIRS:
            for key, path in self._disk_entries(kind):
                if (kind, key) not in seen:
                    yield kind, key, path

    def _read_raw(self, kind: int, key: str, path: Optional[Path]) -> Optional[bytes]:
        if path is None:
            return self._mem.get((kind, key))
        try:
            return _read_file(path)[0]
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
        info = EntryInfo(kind=_KIND_NAMES[kind], key=key, kernel_name="?", size=size, mtime=mtime,
                         path=str(path) if path is not None else None)
        if kind == KIND_BINARY:
            # Listing reads only the JSON header, not the (possibly large) cubin.
            head = self._peek_binary_head(path) if path is not None else None
            if head is None and path is None:
                obj = self._load(kind, key)
                head = {"name": obj.name} if obj is not None else None
            info.kernel_name = str(head.get("name", "?")) if head else "<invalid>"
        else:
            data = self._read_raw(kind, key, path)
            try:
                rec = decode_record(key, data or b"")
                info.kernel_name = rec.kernel_name
                info.device_name = rec.device_name
                info.winner_config = rec.winner_config
            except BadEntry:
                info.kernel_name = "<invalid>"
        return info

    @staticmethod
    def _peek_binary_head(path: Path) -> Optional[dict]:
        try:
            with open(path, "rb") as f:
                fixed = f.read(_HEADER.size + _JSON_LEN.size)
                if len(fixed) < _HEADER.size + _JSON_LEN.size or fixed[:4] != MAGIC:
                    return None
                (head_len,) = _JSON_LEN.unpack_from(fixed, _HEADER.size)
                head = json.loads(f.read(head_len))
                return head if isinstance(head, dict) else None
        except (OSError, ValueError):
            return None

    def entries(self) -> list[EntryInfo]:
        """Every stored entry (records first, then binaries; newest first)."""
        infos = [i for i in (self._info(*raw) for raw in self._all_raw()) if i is not None]
        infos.sort(key=lambda i: (i.kind != "record", -i.mtime, i.key))
        return infos

    def _match(self, key_prefix: str) -> tuple[int, str, Optional[Path]]:
        prefix = key_prefix.strip().lower()
        if not prefix:
            raise KeyError("empty key prefix")
        matches = [raw for raw in self._all_raw() if raw[1].startswith(prefix)]
        if not matches:
            raise KeyError(f"no cache entry matches {key_prefix!r}")
        if len(matches) > 1:
            listed = ", ".join(f"{_KIND_NAMES[k]}:{key[:16]}" for k, key, _ in matches[:5])
            raise ValueError(f"{len(matches)} entries match {key_prefix!r} ({listed}...); give more characters")
        return matches[0]

    def show(self, key_prefix: str) -> dict:
        """Full, verified content of the one entry whose key starts with ``key_prefix``.

        Raises KeyError (no match) or ValueError (ambiguous prefix).
        """
        kind, key, path = self._match(key_prefix)
        info = self._info(kind, key, path)
        out: dict[str, Any] = info.to_dict() if info else {"kind": _KIND_NAMES[kind], "key": key}
        data = self._read_raw(kind, key, path)
        try:
            obj = _decode(kind, key, data or b"")
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
        """Remove all entries (or those of one kernel name); return how many."""
        removed = 0
        for kind, key, path in list(self._all_raw()):
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
        if kernel is None:
            self.clean_temp(max_age_s=STALE_TEMP_AGE_S)
        return removed

    # -- export / import -------------------------------------------------------------

    def export(self, path: os.PathLike | str, kernel: Optional[str] = None) -> int:
        """Write every valid entry (optionally of one kernel) to a .tar.gz bundle.

        Returns the number of entries exported.
        """
        members: list[tuple[str, bytes]] = []
        manifest_entries = []
        for kind, key, src in self._all_raw():
            data = self._read_raw(kind, key, src)
            try:
                obj = _decode(kind, key, data or b"")
            except BadEntry as exc:
                log.warning("not exporting invalid entry %s: %s", src or key, exc)
                continue
            name = obj.name if kind == KIND_BINARY else obj.kernel_name
            if kernel is not None and name != kernel:
                continue
            sub, ext = _SUBDIRS[kind]
            member = f"{sub}/{key}{ext}"
            members.append((member, data))
            manifest_entries.append({"member": member, "kind": _KIND_NAMES[kind], "key": key, "kernel_name": name,
                                     "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        manifest = {
            "format": BUNDLE_FORMAT,
            "format_version": FORMAT_VERSION,
            "lazytriton_version": lazytriton_version(),
            "triton_version": _triton_version(),
            "created": _now_iso(),
            "entries": manifest_entries,
        }
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in [(_MANIFEST, json.dumps(manifest, indent=1).encode())] + members:
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                ti.mtime = int(time.time())
                ti.mode = 0o644
                tar.addfile(ti, io.BytesIO(data))
        out = Path(path)
        atomic_write(out, buf.getvalue())
        return len(members)

    def import_(self, path: os.PathLike | str) -> int:
        """Verify every member of a bundle, then install them; return the count.

        Nothing is installed unless the whole bundle verifies.  Raises
        ValueError for a bundle of another format version or one that fails
        verification.
        """
        try:
            tar = tarfile.open(path, mode="r:*")
        except (tarfile.TarError, OSError) as exc:
            raise ValueError(f"{path}: not a readable lazytriton bundle ({exc})") from None
        with tar:
            verified = _verify_bundle(tar, str(path))
        for kind, key, data in verified:
            self._store_raw(kind, key, data)
            self._count("binary_stores" if kind == KIND_BINARY else "record_stores")
        return len(verified)


def _read_member(tar: tarfile.TarFile, name: str, bundle: str) -> bytes:
    try:
        info = tar.getmember(name)
    except KeyError:
        raise ValueError(f"{bundle}: missing member {name}") from None
    if not info.isfile():
        raise ValueError(f"{bundle}: member {name} is not a regular file")
    # extractfile() reads in memory: nothing is written outside the cache.
    return tar.extractfile(info).read()


def _verify_bundle(tar: tarfile.TarFile, bundle: str) -> list[tuple[int, str, bytes]]:
    try:
        manifest = json.loads(_read_member(tar, _MANIFEST, bundle))
    except ValueError as exc:
        raise ValueError(f"{bundle}: bad manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{bundle}: not a lazytriton cache bundle")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{bundle}: bundle has cache format version {manifest.get('format_version')}, "
                         f"this lazytriton uses {FORMAT_VERSION}; re-export it with a matching lazytriton")
    kinds = {name: kind for kind, name in _KIND_NAMES.items()}
    listed = {_MANIFEST}
    verified = []
    for entry in manifest.get("entries") or []:
        kind = kinds.get(entry.get("kind"))
        key = entry.get("key")
        if kind is None or not isinstance(key, str) or not _KEY_RE.match(key):
            raise ValueError(f"{bundle}: bad manifest entry {entry!r}")
        sub, ext = _SUBDIRS[kind]
        member = f"{sub}/{key}{ext}"
        if entry.get("member") != member:
            raise ValueError(f"{bundle}: manifest entry {entry.get('member')!r} does not match its key")
        data = _read_member(tar, member, bundle)
        if len(data) != entry.get("size") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise ValueError(f"{bundle}: checksum mismatch for {member}")
        try:
            _decode(kind, key, data)  # also checks the entry's own version/checksum
        except BadEntry as exc:
            raise ValueError(f"{bundle}: invalid entry {member}: {exc}") from None
        listed.add(member)
        verified.append((kind, key, data))
    extra = [n for n in tar.getnames() if n not in listed]
    if extra:
        raise ValueError(f"{bundle}: members not in the manifest: {extra[:5]}")
    return verified


# --------------------------------------------------------------------------
# Process-wide default
# --------------------------------------------------------------------------

_default: Optional[Cache] = None
_default_guard = threading.Lock()


def get_cache() -> Cache:
    """The process-wide Cache for the current settings (rebuilt if they change)."""
    global _default
    conf = settings()
    with _default_guard:
        if _default is None or _default.root != conf.cache_dir or _default.disk_requested != conf.disk_cache:
            _default = Cache(conf.cache_dir, disk=conf.disk_cache)
        return _default
