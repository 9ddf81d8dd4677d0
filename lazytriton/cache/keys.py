"""Cache keys for compiled binaries and tuning records.

A key is the hex sha256 of a canonical JSON document describing everything
that can change the result it names.  The rule is "never wrong": when in doubt
a part goes into the key, because a spurious miss costs a recompile while a
wrong hit launches the wrong binary.

Triton is imported lazily so that ``from lazytriton.cache.keys import
FORMAT_VERSION`` (used by the on-disk cache) stays cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import logging
import os
import threading
import types
from typing import Any, Mapping

log = logging.getLogger("lazytriton.cache.keys")

# Version of the on-disk storage format and of the key recipe.  Bump it when
# either changes: every key embeds it and the cache lives under v{N}/.
FORMAT_VERSION = 1

# Environment variables that change the generated code but that Triton does
# not report through get_cache_invalidating_env_vars() because its own cache
# covers them differently (e.g. through the ptxas version in backend.hash()).
EXTRA_ENV_VARS = (
    "TRITON_PTXAS_PATH",
    "TRITON_PTXAS_BLACKWELL_PATH",
    "TRITON_LIBDEVICE_PATH",
    "TRITON_MOCK_PTX_VERSION",
    "PTXAS_OPTIONS",
    "TRITON_AMD_CODEGEN_PATH",
)

# Env vars that only say where things live; used only by the fallback scan,
# where including them would just make every machine miss.
_LOCATION_ENV_VARS = frozenset({
    "TRITON_CACHE_DIR",
    "TRITON_HOME",
    "TRITON_DUMP_DIR",
    "TRITON_OVERRIDE_DIR",
    "TRITON_CACHE_MANAGER",
    "TRITON_REMOTE_CACHE_BACKEND",
})


# --------------------------------------------------------------------------
# Canonical encoding
# --------------------------------------------------------------------------


def _is_jit_callable(value: Any) -> bool:
    # JITFunction / JITCallable define cache_key as a class property and wrap
    # a python fn; look at the class so the property is not evaluated here.
    return isinstance(getattr(type(value), "cache_key", None), property) and hasattr(value, "fn")


def _key_str(key: Any) -> str:
    """Stringify a mapping key; non-str keys get a prefix no identifier has."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or not isinstance(key, (int, tuple)):
        return "repr:" + repr(key)
    if isinstance(key, int):
        return f"#{key}"
    # Path tuples such as (0,) or (1, 2) used by Triton for nested args.
    return "(" + ",".join(_key_str(k) for k in key) + ")"


def canonical(value: Any) -> Any:
    """Return a JSON-able, unambiguous rendering of ``value``.

    Floats are tagged with their repr so 1 and 1.0 (which compile differently
    as constexprs), nan and inf all stay distinct and exact.  JIT functions
    passed as values are rendered by their fingerprint so that editing them
    changes the key.  Anything else unknown falls back to type + repr.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {_key_str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        # Set iteration order depends on the hash seed: sort for stability.
        return {"set": sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if _is_jit_callable(value):
        return {"jit": getattr(value, "__qualname__", repr(value)), "fingerprint": kernel_fingerprint(value)}
    if type(value).__name__ == "constexpr" and hasattr(value, "value"):
        # tl.constexpr(3) and 3 specialise identically.
        return canonical(value.value)
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__qualname__}.{value.name}", "value": canonical(value.value)}
    if isinstance(value, (types.FunctionType, types.MethodType)):
        # A Python function a kernel reads (a tl.constexpr-wrapped combine function, say): its
        # name and its code, never its address.
        return {"function": f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}",
                "code": _code_digest(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__qualname__, "fields": fields}
    text = repr(value)
    if " at 0x" in text:
        # An address-bearing repr differs per process: the key will always
        # miss, which is safe but worth knowing about.
        log.debug("value %s has a non-deterministic repr; keys using it will not be reused", text)
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}", "repr": text}


def canonical_json(parts: Any) -> str:
    return json.dumps(canonical(parts), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _code_digest(fn: Any) -> str:
    """sha256 of a Python function's source (its bytecode and constants where
    the source cannot be read), and of the functions it closes over."""
    import inspect

    fn = getattr(fn, "__func__", fn)
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = repr((code.co_code, code.co_consts, code.co_names)) if code is not None else repr(fn)
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _cell_filled(c)]
    extra = [_code_digest(c) for c in cells if isinstance(c, types.FunctionType)]
    return hashlib.sha256("\0".join([text, *extra]).encode()).hexdigest()


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def hash_parts(parts: Any) -> str:
    """sha256 hex of the canonical JSON of ``parts``."""
    return hashlib.sha256(canonical_json(parts).encode("ascii")).hexdigest()


# --------------------------------------------------------------------------
# Kernel fingerprint
# --------------------------------------------------------------------------


def _unwrap_jit(fn: Any) -> Any:
    # Autotuner / Heuristics wrap the JITFunction in .fn; accept them too.
    seen = 0
    while not _is_jit_callable(fn) and hasattr(fn, "fn") and seen < 16:
        fn = fn.fn
        seen += 1
    if not _is_jit_callable(fn):
        raise TypeError(f"expected a @triton.jit function, got {type(fn).__name__}")
    return fn


def _referenced_jit(fn: Any) -> list:
    """JIT functions named in fn's code, directly or as module attributes."""
    code = fn.fn.__code__
    get_scope = getattr(fn, "get_capture_scope", None)
    scope = get_scope() if callable(get_scope) else getattr(fn, "__globals__", {})
    found = []
    for name in code.co_names + code.co_freevars:
        value = scope.get(name)
        if _is_jit_callable(value):
            found.append(value)
        elif isinstance(value, types.ModuleType):
            # `helpers.fn(x)`: co_names holds both "helpers" and "fn".
            found.extend(v for v in (getattr(value, attr, None) for attr in code.co_names) if _is_jit_callable(v))
    return found


