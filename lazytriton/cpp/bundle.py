"""Bundles: tuned winners that C++ programs launch without Python.

A bundle is a directory::

    manifest.json          kernels (their call parameters) and variants (tuned winners)
    cubins/<sha256>.cubin  the winners' binaries

written here (`Bundle.add` from Python, or the C++ lazy mode through
lazytriton.cpp.embed) and read by the C++ runtime (lazytriton/bundle.h). A variant
is one winner for one specialization of a call, and holds what the C++ side
needs to pick it for a call and launch it: the call's slot table (the rows
lazytriton.model.specialize.Shape.table() gives the Python stubs: how each argument is
read, packed and keyed; the C++ binder walks them), the argument types and Triton's
specialization of each (16-byte alignment, == 1, % 16), the constexprs, the
autotune-key (and heuristic-read) values, which arguments are kernel
parameters, the winner's meta-parameters and its launch metadata.

    b = lazytriton.cpp.Bundle("/srv/model/kernels")
    b.add(my_kernel, x, y, out, n, grid=lambda m: (triton.cdiv(n, m["BLOCK"]),))
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from .. import paths
from ..model import specialize, tuples
from ..model import tensor_desc
from ..model.arrays import DeviceArray, is_array
from ..cache import atomic_write
from ..model.spec import KernelSpec, KernelSpecError, ReadRecorder
from ..model.spec import kernel_spec
from ..model.contract import BUNDLE_VERSION
from ..model.specialize import BUNDLE_OPTION_NAMES, check_option

log = logging.getLogger("lazytriton.cpp.bundle")

FORMAT = "lazytriton-bundle"
VERSION = BUNDLE_VERSION  # 2: each variant carries its call's slot table ("table"); version 1 is refused
MANIFEST = "manifest.json"


def default_dir() -> Path:
    """The bundle inside lazytriton's cache (what lt::Bundle::open_cache() reads)."""
    return paths.cache_root() / "bundle"


# -- kernels -------------------------------------------------------------------------


def _spec_of(kernel: Any) -> KernelSpec:
    spec = getattr(kernel, "spec", None)
    return spec if isinstance(spec, KernelSpec) else kernel_spec(kernel)


def source_of(kernel: Any) -> str:
    """"module:function" naming a Triton kernel (the object the module defines)."""
    fn = _spec_of(kernel).fn.fn
    return f"{fn.__module__}:{fn.__qualname__}"


def load_source(source: str) -> Any:
    """The kernel object that "module:function" names."""
    module, sep, attr = source.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"kernel {source!r}: name it as module:function (e.g. my_kernels:add_kernel)")
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"kernel {attr}: cannot import module {module!r} ({exc}); put its directory on "
                          "sys.path (PYTHONPATH, or LazyOptions::python_path in C++)") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"kernel {attr}: module {module!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def _supplied(spec: KernelSpec) -> set[str]:
    return spec.supplied_names()


def _heuristic_reads(spec: KernelSpec, call_params: list) -> set[str] | None:
    """Call arguments the heuristics read, found by running them on stand-in
    values; None if they could not run on those (then every argument counts)."""
    return _probe_heuristics(spec, call_params)[0]


def _probe_heuristics(spec: KernelSpec, call_params: list) -> tuple[set[str] | None, set[str] | None]:
    """(call arguments, names the heuristics set) the heuristics read, run on
    stand-in values; (None, None) if they could not run on those."""
    if not spec.heuristics:
        return set(), set()
    named = {p.name: (16 if p.default is inspect.Parameter.empty else p.default) for p in call_params}
    read: set[str] = set()
    try:
        for layer in spec.heuristics:
            cfg = spec.configs[0].all_kwargs() if layer.inside_autotune and spec.configs else {}
            for fn in layer.values.values():
                rec = ReadRecorder({**named, **cfg})
                fn(rec)
                read |= named.keys() | spec.heuristic_names() if ReadRecorder.ALL in rec.read else rec.read
    except Exception as exc:  # a heuristic that needs real values: key on every argument instead
        log.debug("kernel %s: heuristics did not run on stand-in values (%s)", spec.name, exc)
        return None, None
    return read & named.keys(), read & spec.heuristic_names()


