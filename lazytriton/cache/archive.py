"""Cache archives: a .tar.gz of entries with a manifest, for moving tuned
kernels between machines (`lazytriton cache export/import`, `lazytriton pretune`).

An import verifies the whole archive (manifest, member checksums, each entry's
own header and key) before installing anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
import time
import zlib
from pathlib import Path
from typing import Iterable, Iterator, Optional, Protocol

from .keys import FORMAT_VERSION, lazytriton_version
from . import files
from .entries import KEY_RE, KIND_BINARY, KIND_NAMES, KIND_RECORD, SUBDIRS, BadEntry, decode, now_iso, triton_version


class Entries(Protocol):
    """What an export reads of a cache (cache.store.Cache is one): the archive
    module sits below the store, which imports it for `import`."""

    disk_requested: bool

    def all_raw(self) -> Iterator[tuple[int, str, Optional[Path]]]: ...

    def read_raw(self, kind: int, key: str, path: Optional[Path]) -> Optional[bytes]: ...

    def entry_path(self, kind: int, key: str) -> Path: ...

log = logging.getLogger("lazytriton.cache")

# The manifest's format name (its value predates the module's name: archives
# written before stay importable, and older lazytriton reads new ones).
ARCHIVE_FORMAT = "lazytriton-cache-bundle"
_MANIFEST = "manifest.json"


def _member(kind: int, key: str) -> str:
    sub, ext = SUBDIRS[kind]
    return f"{sub}/{key}{ext}"


def _entry_bytes(cache: Entries, kind: int, key: str) -> Optional[bytes]:
    data = cache.read_raw(kind, key, None)
    if data is None and cache.disk_requested:
        data = cache.read_raw(kind, key, cache.entry_path(kind, key))
    return data


def _selected(cache: Entries, kernel: Optional[str], records: Optional[Iterable[str]]):
    """(kind, key, bytes, decoded) of the entries to export."""
    if records is None:
        for kind, key, src in cache.all_raw():
            data = cache.read_raw(kind, key, src)
            try:
                obj = decode(kind, key, data or b"")
            except BadEntry as exc:
                log.warning("not exporting invalid entry %s: %s", src or key, exc)
                continue
            name = obj.name if kind == KIND_BINARY else obj.kernel_name
            if kernel is None or name == kernel:
                yield kind, key, data, obj
        return
    # Named tuning records and the one binary each needs (its winner): no losers.
    for key in dict.fromkeys(records):
        wanted = [(KIND_RECORD, key)]
        got = []
        while wanted:
            kind, k = wanted.pop()
            data = _entry_bytes(cache, kind, k)
            try:
                obj = decode(kind, k, data or b"")
            except BadEntry as exc:
                log.warning("not exporting tuning record %s: its %s %s is %s", key[:16], KIND_NAMES[kind],
                            k[:16], "missing" if not data else f"invalid ({exc})")
                got = None
                break
            got.append((kind, k, data, obj))
            if kind == KIND_RECORD:
                wanted.append((KIND_BINARY, obj.winner))
        if got and (kernel is None or got[0][3].kernel_name == kernel):
            yield from got


def export(cache: Entries, path: os.PathLike | str, kernel: Optional[str] = None,
           records: Optional[Iterable[str]] = None) -> int:
    """Write the selected valid entries to a .tar.gz archive; return how many."""
    members: list[tuple[str, bytes]] = []
    manifest_entries = []
    seen = set()
    for kind, key, data, obj in _selected(cache, kernel, records):
        member = _member(kind, key)
        if member in seen:  # two records may share a winner binary
            continue
        seen.add(member)
        members.append((member, data))
        entry = {"member": member, "kind": KIND_NAMES[kind], "key": key,
                 "kernel_name": obj.name if kind == KIND_BINARY else obj.kernel_name,
                 "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if kind == KIND_RECORD:
            entry["device_name"] = obj.device_name
        manifest_entries.append(entry)
    manifest = {
        "format": ARCHIVE_FORMAT,
        "format_version": FORMAT_VERSION,
        "lazytriton_version": lazytriton_version(),
        "triton_version": triton_version(),
        "created": now_iso(),
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
    files.atomic_write(Path(path), buf.getvalue())
    return len(members)


def verify(path: os.PathLike | str) -> list[tuple[int, str, bytes]]:
    """(kind, key, bytes) of every entry of an archive, all verified; ValueError otherwise."""
    try:
        tar = tarfile.open(path, mode="r:*")
    except (tarfile.TarError, OSError) as exc:
        raise ValueError(f"{path}: not a readable lazytriton archive ({exc})") from None
    with tar:
        try:
            return _verify_archive(tar, str(path))
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:  # cut short or corrupt inside
            raise ValueError(f"{path}: not a readable lazytriton archive, nothing imported "
                             f"({type(exc).__name__}: {exc})") from None


def _read_member(tar: tarfile.TarFile, name: str, archive: str) -> bytes:
    try:
        info = tar.getmember(name)
    except KeyError:
        raise ValueError(f"{archive}: missing member {name}") from None
    if not info.isfile():
        raise ValueError(f"{archive}: member {name} is not a regular file")
    # extractfile() reads in memory: nothing is written outside the cache.
    return tar.extractfile(info).read()


def _verify_archive(tar: tarfile.TarFile, archive: str) -> list[tuple[int, str, bytes]]:
    try:
        manifest = json.loads(_read_member(tar, _MANIFEST, archive))
    except ValueError as exc:
        raise ValueError(f"{archive}: bad manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ARCHIVE_FORMAT:
        raise ValueError(f"{archive}: not a lazytriton cache archive")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{archive}: archive has cache format version {manifest.get('format_version')}, "
                         f"this lazytriton uses {FORMAT_VERSION}; re-export it with a matching lazytriton")
    kinds = {name: kind for kind, name in KIND_NAMES.items()}
    listed = {_MANIFEST}
    verified = []
    for entry in manifest.get("entries") or []:
        kind = kinds.get(entry.get("kind"))
        key = entry.get("key")
        if kind is None or not isinstance(key, str) or not KEY_RE.match(key):
            raise ValueError(f"{archive}: bad manifest entry {entry!r}")
        member = _member(kind, key)
        if entry.get("member") != member:
            raise ValueError(f"{archive}: manifest entry {entry.get('member')!r} does not match its key")
        data = _read_member(tar, member, archive)
        if len(data) != entry.get("size") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise ValueError(f"{archive}: checksum mismatch for {member}")
        try:
            decode(kind, key, data)  # also checks the entry's own version/checksum
        except BadEntry as exc:
            raise ValueError(f"{archive}: invalid entry {member}: {exc}") from None
        listed.add(member)
        verified.append((kind, key, data))
    extra = [n for n in tar.getnames() if n not in listed]
    if extra:
        raise ValueError(f"{archive}: members not in the manifest: {extra[:5]}")
    return verified