def _all_used_global_vals(fn: Any) -> dict:
    """fn.used_global_vals merged with those of every transitive JIT callee.

    Triton merges callee globals into the caller's map, but 3.6 merges before
    the callee's map is filled, so a callee's globals can be missing there.
    """
    merged: dict = {}
    seen: set = set()
    stack = [fn]
    while stack:
        current = stack.pop()
        if id(current) in seen or not hasattr(current, "fn"):
            continue
        seen.add(id(current))
        current.cache_key  # fills current.used_global_vals
        merged.update(dict(getattr(current, "used_global_vals", {}) or {}))
        stack.extend(_referenced_jit(current))
    return merged


def _used_globals(fn: Any, used: dict | None = None) -> list:
    """Live values of every global the kernel (transitively) reads.

    fn.cache_key covers only constexpr globals and is memoised, so a global
    that is not a constexpr (e.g. ``OUT_DTYPE = tl.float16``) or that is
    reassigned after the first computation would not show up in it.  Reading
    the live value from the defining namespace makes such edits visible.
    """
    items = []
    for entry_key, entry_val in (_all_used_global_vals(fn) if used is None else used).items():
        name = entry_key[0] if isinstance(entry_key, tuple) else entry_key
        recorded, namespace = entry_val if isinstance(entry_val, tuple) and len(entry_val) == 2 else (entry_val, None)
        current = namespace.get(name, recorded) if isinstance(namespace, dict) else recorded
        items.append([str(name), canonical(current)])
    # id(__globals__) is part of Triton's map key but differs per process.
    items.sort(key=lambda item: (item[0], json.dumps(item[1], sort_keys=True)))
    return items


def _has_address(value: Any) -> bool:
    return " at 0x" in repr(value)


def _stable_code_key(fn: Any, seen: frozenset = frozenset()) -> list:
    """What Triton's cache_key hashes (the source, its first line, the noinline
    flag, every called JIT function's key), with no address in it: the values
    read are in the fingerprint's "globals", rendered by `canonical`."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    if id(fn) in seen:  # recursion
        return ["recursion", name]
    seen = seen | {id(fn)}
    callees = sorted((_stable_code_key(c, seen) for c in _referenced_jit(fn)), key=json.dumps)
    return [name, getattr(fn, "src", ""), getattr(fn, "starting_line_number", None),
            bool(getattr(fn, "noinline", False)), callees]


_reading = threading.local()


@contextlib.contextmanager
def one_reading():
    """Within it, this thread reads each kernel's fingerprint (its globals' values) and the
    environment once: one call's keys (its tuning key, each candidate's compile key, its
    measurements') see one state, read at the call; the next call reads again."""
    if getattr(_reading, "memo", None) is not None:
        yield
        return
    _reading.memo = {}
    try:
        yield
    finally:
        _reading.memo = None