def _overwritten(spec: KernelSpec, call_params: list) -> set[str]:
    """The keywords a call may pass and the heuristics overwrite (Triton's Heuristics.run):
    set by a heuristic, not by a config, and read by no heuristic, so that dropping the
    call's value changes nothing. (One a heuristic reads would have to key each launch.)"""
    _, self_read = _probe_heuristics(spec, call_params)
    if self_read is None:
        return set()
    candidates = spec.heuristic_names() - {k for c in spec.configs for k in c.all_kwargs()} - self_read
    return candidates - spec.heuristics_may_read(candidates)


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def describe(kernel: Any, source: str | None = None) -> dict:
    """The kernel's entry in a bundle manifest: its call parameters (those not
    chosen by configs or heuristics) and how each is specialized."""
    spec = _spec_of(kernel)
    supplied = _supplied(spec)
    call_params = [p for p in spec.params if p.name not in supplied]
    # A C++ call names launch options and constexprs in one map (Bundle::kernel), so a call
    # parameter named like an option (num_warps: tl.constexpr) would be read as both; refused
    # until C++ calls can say which (one set by the configs or heuristics is no call parameter).
    clash = [p.name for p in call_params if p.name in BUNDLE_OPTION_NAMES]
    if clash:
        raise KernelSpecError(f"kernel {spec.name}: C++ bundles do not take a parameter named like a launch "
                              f"option ({', '.join(clash)}) that a call passes; call it from Python or JAX, "
                              "or rename the parameter")
    reads = _heuristic_reads(spec, call_params)
    params = []
    for p in call_params:
        f = specialize.flags_of(p)
        d = {"name": p.name, "constexpr": f.constexpr, "annotation": f.annotation if not f.constexpr else "",
             "specialize": f.specialize, "align": f.divisible,  # "align": do_not_specialize turns it off too
             "key": p.name in spec.tune_keys or reads is None,
             "heuristic": reads is not None and p.name in reads}
        if p.default is not inspect.Parameter.empty and _jsonable(p.default):
            d["default"] = p.default
        params.append(d)
    return {"name": spec.name, "source": source or source_of(kernel), "autotuned": bool(spec.configs),
            "params": params, "supplied": sorted(supplied), "overwritten": sorted(_overwritten(spec, call_params))}


# -- variants --------------------------------------------------------------------------


def _flags(param: dict) -> specialize.Flags:
    return specialize.Flags(param.get("constexpr", False), param["annotation"], param["specialize"], param["align"])


def _slot(param: dict, value: Any, what: str, in_key: bool = False) -> specialize.Slot:
    """The runtime argument's slot, as the Python stubs read it: the bundle describes
    each argument with the same rules (lazytriton.model.specialize)."""
    slot = specialize.slot_for(_flags(param), value, in_key, what)
    if slot.kind == "constexpr":  # a tl.constexpr or @jit value for a plain parameter
        raise TypeError(f"{what}: unsupported argument type {type(value).__name__}")
    specialize.check_launchable(slot, value, what)
    return slot


def arg_type(param: dict, value: Any, what: str) -> str:
    """The kernel parameter type of a runtime argument, as lazytriton's stubs pack it
    (a tensor descriptor's: Triton's type, tensordesc<fp16[64, 64]>)."""
    return specialize.kernel_type(_slot(param, value, what), value, what)


def arg_spec(param: dict, value: Any, what: str = "argument") -> str:
    """Triton's specialization of one runtime argument: "16", "1" or "" (a descriptor: none)."""
    return specialize.spec_suffix(_slot(param, value, what), value)


def _check_heuristics(desc: dict, lk: Any) -> None:
    # The C++ side keys calls on the described arguments only: the Python
    # runtime's own probe must not have found more (a variant made without a kernel object: nothing to check).
    if lk is None:
        return
    if lk.heuristics_in_python:
        raise TypeError(f"kernel {desc['name']}: its heuristics read array arguments, so they need Python on "
                        "every call; the C++ launch path cannot evaluate them")
    keyed = {p["name"] for p in desc["params"] if p["key"] or p["heuristic"]}
    extra = set(lk.heuristic_reads or ()) - keyed
    if extra:
        raise RuntimeError(f"kernel {desc['name']}: its heuristics read {sorted(extra)}, which the bundle "
                           "description did not find; please report this")


