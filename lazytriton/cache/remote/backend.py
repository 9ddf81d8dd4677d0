"""What a remote cache server must do for lazytriton: a small key-value interface
(get, put, delete, scan) over bytes, with an expiry per key. Redis is one
implementation (redis_backend.py); an object store could be another (get = GET
object, put = PUT object with a lifecycle rule for the expiry, scan = list by
prefix). The tier above it (tier.py) does the framing, the checks and the
fault handling; a backend only reports its faults as the two exceptions below."""
from __future__ import annotations

import abc
import importlib
import urllib.parse
from typing import Iterator, Optional


class RemoteError(Exception):
    """A remote cache request failed; the tier turns it into a miss (one warning)."""


class Unavailable(RemoteError):
    """The server cannot be reached, or did not answer within the timeout."""


class Refused(RemoteError):
    """The server answered but refuses the write (full under maxmemory with noeviction, read-only)."""


class Misconfigured(RemoteError):
    """The server answered but refuses this client as LAZYTRITON_REMOTE_CACHE sets it up (no or a wrong
    password, a database index it does not have): no retry mends that, the process leaves the tier alone."""


class Backend(abc.ABC):
    """A remote key-value store. Keys are short ASCII strings; values are bytes.
    Every method raises Unavailable, Refused or Misconfigured for a failed request, nothing else."""

    url: str  # for messages: the URL without its password

    @abc.abstractmethod
    def get(self, key: str, ttl_s: float) -> Optional[bytes]:
        """The value of `key`, or None; a hit renews its expiry to `ttl_s` (0: none)."""

    @abc.abstractmethod
    def put(self, key: str, value: bytes, ttl_s: float, *, if_absent: bool = False) -> bool:
        """Store `value` under `key`, expiring after `ttl_s` seconds (0: never). if_absent: an
        existing value is left as it is (its expiry renewed) and False returned."""

    @abc.abstractmethod
    def delete(self, keys: list[str]) -> int:
        """Remove these keys; returns how many existed."""

    @abc.abstractmethod
    def scan(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size in bytes) of every key starting with `prefix`, in no particular order."""

    def ping(self) -> None:
        """Make sure a connection is open (raises as the other methods do)."""
        self.get("lazytriton:ping", 0)

    def close(self) -> None:
        """Release connections (the backend may be used again: it reconnects)."""


# scheme -> "module:Class" of the backend serving it (imported only when used, so that the
# client library is needed only by those who set LAZYTRITON_REMOTE_CACHE).
BACKENDS = {
    "redis": "lazytriton.cache.remote.redis_backend:RedisBackend",
    "rediss": "lazytriton.cache.remote.redis_backend:RedisBackend",
    "unix": "lazytriton.cache.remote.redis_backend:RedisBackend",
}


def redact(url: str) -> str:
    """The URL with its password replaced by ***."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def open_backend(url: str, timeout_s: float) -> Backend:
    """The backend for `url` (its scheme picks it). Raises RemoteError when the backend's client
    library is missing."""
    scheme = url.partition("://")[0].lower()
    where = BACKENDS.get(scheme)
    if where is None:
        raise RemoteError(f"no remote cache backend for {scheme}:// URLs (known: {', '.join(sorted(BACKENDS))})")
    module, _, cls = where.partition(":")
    return getattr(importlib.import_module(module), cls)(url, timeout_s)