def _once(what: tuple, read):
    memo = getattr(_reading, "memo", None)
    if memo is None:
        return read()
    if what not in memo:
        memo[what] = read()
    return memo[what]


def kernel_fingerprint(fn: Any) -> str:
    """Identity of a @triton.jit function's code, the same in every process.

    Triton's ``fn.cache_key`` (3.5+) hashes the dedented source, the start
    line, the cache_key of every transitively called JIT function (plus its
    noinline flag) and the constexpr globals read, by their repr.  We add the
    live values of all used globals on top (see _used_globals), and the
    language of a Gluon kernel.  A constexpr global whose repr holds an
    address (a wrapped Python function) makes Triton's key differ in every
    process: then the same parts are hashed without it (_stable_code_key), so
    that a new process finds the winner a former one persisted.
    """
    fn = _unwrap_jit(fn)
    return _once(("kernel", id(fn)), lambda: _fingerprint(fn))


def _fingerprint(fn: Any) -> str:
    triton_key = fn.cache_key  # computing it also fills fn.used_global_vals
    used = _all_used_global_vals(fn)
    if any(_has_address(v[0] if isinstance(v, tuple) else v) for v in used.values()):
        parts = {"code": _stable_code_key(fn), "globals": _used_globals(fn, used)}
    else:
        parts = {"cache_key": triton_key, "globals": _used_globals(fn, used)}
    check = getattr(fn, "is_gluon", None)
    if callable(check) and check():
        # Triton's cache_key hashes the source alone: a @gluon.jit function and a
        # @triton.jit one of the same text (and line) share it, yet compile from
        # different languages. Only Gluon kernels get the part, so every tl
        # kernel's fingerprint (and the keys cached under it) stays as it was.
        parts["language"] = "gluon"
    return hash_parts(parts)


# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------


def lazytriton_version() -> str:
    from ..version import __version__  # read once (reading the metadata again took 60-90 ms of a first call)
    return __version__


def triton_version() -> str:
    import triton
    return str(getattr(triton, "__version__", "unknown"))


@functools.lru_cache(maxsize=1)
def _knob_env_names() -> frozenset:
    """Every env var name a triton.knobs descriptor reads (fallback only)."""
    names = set()
    try:
        from triton import knobs
    except ImportError:
        return frozenset()
    for holder in vars(knobs).values():
        if not isinstance(holder, type):
            continue
        for attr in vars(holder).values():
            key = getattr(attr, "key", None)
            if isinstance(key, str) and key.isupper():
                names.add(key)
    return frozenset(names)


def invalidating_env_vars() -> dict:
    """Env vars that are set and change Triton's generated code."""
    from triton._C import libtriton
    getter = getattr(libtriton, "get_cache_invalidating_env_vars", None)
    if getter is not None:
        found = dict(getter())
    else:
        # Older Triton: be conservative and take every set knob variable.
        found = {name: os.environ[name] for name in _knob_env_names() - _LOCATION_ENV_VARS if name in os.environ}
    for name in EXTRA_ENV_VARS:
        if name in os.environ:
            found[name] = os.environ[name]
    return {str(k): str(v) for k, v in sorted(found.items())}


def environment_parts() -> dict:
    """Everything outside the call itself that can change a binary."""
    return _once(("environment",), _environment_parts)


def _environment_parts() -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "triton_version": triton_version(),
        "lazytriton_version": lazytriton_version(),
        "env": invalidating_env_vars(),
    }


def target_parts(target: Any) -> dict:
    """GPUTarget -> plain dict, read by field name (stable across versions)."""
    return {
        "backend": str(getattr(target, "backend", target)),
        "arch": canonical(getattr(target, "arch", None)),
        "warp_size": canonical(getattr(target, "warp_size", None)),
    }


@functools.lru_cache(maxsize=None)
def _backend_hash_cached(backend: str, arch: Any, warp_size: Any) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    try:
        # For CUDA this is "<ptxas version>-<arch>": a different ptxas makes a
        # different cubin even with identical Triton.
        return str(make_backend(GPUTarget(backend, arch, warp_size)).hash())
    except Exception as exc:  # backend not installed / tool missing
        log.debug("backend hash unavailable for %s/%s: %r", backend, arch, exc)
        return f"unavailable:{type(exc).__name__}"