def specialize_values(desc: dict, values: list, options: dict) -> tuple[list, list, dict, dict, list, list]:
    """(types, specs, constexprs, key_values, layout, table) of a call's `values`: the kernel
    parameter type and Triton's specialization of each leaf (as the stubs read it,
    lazytriton.model.specialize), the constexprs (`options` among them), the keyed
    values, per call parameter its tuple nesting ("" for a plain argument), and the
    call's slot table (specialize.Shape.table(): one row per leaf, what the C++ binder walks)."""
    name = desc["name"]
    types, specs, constexprs, key_values, layout, slots = [], [], dict(options), {}, [], []
    for p, v in zip(desc["params"], values):
        if p["constexpr"] or v is None:
            types.append("constexpr")
            specs.append("")
            constexprs[p["name"]] = v
            layout.append("")
            slots.append(specialize.Slot("constexpr", folded=not p["constexpr"]))
            continue
        elem = p
        if specialize.takes_tuple(_flags(p), v):  # its elements, specialized as Triton's binder does
            te = specialize.TUPLE_ELEMENT
            elem = {**p, "annotation": te.annotation, "specialize": te.specialize, "align": te.divisible}
        layout.append(tuples.structure_text(v))
        keyed = p["key"] or p["heuristic"]
        for sub, leaf in tuples.leaves(v):
            what = f"kernel {name}, argument {tuples.leaf_name(p['name'], sub)}"
            if sub and (leaf is None or tuples.is_tuple(leaf) or not (is_array(leaf) or isinstance(leaf, (int, float)))):
                raise TypeError(f"{what}: a tuple element that is not an array, an int, a float or a bool (here "
                                f"{type(leaf).__name__}) cannot be in a C++ bundle")
            slot = _slot(elem, leaf, what, keyed)
            slots.append(slot)
            t = specialize.kernel_type(slot, leaf, what)
            types.append(t)
            specs.append(specialize.spec_suffix(slot, leaf))
            if keyed and slot.kind != "ptr":
                # a float's key: the double it converts to
                key_values[tuples.leaf_name(p["name"], sub)] = float(leaf) if slot.kind == "float" else leaf
    table = [list(row) for row in specialize.Shape(tuple(types), tuple(slots)).table()]
    return types, specs, constexprs, key_values, layout, table


_DESC_TYPE = re.compile(r"tensordesc<(\w+)\[([\d, ]+)\]>")


