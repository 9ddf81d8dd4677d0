"""The remote tier behind the local cache (LAZYTRITON_REMOTE_CACHE): a local miss
asks it, a local tune publishes to it. It is asked only on a first call of a
specialization and when its result is published, never on a launch.

Keys, under ``lazytriton:v{FORMAT_VERSION}:`` (the local cache's own keys: the
hashes already cover the kernel, the specialization, the target, Triton's and
ptxas' versions, lazytriton's version; a tuning record's key adds the configs,
the GPU model and the CUDA driver):

    rec:<tuning key>      a tuning record (the local cache's entry bytes)
    bin:<compile key>     a compiled binary without its image: name, launch
                          metadata, TTIR, and the sha256 of the image
    blob:<sha256>         the image itself (cubin/hsaco), stored once whatever
                          compile keys share it
    meas:<measure key>    the measured time of every config tried for one
                          specialization on one GPU model (measurements.py)

Every value but a blob is an envelope: ``b"LTR1" | sha256(rest) | u32 length |
JSON head | body``; the head says what the entry is and what wrote it (kind,
key, kernel, format, Triton and lazytriton versions; a record's GPU model and
driver), the body is the local cache's entry, with its own checksum and key.
A blob is checked against its hash. An entry that fails a check (corrupt) or was
written for another environment than its key says (foreign) is a miss: removed,
said once. Faults of the server (unreachable, slower than the timeout, refusing
writes) are one warning and the local cache's behaviour; after one, the tier is
left alone for LAZYTRITON_REMOTE_CACHE_RETRY_AFTER seconds, so that a program's
later first calls do not each wait for the timeout."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import struct
import threading
import time
from typing import Any, Callable, Optional

from ... import settings
from ..entries import BadEntry, CompiledBinary, TuningRecord, decode_binary, decode_record, encode_binary
from ..keys import FORMAT_VERSION, lazytriton_version, triton_version
from .backend import Backend, Misconfigured, RemoteError, Refused, open_backend, redact

log = logging.getLogger("lazytriton.cache")

# What was said, per server and kind of fault: once per process, however many tiers (caches) it has.
_said: set[tuple[str, str]] = set()
_said_guard = threading.Lock()

NAMESPACE = f"lazytriton:v{FORMAT_VERSION}:"
KINDS = ("rec", "bin", "blob", "meas")
KIND_TITLES = {"rec": "record", "bin": "binary", "blob": "blob", "meas": "measurements"}
MAGIC = b"LTR1"
_HEAD = struct.Struct("<4s32sI")  # magic, sha256 of what follows, JSON head length


class Foreign(BadEntry):
    """An entry, intact, written for another environment than the one its key names."""


def envelope(head: dict, body: bytes) -> bytes:
    text = json.dumps(head, sort_keys=True, separators=(",", ":"), default=repr).encode()
    rest = text + body
    return _HEAD.pack(MAGIC, hashlib.sha256(rest).digest(), len(text)) + rest


def open_envelope(data: bytes) -> tuple[dict, bytes]:
    """(head, body) of an envelope; BadEntry when it is not an intact one."""
    if len(data) < _HEAD.size:
        raise BadEntry(f"truncated ({len(data)} bytes)")
    magic, digest, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise BadEntry(f"bad magic {magic!r}")
    rest = data[_HEAD.size:]
    if hashlib.sha256(rest).digest() != digest:
        raise BadEntry("checksum mismatch")
    if head_len > len(rest):
        raise BadEntry("head overruns the entry")
    try:
        head = json.loads(rest[:head_len])
    except ValueError as exc:
        raise BadEntry(f"bad JSON head: {exc}") from None
    if not isinstance(head, dict):
        raise BadEntry("head is not an object")
    return head, rest[head_len:]


def writer() -> dict:
    """What every entry's head says about the software that wrote it; a reader refuses a
    difference (its key should have differed: the entry is foreign)."""
    return {"format": FORMAT_VERSION, "triton": triton_version(), "lazytriton": lazytriton_version()}


@dataclasses.dataclass
class RemoteEntry:
    """One remote entry, for `lazytriton cache list --remote`."""
    kind: str
    key: str
    size: int
    kernel_name: str = "?"
    device_name: Optional[str] = None
    winner_config: Optional[dict] = None
    blob: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class RemoteCache:
    """The remote tier of one Cache. Thread-safe; every public lookup returns None
    and every publish returns quietly when the server fails (see the module doc)."""

    def __init__(self, url: str, backend: Optional[Backend] = None) -> None:
        self.url = url
        self.shown = redact(url)
        self._backend = backend
        self._disabled = False
        self._down_until = 0.0
        self._was_down = False
        self._guard = threading.Lock()
        self._opening = threading.Lock()
        self._warming: Optional[threading.Thread] = None
        self.stats = {"hits": 0, "misses": 0, "published": 0, "not_published": 0, "failures": 0, "discarded": 0,
                      "wait_s": 0.0}

    def __repr__(self) -> str:
        return f"RemoteCache({self.shown!r})"

    # -- plumbing ----------------------------------------------------------------------------

    def _say_once(self, what: str, message: str, *args: Any) -> None:
        with _said_guard:
            first = (self.url, what) not in _said
            _said.add((self.url, what))
        (log.warning if first else log.info)(message, *args)

    def backend(self) -> Backend:
        """The backend, opened on first use; RemoteError if it cannot be (the client is missing)."""
        with self._opening:
            if self._backend is None:
                self._backend = open_backend(self.url, settings.remote_cache_timeout())
            return self._backend

    def warm_up(self) -> None:
        """Import the client and connect on a background thread (once), so that a first call does
        not wait for it (importing Redis' client takes ~0.1 s, connecting a round trip or more)."""
        with self._guard:
            if self._warming is not None:
                return
            self._warming = threading.Thread(target=self._connect, name="lazytriton-remote-cache-connect",
                                             daemon=True)
        self._warming.start()

    def _connect(self) -> None:
        try:
            self._request("connecting", lambda b: b.ping(), True)
        except Exception as exc:  # noqa: BLE001  (a thread's fault is no traceback: the process may be exiting)
            log.debug("lazytriton remote cache %s: connecting in the background failed: %s", self.shown, exc)

    def _count(self, name: str, n: float = 1) -> None:
        with self._guard:
            self.stats[name] += n

    def _request(self, what: str, fn: Callable[[Backend], Any], background: bool = False) -> tuple[bool, Any]:
        """(True, fn(backend)) or (False, None) when the server failed or is left alone for now.
        stats["wait_s"]: the time callers waited (background requests: none)."""
        if self._disabled or time.monotonic() < self._down_until:
            return False, None
        t0 = time.perf_counter()  # the client's import and connection included
        try:
            backend = self.backend()
        except RemoteError as exc:
            self._disabled = True
            self._say_once("client", "lazytriton remote cache %s: %s; using the local cache only", self.shown, exc)
            return False, None
        try:
            result = fn(backend)
        except Misconfigured as exc:
            self._count("failures")
            self._disabled = True
            self._say_once("misconfigured", "lazytriton remote cache %s refuses this client (%s, while %s): "
                           "check LAZYTRITON_REMOTE_CACHE's password and database index; using the local cache "
                           "only", self.shown, exc, what)
            return False, None
        except Refused as exc:
            self._count("failures")
            self._say_once("refused", "lazytriton remote cache %s refuses writes (%s, while %s): what is not "
                           "published stays in the local cache (size the server's maxmemory, or let it evict: "
                           "README, 'A fleet cache on Redis')", self.shown, exc, what)
            return False, None
        except Exception as exc:  # unreachable, slow, or a fault of the client: never the caller's failure
            self._count("failures")
            if not isinstance(exc, RemoteError):
                exc = RemoteError(f"{type(exc).__name__}: {exc}")
            retry = settings.remote_cache_retry_after()
            self._down_until = time.monotonic() + retry
            self._was_down = True
            self._say_once("unavailable", "lazytriton remote cache %s is unreachable or slow (%s, while "
                           "%s); using the local cache only, trying it again in %.0f s "
                           "(LAZYTRITON_REMOTE_CACHE_RETRY_AFTER)", self.shown, exc, what, retry)
            return False, None
        finally:
            if not background:
                self._count("wait_s", time.perf_counter() - t0)
        if self._was_down:
            self._was_down = False
            log.info("lazytriton remote cache %s answers again", self.shown)
        return True, result

    def _name(self, kind: str, key: str) -> str:
        return f"{NAMESPACE}{kind}:{key}"

    def _get(self, kind: str, key: str) -> Optional[bytes]:
        ttl = settings.remote_cache_ttl()
        ok, value = self._request(f"looking up the {KIND_TITLES[kind]} {key[:16]}",
                                  lambda b: b.get(self._name(kind, key), ttl))
        return value if ok else None

    def _put(self, kind: str, key: str, value: bytes, if_absent: bool = False) -> bool:
        """Whether the server took the request (with if_absent, an existing value counts as stored)."""
        limit = settings.remote_cache_max_entry()
        if len(value) > limit:
            self._count("not_published")
            self._say_once("size", "lazytriton remote cache: the %s %s is %d bytes, more than "
                           "LAZYTRITON_REMOTE_CACHE_MAX_ENTRY (%d): kept in the local cache only",
                           KIND_TITLES[kind], key[:16], len(value), limit)
            return False
        ttl = settings.remote_cache_ttl()
        ok, _ = self._request(f"publishing the {KIND_TITLES[kind]} {key[:16]}",
                              lambda b: b.put(self._name(kind, key), value, ttl, if_absent=if_absent))
        return ok

    def _discard(self, kind: str, key: str, exc: BadEntry) -> None:
        self._count("discarded")
        what = "foreign" if isinstance(exc, Foreign) else "corrupt"
        self._say_once(what, "lazytriton remote cache %s: discarding the %s %s %s: %s (a miss; rebuilt and published "
                       "again)", self.shown, what, KIND_TITLES[kind], key[:16], exc)
        self._request(f"removing the {KIND_TITLES[kind]} {key[:16]}", lambda b: b.delete([self._name(kind, key)]))

    def _open(self, kind: str, key: str, data: bytes, expect: Optional[dict] = None) -> tuple[dict, bytes]:
        head, body = open_envelope(data)
        if head.get("kind") != kind or head.get("key") != key:
            raise BadEntry(f"the entry is the {head.get('kind')} {str(head.get('key'))[:16]}, not this one")
        mine = {**writer(), **(expect or {})}
        theirs = {k: head.get(k) for k in mine}
        if theirs != mine:
            diff = ", ".join(f"{k} {theirs[k]!r} (here {mine[k]!r})" for k in mine if theirs[k] != mine[k])
            raise Foreign(f"written for {diff}")
        return head, body

    # -- lookups (first calls) -------------------------------------------------------------------

    def fetch_record(self, key: str, expect: Optional[dict] = None) -> Optional[bytes]:
        """The local cache's entry bytes of the tuning record `key`, checked, or None. expect:
        what the record must say ({"device_name":, "driver_version":}) to be for this process."""
        data = self._get("rec", key)
        if data is None:
            self._count("misses")
            return None
        try:
            head, body = self._open("rec", key, data, expect)
            rec = decode_record(key, body)
            said = {"device_name": rec.device_name, "driver_version": rec.driver_version}
            if {k: head.get(k) for k in said} != said:
                raise BadEntry(f"the head says {head.get('device_name')!r}, the record {rec.device_name!r}")
        except BadEntry as exc:
            self._discard("rec", key, exc)
            return None
        self._count("hits")
        return body

    def fetch_binary(self, key: str) -> Optional[bytes]:
        """The local cache's entry bytes of the compiled binary `key` (its image fetched by
        content hash), checked, or None."""
        data = self._get("bin", key)
        if data is None:
            self._count("misses")
            return None
        try:
            head, body = self._open("bin", key, data)
            shell = decode_binary(key, body)
            digest = head.get("blob")
            if not isinstance(digest, str) or len(digest) != 64:
                raise BadEntry("no image hash in the head")
        except BadEntry as exc:
            self._discard("bin", key, exc)
            return None
        image = self._get("blob", digest)
        if image is None:  # evicted before the entry naming it
            self._count("misses")
            return None
        if hashlib.sha256(image).hexdigest() != digest:
            self._discard("blob", digest, BadEntry("the image does not hash to its key"))
            return None
        self._count("hits")
        return encode_binary(key, dataclasses.replace(shell, cubin=image))

    def fetch_measurements(self, key: str, decode: Callable[[bytes], Any]) -> Any:
        """decode(body) of the measurements `key`, or None; a body decode refuses is discarded."""
        data = self._get("meas", key)
        if data is None:
            return None
        try:
            _, body = self._open("meas", key, data)
            return decode(body)
        except BadEntry as exc:
            self._discard("meas", key, exc)
            return None

    # -- publishing (after a tune) ---------------------------------------------------------------

    def publish(self, key: str, record: TuningRecord, record_bytes: bytes, binary: Optional[CompiledBinary],
                binary_key: str) -> bool:
        """Publish a tuning record and its winner's binary (the image once per content). Not
        published: a record adopted from another rank (its tuner published it), one chosen untuned
        (LAZYTRITON_TUNING=off) and one whose binary is not at hand. Returns whether it was."""
        if record.extra.get("agreed") or record.extra.get("untuned") or binary is None:
            return False
        if not self.publish_binary(binary_key, binary):
            return False
        head = {**writer(), "kind": "rec", "key": key, "kernel": record.kernel_name,
                "device_name": record.device_name, "driver_version": record.driver_version}
        if not self._put("rec", key, envelope(head, record_bytes)):
            return False
        self._count("published")
        log.info("kernel %s: published its tuned winner to the remote cache %s", record.kernel_name, self.shown)
        return True

    def publish_binary(self, key: str, binary: CompiledBinary) -> bool:
        digest = hashlib.sha256(binary.cubin).hexdigest()
        if not self._put("blob", digest, bytes(binary.cubin), if_absent=True):  # stored once per content
            return False
        shell = encode_binary(key, dataclasses.replace(binary, cubin=b""))
        head = {**writer(), "kind": "bin", "key": key, "kernel": binary.name, "blob": digest,
                "image_size": len(binary.cubin)}
        return self._put("bin", key, envelope(head, shell))

    def publish_measurements(self, key: str, kernel_name: str, body: bytes) -> bool:
        head = {**writer(), "kind": "meas", "key": key, "kernel": kernel_name}
        return self._put("meas", key, envelope(head, body))

    # -- management (`lazytriton cache ... --remote`): errors are raised, not hidden -------------

    def _scan(self) -> list[tuple[str, str, int]]:
        out = []
        for name, size in self.backend().scan(NAMESPACE):
            kind, _, key = name[len(NAMESPACE):].partition(":")
            if kind in KINDS and key:
                out.append((kind, key, size))
        return out

    def _inspect(self, kind: str, key: str, size: int) -> tuple[RemoteEntry, Optional[str]]:
        """(the entry, why it is invalid or None), its value read without renewing its expiry."""
        entry = RemoteEntry(kind=KIND_TITLES[kind], key=key, size=size)
        if kind == "blob":
            return entry, None
        data = self.backend().get(self._name(kind, key), 0)
        if data is None:
            return entry, "gone"
        try:
            head, body = open_envelope(data)
            entry.kernel_name = str(head.get("kernel", "?"))
            entry.device_name = head.get("device_name")
            entry.blob = head.get("blob")
            if kind == "rec":
                rec = decode_record(key, body)
                entry.winner_config = rec.winner_config
            self._open(kind, key, data)
        except BadEntry as exc:
            if entry.kernel_name == "?":
                entry.kernel_name = "<invalid>"
            return entry, str(exc)
        return entry, None

    def entries(self) -> list[RemoteEntry]:
        """Every lazytriton entry on the server (records first)."""
        order = {k: i for i, k in enumerate(KINDS)}
        found = [self._inspect(*raw)[0] for raw in sorted(self._scan(), key=lambda r: (order[r[0]], r[1]))]
        return found

    def show(self, key_prefix: str) -> dict:
        """The one entry whose key starts with key_prefix; KeyError (none), ValueError (several)."""
        prefix = key_prefix.strip().lower()
        matches = [raw for raw in self._scan() if prefix and raw[1].startswith(prefix)]
        if not matches:
            raise KeyError(f"no remote cache entry matches {key_prefix!r}")
        if len(matches) > 1:
            listed = ", ".join(f"{KIND_TITLES[k]}:{key[:16]}" for k, key, _ in matches[:5])
            raise ValueError(f"{len(matches)} remote entries match {key_prefix!r} ({listed}...); give more characters")
        kind, key, size = matches[0]
        entry, error = self._inspect(kind, key, size)
        out: dict[str, Any] = {**entry.to_dict(), "server": self.shown, "valid": error is None}
        if error is not None:
            out["error"] = error
            return out
        if kind in ("rec", "meas", "bin"):
            head, body = open_envelope(self.backend().get(self._name(kind, key), 0) or b"")
            out["head"] = head
            if kind == "rec":
                out["record"] = decode_record(key, body).to_dict()
        return out

    def clear(self, kernel: Optional[str] = None) -> int:
        """Remove every lazytriton entry (or those of one kernel, with the images no other entry
        names); returns how many."""
        raw = self._scan()
        if kernel is None:
            names = [self._name(k, key) for k, key, _ in raw]
        else:
            described = [(k, key, self._inspect(k, key, size)[0]) for k, key, size in raw if k != "blob"]
            gone = [(k, key, e) for k, key, e in described if e.kernel_name == kernel]
            kept_blobs = {e.blob for _, _, e in described if e.kernel_name != kernel and e.blob}
            blobs = {e.blob for _, _, e in gone if e.blob} - kept_blobs
            names = [self._name(k, key) for k, key, _ in gone] + [self._name("blob", b) for b in sorted(blobs)]
        return self.backend().delete(names) if names else 0


def from_settings() -> Optional[RemoteCache]:
    """The remote tier LAZYTRITON_REMOTE_CACHE names, or None (SettingError for a malformed URL)."""
    url = settings.remote_cache_url()
    return RemoteCache(url) if url else None