def backend_hash(target: Any) -> str:
    arch = getattr(target, "arch", None)
    return _backend_hash_cached(str(getattr(target, "backend", "")), arch, getattr(target, "warp_size", None))


# --------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------


def config_parts(config: Any) -> dict:
    """A triton.Config as a dict, with every field that changes a launch."""
    all_kwargs = getattr(config, "all_kwargs", None)
    if callable(all_kwargs):
        parts = dict(all_kwargs())
    else:
        parts = dict(getattr(config, "kwargs", {}) or {})
        for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            value = getattr(config, name, None)
            if value is not None:
                parts[name] = value
    pre_hook = getattr(config, "pre_hook", None)
    if pre_hook is not None:
        # Identify the hook by name; its body is outside our view.
        parts["pre_hook"] = f"{getattr(pre_hook, '__module__', '')}.{getattr(pre_hook, '__qualname__', repr(pre_hook))}"
    return {_key_str(k): canonical(v) for k, v in parts.items()}


def _call_parts(fn: Any, signature: Mapping, constexprs: Mapping, attrs: Mapping, target: Any) -> dict:
    fn = _unwrap_jit(fn)
    return {
        "kernel_name": getattr(fn, "__name__", "?"),
        "kernel": kernel_fingerprint(fn),
        # Signature order is argument order: keep it as a list of pairs.
        "signature": [[_key_str(k), canonical(v)] for k, v in signature.items()],
        "constexprs": canonical(dict(constexprs)),
        "attrs": canonical(dict(attrs)),
        "target": target_parts(target),
        "backend": backend_hash(target),
        "environment": environment_parts(),
    }


def compile_key_document(fn: Any, signature: Mapping, constexprs: Mapping, attrs: Mapping, options: Mapping,
                     target: Any) -> dict:
    """The un-hashed document behind compile_key (for `cache show`)."""
    parts = _call_parts(fn, signature, constexprs, attrs, target)
    parts.update(kind="compile", options=canonical(dict(options)))
    return parts


def tuning_key_document(fn: Any, signature: Mapping, constexprs: Mapping, attrs: Mapping, configs: list,
                    base_options: Mapping, target: Any, device_name: str, tune_key_values: tuple,
                    driver_version: Any = None) -> dict:
    """The un-hashed document behind tuning_key (for `cache show`)."""
    parts = _call_parts(fn, signature, constexprs, attrs, target)
    parts.update(
        kind="tuning",
        # Order matters: the first config is the no-tuning fallback.
        configs=[config_parts(c) for c in configs],
        base_options=canonical(dict(base_options)),
        # An H100 winner must never be reused on an H200.
        device_name=str(device_name),
        tune_key_values=canonical(list(tune_key_values)),
    )
    if driver_version is not None:
        # The CUDA driver's version (cuDriverGetVersion): hosts of a fleet, or of a
        # shared cache directory, on different drivers never share a winner.
        parts["driver_version"] = canonical(driver_version)
    return parts


def compile_key(fn: Any, signature: Mapping, constexprs: Mapping, attrs: Mapping, options: Mapping,
                target: Any) -> str:
    """Key of one compiled binary."""
    return hash_parts(compile_key_document(fn, signature, constexprs, attrs, options, target))


def tuning_key(fn: Any, signature: Mapping, constexprs: Mapping, attrs: Mapping, configs: list,
               base_options: Mapping, target: Any, device_name: str, tune_key_values: tuple,
               driver_version: Any = None) -> str:
    """Key of one tuning record."""
    return hash_parts(
        tuning_key_document(fn, signature, constexprs, attrs, configs, base_options, target, device_name,
                        tune_key_values, driver_version))


def key_document(kind: str, *args: Any, **kwargs: Any) -> dict:
    """key_document("compile", ...) / key_document("tuning", ...): the un-hashed dict."""
    if kind == "compile":
        return compile_key_document(*args, **kwargs)
    if kind == "tuning":
        return tuning_key_document(*args, **kwargs)
    raise ValueError(f"unknown key kind {kind!r} (expected 'compile' or 'tuning')")