def _stand_in(t: str) -> Any:
    """A value whose slot has kernel parameter type `t` (or, annotated, any value its annotation takes)."""
    if t == "constexpr":
        return None
    if t.startswith("*"):
        return DeviceArray(1 << 20, t[1:], 1 << 20)
    m = _DESC_TYPE.fullmatch(t)
    if m:
        block = [int(b) for b in m.group(2).split(",")]
        # Row-major over the block, each outer stride rounded up to 128 elements: a multiple of
        # the 16 bytes the descriptor's checks ask of every stride but the last, whatever the
        # element size and block (a dummy [1, 1] block that a pre_hook replaces included).
        strides = [1] * len(block)
        for i in range(len(block) - 2, -1, -1):
            strides[i] = -(-strides[i + 1] * block[i + 1] // 128) * 128
        elements = 1 + sum((b - 1) * s for b, s in zip(block, strides))
        return tensor_desc.unchecked(DeviceArray(1 << 20, m.group(1), 8 * elements), block, strides, block)
    if t in ("u1", "i1"):
        return False
    return {"i64": 2**40, "u64": 2**63}.get(t, 0.0 if t.startswith(("fp", "bf")) else 0)


def slot_table(desc: dict, types: list, layouts: list | None = None) -> list:
    """The slot table of a C++ signature (lazy mode before its first winner): each leaf's
    row as the stubs read a value of its type `types[i]` ("*fp32", "i64", "constexpr", ...;
    `layouts`: per call parameter "" or its tuple's nesting). A type the kernel's parameter
    cannot take (i32 for a parameter annotated tl.int64) is refused, naming the argument."""
    leaves = iter([_stand_in(t) for t in types])
    values = [tuples.nest(lay, leaves) for lay in (layouts or [""] * len(desc["params"]))]
    got, _, _, _, _, table = specialize_values(desc, values, {})
    names = [tuples.leaf_name(p["name"], sub) for p, v in zip(desc["params"], values)
             for sub, _ in (tuples.leaves(v) if v is not None else [((), None)])]
    for n, want, have in zip(names, types, got):
        if want.replace(" ", "") != have.replace(" ", "") and not (want == "i1" and have == "u1"):
            raise TypeError(f"kernel {desc['name']}, argument {n}: the signature says {want}, but the kernel "
                            f"takes {have} there")
    return table


def make_variant(desc: dict, lk: Any, resolved: Any, values: list, options: dict,
                 device: str | None = None) -> tuple[dict, bytes]:
    """A manifest variant (and its cubin) from LazyKernel.resolve's result for
    `values`; `device` (the GPU's name) defaults to the current device's."""
    _check_heuristics(desc, lk)
    name = desc["name"]
    types, specs, constexprs, key_values, layout, table = specialize_values(desc, values, options)
    i = len(types)  # leaves: a tuple argument has one per element (lazytriton.model.tuples), as resolved.types
    for k, v in {**constexprs, **resolved.meta}.items():
        if not _jsonable(v):
            raise TypeError(f"kernel {name}: {k}={v!r} is not a plain value (None, bool, int, float, str); "
                            "a C++ bundle cannot hold it")
    launch = {k: list(v) if isinstance(v, tuple) else v for k, v in resolved.kernel.metadata.items()}
    if device is None:
        from .. import _core

        device = _core.device_info(_core.current_device())["name"]
    # NVIDIA: the compute capability (90); AMD: the architecture's name ("gfx942").
    variant = {"arch": launch.get("gfx") or launch["arch"], "device": device, "types": types, "specs": specs,
               "table": table, "constexprs": constexprs, "key_values": key_values,
               "is_param": [bool(b) for b in resolved.entry.is_param[:i]],
               "meta": dict(resolved.meta), "launch": launch, "signature": signature_text(types, specs, layout)}
    if any(layout):
        # Tuple arguments: types, specs and is_param have one entry per leaf; "layout" gives, per
        # call parameter, "" or its nesting ("[_,[_,_]]", the leaves in order).
        variant["layout"] = layout
    return variant, bytes(resolved.kernel.cubin)


def target_name(arch) -> str:
    """A variant's "arch" as a target: 90 -> "sm_90", "gfx942" as it is."""
    return arch if isinstance(arch, str) else f"sm_{arch}"


def signature_text(types: list, specs: list, layout: list | None = None) -> str:
    """e.g. "*fp32:16,*fp32:16,i32:16" (constexprs left out); a tuple argument
    as "[*fp32:16,[*fp32,fp32]]"."""
    entries = iter([t + (f":{s}" if s else "") for t, s in zip(types, specs)])
    parts = [tuples.type_text(tuples.nest(lay, entries)) for lay in (layout or [""] * len(types))]
    return ",".join(p for p in parts if p != "constexpr")


def _identity(v: dict) -> tuple:
    return (v["arch"], v["types"], v["specs"], json.dumps(v["constexprs"], sort_keys=True),
            json.dumps(v["key_values"], sort_keys=True), v.get("layout"))


# -- the directory -------------------------------------------------------------------------


def read_manifest(path: os.PathLike | str, heal: bool = False) -> dict:
    """The bundle's manifest (an empty one if the directory has none). One that
    is not JSON (cut short, garbage) is a ValueError, or, with `heal` (a writer
    about to rewrite it), discarded with a warning: only lazytriton writes it."""
    f = Path(path) / MANIFEST
    try:
        doc = json.loads(f.read_bytes())
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    except FileNotFoundError:
        return {"format": FORMAT, "version": VERSION, "kernels": {}}
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError too
        if not heal:
            raise ValueError(f"{f}: not a readable bundle manifest ({exc})") from None
        log.warning("bundle %s: discarding its unreadable manifest (%s); starting a new one (the winners it listed "
                    "are written again as their kernels are added)", path, exc)
        return {"format": FORMAT, "version": VERSION, "kernels": {}}
    if doc.get("format") == FORMAT and isinstance(doc.get("version"), int) and doc["version"] < VERSION:
        raise ValueError(old_version_message(str(path), doc["version"]))
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{f}: not a version-{VERSION} lazytriton bundle")
    return doc


def old_version_message(path: str, version: int) -> str:
    """Why a bundle written by an older lazytriton is refused (the C++ reader says the same)."""
    return (f"bundle {path} was written by an older lazytriton (bundle format version {version}; this one reads "
            f"version {VERSION}, whose variants carry their call's slot table): re-export it (add its kernels again "
            "with lazytriton.cpp.Bundle(dir).add(...), or rebuild it in lazy mode) into a new directory")


@contextlib.contextmanager
def _locked(path: Path):
    with open(path / ".lock", "a") as f:  # writers in other processes wait here
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def write_variant(path: os.PathLike | str, desc: dict, variant: dict, cubin: bytes) -> dict:
    """Adds (or replaces) a variant: cubin first, then the manifest, each
    written atomically, so a reader sees the old bundle or the new one."""
    d = Path(path)
    (d / "cubins").mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(cubin).hexdigest()
    rel = f"cubins/{digest[:32]}.cubin"
    try:
        ok = hashlib.sha256((d / rel).read_bytes()).hexdigest() == digest
    except FileNotFoundError:
        ok = None
    if not ok:
        if ok is False:
            log.warning("bundle %s: replacing %s (its contents do not match its name: a write cut short?)", d, rel)
        atomic_write(d / rel, cubin)
    variant = {**variant, "cubin": rel, "cubin_size": len(cubin), "cubin_sha256": digest}
    with _locked(d):
        manifest = read_manifest(d, heal=True)
        entry = manifest["kernels"].setdefault(desc["source"], {"variants": []})
        entry.update({k: v for k, v in desc.items() if k != "variants"})
        entry["variants"] = [v for v in entry["variants"] if _identity(v) != _identity(variant)] + [variant]
        text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
        atomic_write(d / MANIFEST, text.encode())
    log.info("kernel %s: winner for %s %s written to bundle %s", desc["name"], target_name(variant["arch"]),
             variant["signature"], d)
    return variant


def bind(desc: dict, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """(call values in parameter order, compile options) of a Python-style call."""
    params = desc["params"]
    if len(args) > len(params):
        raise TypeError(f"kernel {desc['name']}: takes {len(params)} arguments, got {len(args)}")
    values, kwargs = list(args), dict(kwargs)
    for p in params[len(args):]:
        if p["name"] in kwargs:
            values.append(kwargs.pop(p["name"]))
        elif "default" in p:
            values.append(p["default"])
        else:
            raise TypeError(f"kernel {desc['name']}: missing argument {p['name']!r}")
    for k in desc.get("overwritten", ()):  # a heuristic overwrites it, reading it not (Triton's Heuristics.run)
        kwargs.pop(k, None)
    bad = [k for k in kwargs if k not in BUNDLE_OPTION_NAMES]
    if bad:
        raise TypeError(f"kernel {desc['name']}: unexpected keyword argument(s) {bad}"
                        + (" (chosen by its configs or heuristics)" if set(bad) & set(desc["supplied"]) else ""))
    for k, v in kwargs.items():
        check_option(k, v, f"kernel {desc['name']}")
    return values, kwargs


class Bundle:
    """A bundle directory (default: the one in lazytriton's cache)."""

    def __init__(self, path: os.PathLike | str | None = None):
        self.path = Path(path) if path is not None else default_dir()

    def __repr__(self) -> str:
        return f"lazytriton.cpp.Bundle({str(self.path)!r})"

    def add(self, kernel: Any, *args, grid: Any = None, stream: Any = None, source: str | None = None,
            **kwargs) -> dict:
        """Resolve the winner for this call (lazytriton's cache, else compile and
        tune on these arguments: then `grid` is needed) and write it into the
        bundle. `kernel`: a Triton kernel, a LazyKernel or "module:function";
        `source` overrides the "module:function" the C++ side names it by."""
        from ..runtime.kernel import LazyKernel

        if isinstance(kernel, str):
            source, kernel = source or kernel, load_source(kernel)
        lk = kernel if isinstance(kernel, LazyKernel) else LazyKernel(kernel)
        desc = describe(lk, source)
        values, options = bind(desc, args, kwargs)
        pos, kw = lk.as_call(values, options)
        resolved = lk.resolve(*pos, grid=grid, stream=stream, **kw)
        variant, cubin = make_variant(desc, lk, resolved, values, options)
        return write_variant(self.path, desc, variant, cubin)

    def manifest(self) -> dict:
        return read_manifest(self.path)

    def variants(self, kernel: str | None = None) -> list[dict]:
        """Every variant (of one kernel, by "module:function" or function name)."""
        out = []
        for source, k in self.manifest()["kernels"].items():
            if kernel in (None, source, k["name"]):
                out += [{"kernel": source, **v} for v in k["variants"]]
        return out


def cli_list(args) -> int:
    """`lazytriton bundle [DIR]`: the kernels and winners of a bundle."""
    b = Bundle(args.dir)
    if args.dir is not None and not (b.path / MANIFEST).is_file():
        why = "no manifest.json in it" if b.path.is_dir() else "no such directory"
        print(f"error: {b.path} is not a lazytriton bundle ({why})", file=sys.stderr)
        return 1
    try:
        manifest = b.manifest()
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(manifest, indent=1, sort_keys=True))
        return 0
    print(f"bundle: {b.path}")
    for source, k in sorted(manifest["kernels"].items()):
        print(f"{source}  ({len(k['variants'])} winner{'s' if len(k['variants']) != 1 else ''})")
        for v in k["variants"]:
            extra = " ".join(f"{n}={x!r}" for n, x in sorted({**v["constexprs"], **v["key_values"]}.items()))
            meta = ", ".join(f"{n}={x}" for n, x in sorted(v["meta"].items()))
            print(f"  {target_name(v['arch'])} {v['signature']} {extra}".rstrip()
                  + f"  -> {meta or 'no meta-parameters'}, num_warps={v['launch'].get('num_warps')}"
                  + f" ({v.get('device', '?')})")
    if not manifest["kernels"]:
        print("(empty)")
    return 0
