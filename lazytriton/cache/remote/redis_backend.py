"""The remote cache on a Redis server, through the official client (`pip install
"lazytriton[redis]"`). Every request is bounded by the timeout (connecting
included) and retried at most once, and only when a pooled connection turns out
to be broken (a restarted server): a slow or unreachable server costs one
timeout, never a wait. Values are plain strings with an expiry (SET ... EX),
renewed by every hit, so that both `allkeys-lru` and `volatile-*` policies can
evict what no one reads."""
from __future__ import annotations

import itertools
from typing import Iterator, Optional

from .backend import Backend, Misconfigured, RemoteError, Refused, Unavailable, redact

_SCAN_BATCH = 500


class RedisBackend(Backend):
    def __init__(self, url: str, timeout_s: float) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise RemoteError("LAZYTRITON_REMOTE_CACHE names a Redis server, but the redis client is not installed "
                              "(pip install \"lazytriton[redis]\")") from None
        self.url = redact(url)
        self._redis = redis
        # One retry on a broken connection only (the pool's connection to a server that restarted);
        # a timeout is never retried: the caller's first call would wait twice.
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                                retry=retry, health_check_interval=0, socket_keepalive=True)
        except ValueError as exc:  # a malformed URL (port, db): the client's own words
            raise RemoteError(f"LAZYTRITON_REMOTE_CACHE={self.url!r}: {exc}") from None

    def _fail(self, exc: Exception) -> RemoteError:
        r = self._redis
        # NOAUTH / WRONGPASS (a ConnectionError to the client) and SELECT's "DB index is out of range"
        # (the URL's /db): the setting's fault, not the server's reach.
        if isinstance(exc, r.AuthenticationError) or (isinstance(exc, r.ResponseError) and "DB index" in str(exc)):
            return Misconfigured(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, r.ResponseError):
            text = str(exc)
            # The client maps OOM / READONLY replies to these classes (and strips the prefix).
            refusals = tuple(getattr(r.exceptions, n) for n in ("OutOfMemoryError", "ReadOnlyError")
                             if hasattr(r.exceptions, n))
            if isinstance(exc, refusals) or text.startswith(("OOM", "READONLY", "MISCONF", "NOREPLICAS")):
                return Refused(text)
            return RemoteError(f"{type(exc).__name__}: {text}")
        if isinstance(exc, (r.ConnectionError, r.TimeoutError)):
            return Unavailable(f"{type(exc).__name__}: {exc}")
        return RemoteError(f"{type(exc).__name__}: {exc}")

    def get(self, key: str, ttl_s: float) -> Optional[bytes]:
        try:
            if not ttl_s:
                return self._client.get(key)
            pipe = self._client.pipeline(transaction=False)
            pipe.get(key)
            pipe.expire(key, max(1, int(ttl_s)))
            value, renewed = pipe.execute(raise_on_error=False)
        except self._redis.RedisError as exc:
            raise self._fail(exc) from None
        if isinstance(value, Exception):
            raise self._fail(value)
        return value  # a failed renewal (a read-only replica) still serves the value

    def put(self, key: str, value: bytes, ttl_s: float, *, if_absent: bool = False) -> bool:
        ex = max(1, int(ttl_s)) if ttl_s else None
        try:
            done = self._client.set(key, value, ex=ex, nx=if_absent)
            if not done and if_absent and ex is not None:
                self._client.expire(key, ex)
        except self._redis.RedisError as exc:
            raise self._fail(exc) from None
        return bool(done)

    def delete(self, keys: list[str]) -> int:
        removed = 0
        try:
            for i in range(0, len(keys), _SCAN_BATCH):
                removed += int(self._client.unlink(*keys[i:i + _SCAN_BATCH]))
        except self._redis.RedisError as exc:
            raise self._fail(exc) from None
        return removed

    def scan(self, prefix: str) -> Iterator[tuple[str, int]]:
        try:
            names = self._client.scan_iter(match=_glob_escape(prefix) + "*", count=_SCAN_BATCH)
            while True:
                batch = list(itertools.islice(names, _SCAN_BATCH))
                if not batch:
                    return
                pipe = self._client.pipeline(transaction=False)
                for name in batch:
                    pipe.strlen(name)
                for name, size in zip(batch, pipe.execute()):
                    yield name.decode() if isinstance(name, bytes) else str(name), int(size)
        except self._redis.RedisError as exc:
            raise self._fail(exc) from None

    def ping(self) -> None:
        try:
            self._client.ping()
        except self._redis.RedisError as exc:
            raise self._fail(exc) from None

    def close(self) -> None:
        self._client.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
