"""Each candidate config's measured time, kept apart from the config list.

A tuning record is keyed by the kernel's whole config list, so editing the list
(adding one config) misses it. Measurements are keyed by what makes two timings
comparable, the config list left out: the kernel's code, the specialization
(argument types, alignment, autotune key values), the compile target, the GPU
model and driver, Triton / ptxas / lazytriton versions, the compile options and
the tuning options (TuneOptions). Under that key, one document holds a result
per config, keyed by the config itself (its parameters, warps, stages...), so
that a kernel whose list changed times only the configs not measured before and
chooses among all of them (lazytriton.runtime.resolve). What is assumed: a time
measured in an earlier process, on the same GPU model with the same software and
options, compares with one measured now (clocks, temperature and other work on
the GPU differ between processes: a few percent, the size of the noise the
tuner's second pass settles among close candidates measured together).

Each document also names its kernel's *family* (the kernel's code, the GPU model and
driver, the compile target: family_key), so that the configs' times on the other
specializations of a kernel can rank its candidates for one it has never met
(`evidence`: online tuning compiles the likeliest winner first).

On disk: ``<cache>/v{N}/measurements/<key>.ltm`` = ``b"LTM1" | sha256(body) |
body`` (JSON naming its key); corrupt = discarded (said once) and treated as
empty. With a remote tier, documents are merged with the server's and published.
Only successful timings are kept: a config that failed is tried again. Two
processes adding results at once may keep only one's (read, merge, write): a
config whose time was lost is timed again, nothing worse.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Mapping, Optional

from . import files, keys
from .entries import KEY_RE, BadEntry, now_iso

log = logging.getLogger("lazytriton.cache")

MAGIC = b"LTM1"
SUBDIR, EXT = "measurements", ".ltm"

_memory: dict[tuple[str, str], tuple] = {}  # (cache dir, key) -> (kernel, results, family), off the disk
_guard = threading.Lock()
_warned: set[str] = set()


def measure_key(fn: Any, shape_sig: Mapping, options: Mapping, target: Any, device_name: str, tune_key_values: tuple,
                driver_version: Any, tune_options: Any) -> str:
    """The key of one specialization's measurements: a tuning key's parts without the configs,
    with the tuning options."""
    parts = keys.tuning_key_document(fn, shape_sig, {}, {}, [], options, target, device_name, tune_key_values,
                                 driver_version)
    del parts["configs"]
    options_doc = dataclasses.asdict(tune_options) if dataclasses.is_dataclass(tune_options) else tune_options
    options_doc = {k: v for k, v in options_doc.items() if k != "online_samples"}  # online tuning's own
    parts.update(kind="measurements", tune_options=keys.canonical(options_doc))
    return keys.hash_parts(parts)


def family_key(fn: Any, target: Any, device_name: str, driver_version: Any) -> str:
    """What the measurements of every specialization of one kernel on one GPU model share."""
    return keys.hash_parts({"kind": "measurement family", "kernel": keys.kernel_fingerprint(fn),
                            "target": [str(getattr(target, "backend", "")), str(getattr(target, "arch", ""))],
                            "device_name": str(device_name), "driver_version": keys.canonical(driver_version)})


def config_id(config: Any) -> str:
    """A config's identity: the hash of its parameters (None, an un-autotuned kernel's lone one: {})."""
    return keys.hash_parts(keys.config_parts(config) if config is not None else {})


def encode(key: str, kernel_name: str, results: dict, family: str | None = None) -> bytes:
    doc = {"key": key, "kernel_name": kernel_name, "results": results}
    if family:
        doc["family"] = family
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(key: str, data: bytes) -> dict:
    """{config id: result} of a document; BadEntry when it is not an intact one for `key`."""
    if len(data) < 36 or data[:4] != MAGIC:
        raise BadEntry("not a measurements document")
    body = data[36:]
    if hashlib.sha256(body).digest() != data[4:36]:
        raise BadEntry("checksum mismatch")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise BadEntry(f"bad JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("results"), dict):
        raise BadEntry("the document is for another key")
    results = {cid: r for cid, r in doc["results"].items()
               if isinstance(r, dict) and isinstance(r.get("time_ms"), (int, float)) and r["time_ms"] > 0}
    return results


def _path(cache: Any, key: str) -> Path:
    return Path(cache.dir) / SUBDIR / f"{key}{EXT}"


def _say_once(what: str, message: str, *args: Any) -> None:
    with _guard:
        first = what not in _warned
        _warned.add(what)
    (log.warning if first else log.info)(message, *args)


def _load_local(cache: Any, key: str) -> dict:
    mem = _memory.get((str(cache.dir), key))
    if mem is not None or not cache.on_disk:
        return dict(mem[1] if mem else {})
    path = _path(cache, key)
    try:
        data, st = files.read_file(path)
    except OSError:
        return {}
    try:
        return decode(key, data)
    except BadEntry as exc:
        _say_once("corrupt", "discarding the invalid measurements %s: %s", path, exc)
        if files.same_file(path, st):
            with contextlib.suppress(OSError):
                os.unlink(path)
        return {}


def _store_local(cache: Any, key: str, kernel_name: str, results: dict, family: str | None = None) -> None:
    if cache.on_disk:
        path = _path(cache, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            files.atomic_write(path, encode(key, kernel_name, results, family))
            _memory.pop((str(cache.dir), key), None)
            return
        except OSError as exc:
            _say_once("write", "cannot write measurements into %s (%s); keeping them in memory", path.parent, exc)
    _memory[(str(cache.dir), key)] = (kernel_name, dict(results), family)


def lookup(cache: Any, key: str, kernel_name: str, wanted: list[str]) -> dict:
    """{config id: result} of the configs in `wanted` measured before: the local document,
    completed from the remote tier's when it lacks some (and then kept locally too)."""
    with cache.lock(key):
        local = _load_local(cache, key)
        remote = cache.remote
        if remote is not None and any(cid not in local for cid in wanted):
            theirs = remote.fetch_measurements(key, lambda body: decode(key, body))
            if theirs and any(cid not in local for cid in theirs):
                local = {**theirs, **local}
                _store_local(cache, key, kernel_name, local)
    return {cid: local[cid] for cid in wanted if cid in local}


