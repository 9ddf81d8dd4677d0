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

import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Optional

from . import files
from .entries import KEY_RE, BadEntry, now_iso

log = logging.getLogger("lazytriton.cache")

MAGIC = b"LTV1"
SUBDIR, EXT = "verdicts", ".ltv"
OK, FAULT, HANG = "ok", "fault", "hang"
VERDICTS = (OK, FAULT, HANG)

_memory: dict[tuple[str, str], dict] = {}  # (cache dir, key) -> document, off the disk
_guard = threading.Lock()
_warned: set[str] = set()


def binary_id(image: bytes) -> str:
    """A binary's identity: the sha256 of its image."""
    return hashlib.sha256(image).hexdigest()


def encode(key: str, doc: dict) -> bytes:
    body = json.dumps({**doc, "key": key}, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(key: str, data: bytes) -> dict:
    """The verdict document stored under `key`; BadEntry when it is not an intact one."""
    if len(data) < 36 or data[:4] != MAGIC:
        raise BadEntry("not a verdict document")
    body = data[36:]
    if hashlib.sha256(body).digest() != data[4:36]:
        raise BadEntry("checksum mismatch")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise BadEntry(f"bad JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("key") != key or doc.get("verdict") not in VERDICTS:
        raise BadEntry("the document is for another key, or says no verdict")
    return doc


def _path(cache: Any, key: str) -> Path:
    return Path(cache.dir) / SUBDIR / f"{key}{EXT}"


def _say_once(what: str, message: str, *args: Any) -> None:
    with _guard:
        first = what not in _warned
        _warned.add(what)
    (log.warning if first else log.info)(message, *args)


def lookup(cache: Any, key: str) -> Optional[dict]:
    """The verdict stored under `key` (a binary's id or its compile key), or None:
    {"verdict", "reason", "binary", "compile_key", "kernel_name", "config", "device_name", "when"}."""
    if not key or not KEY_RE.match(key):
        return None
    mem = _memory.get((str(cache.dir), key))
    if mem is not None or not cache.on_disk:
        return dict(mem) if mem else None
    path = _path(cache, key)
    try:
        data, st = files.read_file(path)
    except OSError:
        return None
    try:
        return decode(key, data)
    except BadEntry as exc:
        _say_once("corrupt", "discarding the invalid verdict %s: %s", path, exc)
        if files.same_file(path, st):
            with contextlib.suppress(OSError):
                os.unlink(path)
        return None


def record(cache: Any, binary: str, compile_key: Optional[str], kernel_name: str, config: str, verdict: str,
           reason: str = "", device_name: str = "") -> dict:
    """Keeps a binary's verdict under its id and its compile key; returns the document."""
    if verdict not in VERDICTS:
        raise ValueError(f"a verdict is one of {VERDICTS}, not {verdict!r}")
    doc = {"verdict": verdict, "reason": reason, "binary": binary, "compile_key": compile_key,
           "kernel_name": kernel_name, "config": config, "device_name": device_name, "when": now_iso()}
    for key in dict.fromkeys(k for k in (binary, compile_key) if k and KEY_RE.match(k)):
        if cache.on_disk:
            path = _path(cache, key)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                files.atomic_write(path, encode(key, doc))
                _memory.pop((str(cache.dir), key), None)
                continue
            except OSError as exc:
                _say_once("write", "cannot write verdicts into %s (%s); keeping them in memory", path.parent, exc)
        _memory[(str(cache.dir), key)] = {**doc, "key": key}
    return doc


def failed(doc: Optional[dict]) -> bool:
    return doc is not None and doc["verdict"] != OK


def in_words(doc: dict) -> str:
    """A failed verdict in words, for errors and logs."""
    what = "hung past the bound" if doc["verdict"] == HANG else f"faulted ({doc.get('reason') or 'no reason given'})"
    return f"{what} in its isolated first launch ({doc.get('when', '?')}{', ' + doc['device_name'] if doc.get('device_name') else ''})"


def clear(cache: Any, kernel: Optional[str] = None) -> int:
    """Remove the verdicts (all, or one kernel's) of this cache; returns how many documents."""
    removed = 0
    with _guard:
        for mem_key in [k for k, doc in _memory.items() if k[0] == str(cache.dir)
                        and (kernel is None or doc.get("kernel_name") == kernel)]:
            del _memory[mem_key]
            removed += 1
    try:
        paths = sorted((Path(cache.dir) / SUBDIR).iterdir())
    except OSError:
        return removed
    for path in paths:
        key = path.name[:-len(EXT)] if path.name.endswith(EXT) else ""
        if not KEY_RE.match(key):
            continue
        if kernel is not None:
            try:
                doc = json.loads(path.read_bytes()[36:])
            except (OSError, ValueError):
                doc = {}
            if not isinstance(doc, dict) or doc.get("kernel_name") != kernel:
                continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed
