"""The small JSON documents a cache keeps beside its entries, one file a key
(measurements.py: each config's measured time; verdicts.py: what each binary did
on its isolated first launch): how they are sealed, read, written and cleared.

On disk: ``<cache>/v{N}/<subdir>/<key><ext>`` = ``magic | sha256(body) | body``,
the body a JSON object naming its key. A corrupt one is discarded (said once)
and read as absent; a cache that is not on disk, or whose folder cannot be
written (said once), keeps them in this process's memory.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from . import files
from .entries import KEY_RE, BadEntry

log = logging.getLogger("lazytriton.cache")


class Documents:
    """One kind of document: `what` names it in messages; `check(doc)` raises BadEntry for a
    document of the right seal that this kind does not accept."""

    def __init__(self, what: str, magic: bytes, subdir: str, ext: str,
                 check: Callable[[dict], None] = lambda doc: None) -> None:
        self.what, self.magic, self.subdir, self.ext, self.check = what, magic, subdir, ext, check
        self._memory: dict[tuple[str, str], dict] = {}  # (cache dir, key) -> document, off the disk
        self._guard = threading.Lock()
        self._warned: set[str] = set()

    def seal(self, key: str, doc: dict) -> bytes:
        body = json.dumps({**doc, "key": key}, sort_keys=True, separators=(",", ":")).encode()
        return self.magic + hashlib.sha256(body).digest() + body

    def unseal(self, key: str, data: bytes) -> dict:
        """The document sealed in `data` for `key`; BadEntry when it is not an intact one."""
        if len(data) < 36 or data[:4] != self.magic:
            raise BadEntry(f"not a {self.what} document")
        body = data[36:]
        if hashlib.sha256(body).digest() != data[4:36]:
            raise BadEntry("checksum mismatch")
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise BadEntry(f"bad JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("key") != key:
            raise BadEntry("the document is for another key")
        self.check(doc)
        return doc

    def say_once(self, what: str, message: str, *args: Any) -> None:
        with self._guard:
            first = what not in self._warned
            self._warned.add(what)
        (log.warning if first else log.info)(message, *args)

    def _path(self, cache: Any, key: str) -> Path:
        return Path(cache.dir) / self.subdir / f"{key}{self.ext}"

    def read(self, cache: Any, key: str) -> Optional[dict]:
        """The document kept under `key` in this cache, or None."""
        mem = self._memory.get((str(cache.dir), key))
        if mem is not None or not cache.on_disk:
            return dict(mem) if mem is not None else None
        path = self._path(cache, key)
        try:
            data, st = files.read_file(path)
        except OSError:
            return None
        try:
            return self.unseal(key, data)
        except BadEntry as exc:
            self.say_once("corrupt", f"discarding the invalid {self.what} %s: %s", path, exc)
            if files.same_file(path, st):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return None

    def write(self, cache: Any, key: str, doc: dict) -> None:
        if cache.on_disk:
            path = self._path(cache, key)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                files.atomic_write(path, self.seal(key, doc), durable=False)  # sealed: lost, never wrong
                self._memory.pop((str(cache.dir), key), None)
                return
            except OSError as exc:
                self.say_once("write", f"cannot write {self.what} into %s (%s); keeping them in memory", path.parent,
                              exc)
        self._memory[(str(cache.dir), key)] = {**doc, "key": key}

    def scan(self, cache: Any) -> Iterator[tuple[str, dict, Optional[bytes]]]:
        """(key, document, its sealed bytes or None for one in memory) of every document of this
        cache whose body reads as JSON (not checked: `unseal` the bytes of those that matter)."""
        for (where, key), doc in list(self._memory.items()):
            if where == str(cache.dir):
                yield key, doc, None
        if not cache.on_disk:
            return
        try:
            paths = sorted((Path(cache.dir) / self.subdir).glob(f"*{self.ext}"))
        except OSError:
            return
        for path in paths:
            key = path.name[:-len(self.ext)]
            if not KEY_RE.match(key):
                continue
            try:
                data = path.read_bytes()
                doc = json.loads(data[36:])
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict):
                yield key, doc, data

    def clear(self, cache: Any, kernel: Optional[str] = None) -> int:
        """Removes the documents (all, or one kernel's: their "kernel_name") of this cache; returns how many."""
        removed = 0
        with self._guard:
            for mem_key in [k for k, doc in self._memory.items() if k[0] == str(cache.dir)
                            and (kernel is None or doc.get("kernel_name") == kernel)]:
                del self._memory[mem_key]
                removed += 1
        try:
            paths = sorted((Path(cache.dir) / self.subdir).iterdir())
        except OSError:
            return removed
        for path in paths:
            key = path.name[:-len(self.ext)] if path.name.endswith(self.ext) else ""
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
