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

import dataclasses
from typing import Any, Mapping, Optional

from . import keys
from .documents import Documents
from .entries import BadEntry, now_iso


def _check(doc: dict) -> None:
    if not isinstance(doc.get("results"), dict):
        raise BadEntry("the document holds no results")


SUBDIR, EXT = "measurements", ".ltm"
_DOCS = Documents("measurements", b"LTM1", SUBDIR, EXT, _check)


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
    return _DOCS.seal(key, _doc(kernel_name, results, family))


def _doc(kernel_name: str, results: dict, family: str | None) -> dict:
    doc = {"kernel_name": kernel_name, "results": results}
    if family:
        doc["family"] = family
    return doc


def _results(doc: dict) -> dict:
    """The document's successful timings: {config id: result}."""
    return {cid: r for cid, r in doc["results"].items()
            if isinstance(r, dict) and isinstance(r.get("time_ms"), (int, float)) and r["time_ms"] > 0}


def decode(key: str, data: bytes) -> dict:
    """{config id: result} of a document; BadEntry when it is not an intact one for `key`."""
    return _results(_DOCS.unseal(key, data))


def _load_local(cache: Any, key: str) -> dict:
    doc = _DOCS.read(cache, key)
    return _results(doc) if doc is not None else {}


def _store_local(cache: Any, key: str, kernel_name: str, results: dict, family: str | None = None) -> None:
    _DOCS.write(cache, key, _doc(kernel_name, dict(results), family))


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
    for key, doc, data in _DOCS.scan(cache):
        if key == exclude or doc.get("family") != family or doc.get("kernel_name") != kernel_name:
            continue
        try:
            docs.append(decode(key, data) if data is not None else _results(doc))
        except BadEntry:
            continue
    ratios: dict[str, list[float]] = {}
    for results in docs:
        best = min((r["time_ms"] for r in results.values()), default=None)
        for cid, r in results.items():
            ratios.setdefault(cid, []).append(r["time_ms"] / best)
    return {cid: sum(v) / len(v) for cid, v in ratios.items()}


def clear(cache: Any, kernel: Optional[str] = None) -> int:
    """Remove the measurements (all, or one kernel's) of this cache; returns how many documents."""
    return _DOCS.clear(cache, kernel)