def record(cache: Any, key: str, kernel_name: str, results: dict, family: str | None = None,
           publish: bool = True) -> None:
    """Add these results ({config id: {"config", "time_ms", "compile_key"}}) to the document,
    locally and, with a remote tier and `publish`, on the server (merged with what it has).
    `family`: family_key, for `evidence`."""
    results = {cid: {**r, "measured": r.get("measured") or now_iso()} for cid, r in results.items()
               if isinstance(r.get("time_ms"), (int, float)) and r["time_ms"] > 0}
    if not results:
        return
    with cache.lock(key):
        merged = {**_load_local(cache, key), **results}
        _store_local(cache, key, kernel_name, merged, family)
    remote = cache.remote
    if remote is not None and publish:
        theirs = remote.fetch_measurements(key, lambda body: decode(key, body)) or {}
        remote.publish_measurements(key, kernel_name, encode(key, kernel_name, {**theirs, **merged}, family))


def evidence(cache: Any, family: str, kernel_name: str, exclude: str | None = None) -> dict[str, float]:
    """{config id: its time over the best time of its document, averaged over the documents of
    this family} for this kernel's other specializations measured in this cache (`exclude`:
    a document's key left out, the specialization itself): 1.0 is a config that won wherever it
    was measured. Reads every measurements document of the cache: for a first call only."""
    docs: list[dict] = []
    for (where, key), (name, results, fam) in list(_memory.items()):
        if where == str(cache.dir) and fam == family and name == kernel_name and key != exclude:
            docs.append(results)
    if cache.on_disk:
        try:
            paths = sorted((Path(cache.dir) / SUBDIR).glob(f"*{EXT}"))
        except OSError:
            paths = []
        for path in paths:
            key = path.name[:-len(EXT)]
            if key == exclude:
                continue
            try:
                data = path.read_bytes()
                doc = json.loads(data[36:])
                if isinstance(doc, dict) and doc.get("family") == family and doc.get("kernel_name") == kernel_name:
                    docs.append(decode(key, data))
            except (OSError, ValueError, BadEntry):
                continue
    ratios: dict[str, list[float]] = {}
    for results in docs:
        best = min((r["time_ms"] for r in results.values()), default=None)
        for cid, r in results.items():
            ratios.setdefault(cid, []).append(r["time_ms"] / best)
    return {cid: sum(v) / len(v) for cid, v in ratios.items()}


def clear(cache: Any, kernel: Optional[str] = None) -> int:
    """Remove the measurements (all, or one kernel's) of this cache; returns how many documents."""
    removed = 0
    with _guard:
        for mem_key in [k for k, (name, *_) in _memory.items() if k[0] == str(cache.dir)
                        and (kernel is None or name == kernel)]:
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
