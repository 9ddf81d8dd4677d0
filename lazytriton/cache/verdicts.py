"""What each compiled binary did on its first launch, isolated in a helper process
(lazytriton.runtime.isolation): ran clean ("ok"), faulted ("fault", with the driver's
error name) or hung past the bound ("hang").

A verdict is kept per binary, keyed by the binary's own hash (sha256 of the cubin or
HSACO): a binary proven clean is never isolated again, by this process or a later one
(a warm start launches with no helper at all), and a binary that faulted is never
launched again. The same document is also kept under the binary's compile key, so that
a later process skips compiling a config whose binary failed (it knows the binary only
after compiling it).

What is assumed: a binary that ran clean on one call's data runs clean on later calls
(the specialization, which the binary is compiled for, pins dtypes, alignment and the
autotune key's values; data a kernel reads to compute addresses is not pinned). A
failed binary stays failed: LAZYTRITON_RETUNE=1 tries it again (isolated again).

On disk: ``<cache>/v{N}/verdicts/<key>.ltv`` = ``b"LTV1" | sha256(body) | body`` (JSON
naming its key); corrupt = discarded (said once) and treated as absent.
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional

from .documents import Documents
from .entries import KEY_RE, BadEntry, now_iso

SUBDIR, EXT = "verdicts", ".ltv"
OK, FAULT, HANG = "ok", "fault", "hang"
VERDICTS = (OK, FAULT, HANG)


def _check(doc: dict) -> None:
    if doc.get("verdict") not in VERDICTS:
        raise BadEntry("the document says no verdict")


_DOCS = Documents("verdict", b"LTV1", SUBDIR, EXT, _check)


def binary_id(image: bytes) -> str:
    """A binary's identity: the sha256 of its image."""
    return hashlib.sha256(image).hexdigest()


def encode(key: str, doc: dict) -> bytes:
    return _DOCS.seal(key, doc)


def decode(key: str, data: bytes) -> dict:
    """The verdict document stored under `key`; BadEntry when it is not an intact one."""
    return _DOCS.unseal(key, data)


def lookup(cache: Any, key: str) -> Optional[dict]:
    """The verdict stored under `key` (a binary's id or its compile key), or None:
    {"verdict", "reason", "binary", "compile_key", "kernel_name", "config", "device_name", "when"}."""
    if not key or not KEY_RE.match(key):
        return None
    return _DOCS.read(cache, key)


def record(cache: Any, binary: str, compile_key: Optional[str], kernel_name: str, config: str, verdict: str,
           reason: str = "", device_name: str = "") -> dict:
    """Keeps a binary's verdict under its id and its compile key; returns the document."""
    if verdict not in VERDICTS:
        raise ValueError(f"a verdict is one of {VERDICTS}, not {verdict!r}")
    doc = {"verdict": verdict, "reason": reason, "binary": binary, "compile_key": compile_key,
           "kernel_name": kernel_name, "config": config, "device_name": device_name, "when": now_iso()}
    for key in dict.fromkeys(k for k in (binary, compile_key) if k and KEY_RE.match(k)):
        _DOCS.write(cache, key, doc)
    return doc


def failed(doc: Optional[dict]) -> bool:
    return doc is not None and doc["verdict"] != OK


def in_words(doc: dict) -> str:
    """A failed verdict in words, for errors and logs."""
    what = "hung past the bound" if doc["verdict"] == HANG else f"faulted ({doc.get('reason') or 'no reason given'})"
    return f"{what} in its isolated first launch ({doc.get('when', '?')}{', ' + doc['device_name'] if doc.get('device_name') else ''})"


def clear(cache: Any, kernel: Optional[str] = None) -> int:
    """Remove the verdicts (all, or one kernel's) of this cache; returns how many documents."""
    return _DOCS.clear(cache, kernel)
