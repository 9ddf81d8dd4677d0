"""What the cache stores and how an entry is framed on disk.

Every entry file is ``header || payload`` where the header is
``magic b"LTC1" | u16 format version | u16 kind | u64 payload length |
sha256(payload)``.  A binary's payload is ``u32 JSON length | JSON | raw
cubin``; a record's payload is JSON.  Both JSON documents repeat the entry's
key, so a file copied or renamed under another key is refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import re
import struct
from typing import Any, ClassVar, Optional

from .keys import FORMAT_VERSION, lazytriton_version

log = logging.getLogger("lazytriton.cache")

MAGIC = b"LTC1"
# magic, format version, kind, payload length, sha256(payload)
_HEADER = struct.Struct("<4sHHQ32s")
_JSON_LEN = struct.Struct("<I")  # binary payloads: length of the JSON part

KIND_BINARY = 1
KIND_RECORD = 2
KIND_NAMES = {KIND_BINARY: "binary", KIND_RECORD: "record"}
# kind -> (subdirectory, file extension), on disk and in archives
SUBDIRS = {KIND_BINARY: ("binaries", ".ltb"), KIND_RECORD: ("records", ".ltr")}

KEY_RE = re.compile(r"^[0-9a-f]{8,128}$")


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
    # The parameters its TTIR may write (runtime.tuner.writes): read once, when it is stored, so
    # that a first call of a binary compiled ahead does not read it on its way. None: not read yet.
    written: Optional[list[str]] = None

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


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def triton_version() -> str:
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
    triton_version: str = dataclasses.field(default_factory=triton_version)
    lazytriton_version: str = dataclasses.field(default_factory=lazytriton_version)
    created: str = dataclasses.field(default_factory=now_iso)
    tune_key_values: list = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)
    # Where the record was read from, for the line a first call that uses it logs (never stored;
    # Cache sets it on a record the remote tier gave).
    origin: ClassVar[str] = "the cache"

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
        **({"written": binary.written} if binary.written is not None else {}),
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
                              asm_names=list(head.get("asm_names") or []), ttir=head.get("ttir"),
                              written=_written(head.get("written")))
    except (KeyError, TypeError) as exc:
        raise BadEntry(f"malformed binary header: {exc!r}") from None


def _written(v: Any) -> Optional[list[str]]:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
        raise BadEntry("malformed binary header: written")
    return v


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


def decode(kind: int, key: str, data: bytes) -> Any:
    return decode_binary(key, data) if kind == KIND_BINARY else decode_record(key, data)


def check_key(key: str) -> str:
    # Keys become file names: only accept what our hashes produce.
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(f"invalid cache key {key!r} (expected lowercase hex)")
    return key


def peek_binary_head(path) -> Optional[dict]:
    """A stored binary's JSON header, read without the (possibly large) cubin."""
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
