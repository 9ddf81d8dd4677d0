"""The Triton version matrix: lazytriton against the installed Triton's own
binder and launcher, for representative kernels (matrix_kernels.py, and a
Gluon kernel).

For each call of each case it checks, on the CPU (sm_90, no GPU needed):

- binding: what lazytriton compiles for every config (lazytriton.runtime.kernel's
  Resolution._candidates: signature, constexprs, attrs, options) equals what
  Triton's own JITFunction.run decides for the same call (Autotuner/Heuristics/
  JITFunction.warmup, observed through knobs.runtime.jit_cache_hook, nothing
  compiled), configs pruned alike;
- specialization: the bits of the generated C stub's call key, and its slots'
  parameter types, say what Triton's signature and attrs say (== 1 folded to a
  constexpr, % 16 / 16-byte alignment as tt.divisibility); one stub key per
  Triton specialization;
- packing: the kernel parameters the stub packs (types, order, byte sizes, plus
  the two scratch pointers the C++ core appends) equal Triton's launcher's for
  that version (3.5/3.6: the C source make_launcher generates; 3.7+: the
  expanded signature and the argument extractors of backends/nvidia/driver.c)
  and the parameters of the compiled cubin (cuobjdump);
- launch metadata: lazytriton's compiled binary is Triton's (same cubin), and
  what the C++ core reads from its metadata (block, cluster, shared, scratch
  sizes and alignments, cooperative, PDL) is what Triton's launcher uses.

Where this Triton cannot compile a case (a feature it lacks), Triton's own
compile must fail too; the case is then reported as unsupported.

Usage: python tests/triton_versions/check.py [--json] [--case NAME ...]
(exit status 1 on any mismatch). tests/test_triton_versions.py runs it in this
process for the installed Triton, and in each venv setup_venvs.sh made.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parent)):  # matrix_kernels; kernels.gluonk
    if _p not in sys.path:
        sys.path.insert(0, _p)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import _core  # noqa: E402
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DeviceArray  # noqa: E402
from lazytriton.compile.compiler import compile_all  # noqa: E402
from lazytriton.runtime.resolve import Resolution  # noqa: E402

import matrix_kernels as mk  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
TRITON_DIR = Path(triton.__file__).resolve().parent
CUOBJDUMP = TRITON_DIR / "backends" / "nvidia" / "bin" / "cuobjdump"


def arr(addr: int, dtype: str = "fp32", nbytes: int = 1 << 20) -> DeviceArray:
    return DeviceArray(addr, dtype, nbytes)  # an address nothing dereferences


A16 = 0x7F0000000000  # 16-byte aligned
A8 = 0x7F0000000008
A4 = 0x7F0000000104


@dataclass
class Case:
    name: str
    kernel: Any
    calls: list  # (args, kwargs)
    needs: Callable[[], str | None] = lambda: None  # a reason this Triton cannot run the case, or None
    compile_calls: int = 1  # compile the candidates of the first N calls


def _has(module, name: str) -> Callable[[], str | None]:
    return lambda: None if hasattr(module, name) else f"this Triton has no {module.__name__}.{name}"


def _gluon() -> str | None:
    try:
        import kernels.gluonk  # noqa: F401
    except Exception as exc:  # pragma: no cover
        return f"Gluon unavailable: {exc}"
    return None


def cases() -> list[Case]:
    P, out = arr(A16), arr(A16 + 0x100000)

    def sp(p=P, ns_p=P, na_p=P, i=3, ns_i=3, na_i=3, big=2**40 + 3, flag=False, x=0.5, maybe=None):
        return (p, ns_p, na_p, out, i, ns_i, na_i, big, flag, x, maybe), {"BLOCK": 64}

    sp_calls = [sp(), sp(i=1), sp(i=16), sp(i=17, big=2**40 + 16), sp(big=2**63 + 32), sp(big=-2**40 - 3),
                sp(i=2**31 - 16), sp(i=-16), sp(ns_i=1), sp(ns_i=16), sp(na_i=1), sp(na_i=32),
                sp(p=arr(A8)), sp(p=arr(A4)), sp(ns_p=arr(A4)), sp(na_p=arr(A8)), sp(flag=True), sp(x=3),
                sp(maybe=arr(A16 + 0x200000)), sp(maybe=arr(A8)), sp(i=1, big=2**63)]
    sp_calls.append(((P, P, P, out, 16, 1, 32, 2**63 + 16, True, 1.5, arr(A4)), {"BLOCK": 128, "num_warps": 2}))
    sp_calls.append(((P, P, P, out, 3, 3, 3, 5, False, 0.5, None), {"BLOCK": 64, "num_stages": 2, "launch_pdl": True}))

    def an(**kw):
        v = dict(n=3, m=5, k=-3, h=1.5, b=True, g=0.25, bf=3.0, f=2.0)
        v.update(kw)
        return (out, *v.values()), {"BLOCK": 32}

    an_calls = [an(), an(n=1), an(n=16), an(n=2**40), an(m=1), an(m=32), an(k=16), an(b=False), an(b=1),
                an(n=True), an(f=2), an(h=3), an(g=True)]
    ck_calls = [((out, 1000), {"DT": tl.float16, "SCALE": 0.5, "USE": True}),
                ((out, 1000), {"DT": tl.float32, "SCALE": 2, "USE": False, "BLOCK": 128}),
                ((out, 16), {"DT": tl.bfloat16, "SCALE": 1.0, "USE": True})]
    x, acc = arr(A16), arr(A16 + 0x100000)
    tuned = [((x, acc, n), {}) for n in (100, 2048, 4096, 1)]
    outer = [((x, out, n), {}) for n in (100, 64, 1)]
    M = arr(A16, "fp32", 1 << 22)
    tma = [((M, arr(A16 + 0x400000, "fp32", 1 << 22), 256, 512), {"BM": 64, "BN": 64}),
           ((M, arr(A16 + 0x400000, "fp32", 1 << 22), 100, 96), {"BM": 32, "BN": 32})]
    add = [((x, x, out, 5000), {"BLOCK": 256, "num_ctas": 2}), ((x, x, out, 5000), {"BLOCK": 256, "launch_pdl": True})]
    H = arr(A16, "fp16", 1 << 22)
    ws = [((H, arr(A16 + 0x400000, "fp16", 1 << 22), arr(A16 + 0x800000, "fp16", 1 << 22), 256, 256, 256),
           {"BM": 128, "BN": 128, "BK": 64, "num_warps": 4})]
    out_cases = [
        Case("scalars_and_pointers", mk.scalars_and_pointers, sp_calls, compile_calls=3),
        Case("annotated", mk.annotated, an_calls, compile_calls=2),
        Case("constexpr_kinds", mk.constexpr_kinds, ck_calls, compile_calls=1),
        Case("autotune_inner_heuristics", mk.tuned_inner_heuristics, tuned, compile_calls=1),
        Case("autotune_outer_heuristics", mk.tuned_outer_heuristics, outer, compile_calls=1),
        Case("device_tma_descriptor", mk.device_tma_copy, tma, needs=_has(tl, "make_tensor_descriptor")),
        Case("num_ctas_2_and_pdl", mk.blocked_add, add, compile_calls=2),
        Case("warp_specialized_matmul", mk.ws_matmul, ws, needs=_has(tl, "make_tensor_descriptor")),
    ]
    if _gluon() is None:
        from kernels import gluonk

        g = [((x, x, out, 1000), {"BLOCK": 512, "WARPS": 4, "num_warps": 4}),
             ((x, x, out, 1), {"BLOCK": 128, "WARPS": 1, "num_warps": 1})]
        out_cases.append(Case("gluon_vec_add", gluonk.vec_add, g, compile_calls=2))
        out_cases.append(Case("gluon_autotuned", gluonk.vec_add_tuned, [((x, x, out, 4096), {})]))
    else:
        out_cases.append(Case("gluon_vec_add", None, [], needs=_gluon))
    return out_cases


# -- Triton's own binder ----------------------------------------------------------------------------

class _CPUDriver:
    """What JITFunction.run asks its driver before it compiles, answered for a
    machine without a GPU: device 0, stream 0, target sm_90. (With a GPU, the
    real driver answers.) Nothing else of a driver is reached: the jit cache
    hook stops the run before compiling or launching."""

    def __init__(self, target: GPUTarget):
        self._target = target

    def is_active(self):
        return True

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self._target


@contextlib.contextmanager
def _driver():
    from triton.runtime import driver

    if lazytriton.gpu_available()[0]:
        yield
        return
    previous = getattr(driver, "_active", None)  # None: not made yet (it would fail here: no GPU driver)
    driver.set_active(_CPUDriver(TARGET))
    try:
        yield
    finally:
        driver.set_active(previous)


def triton_binds(kernel, args: tuple, kwargs: dict) -> list[dict]:
    """Per config (in Triton's order, after its pruning): the signature,
    constexprs, attrs and options Triton's JITFunction.run would compile."""
    seen = []

    def hook(*, compile, **_):
        data = json.loads(compile["specialization_data"])
        seen.append({"signature": dict(compile["signature"]), "constexprs": dict(compile["constants"]),
                     "attrs": {tuple(k): v for k, v in compile["configs"][0].items()}, "options": data["options"]})
        return True  # stop: nothing is compiled or launched

    previous = knobs.runtime.jit_cache_hook
    with _driver():
        knobs.runtime.jit_cache_hook = hook
        try:
            _warmup(kernel, tuple(args), dict(kwargs))
        finally:
            knobs.runtime.jit_cache_hook = previous
    return seen


def _warmup(kernel, args: tuple, kwargs: dict) -> None:
    """kernel.warmup(*args, grid=(1,), **kwargs) through the wrappers, with
    Autotuner.warmup's and Heuristics.run's own lines for the wrappers: 3.5's
    Heuristics has no warmup (Autotuner.warmup fails on one), and from 3.7 on
    a Heuristics' warmup runs Heuristics.run, which reaches Autotuner.run and
    benchmarks. The binding itself is always JITFunction.run's."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    if isinstance(kernel, Heuristics):
        for v, heur in kernel.values.items():
            kwargs[v] = heur({**dict(zip(kernel.arg_names, args)), **kwargs})
        return _warmup(kernel.fn, args, kwargs)
    if isinstance(kernel, Autotuner):
        kernel.nargs = dict(zip(kernel.arg_names, args))
        try:
            configs = kernel.prune_configs({**kwargs, "grid": (1,)})
        finally:
            kernel.nargs = None
        for config in configs:
            _warmup(kernel.fn, args, {**kwargs, **config.all_kwargs()})
        return None
    kernel.warmup(*args, grid=(1,), **kwargs)


def jit_function(kernel):
    while not isinstance(kernel, triton.runtime.JITFunction):
        kernel = kernel.fn
    return kernel


# -- Triton's launcher: the kernel parameters it packs -----------------------------------------------

_C_SIZES = {"CUdeviceptr": 8, "int8_t": 1, "int16_t": 2, "int32_t": 4, "int64_t": 8, "uint8_t": 1, "uint16_t": 2,
            "uint32_t": 4, "uint64_t": 8, "double": 8, "float": 4, "CUtensorMap": 128}


def triton_launcher_params(signature: dict, constexprs: dict) -> tuple[list[str], list[int], int]:
    """(kernel parameter types, their storage sizes in bytes, hidden scratch
    pointers appended) as this Triton's CUDA launcher packs them."""
    from triton.backends.nvidia import driver as nvd

    if hasattr(nvd, "make_launcher"):  # 3.5, 3.6: a C launcher generated per signature
        src = nvd.make_launcher(constexprs, dict(enumerate(signature.values())), None)
        decl = re.search(r"static void _launch\((.*?)\)\s*\{", src, re.S).group(1)
        params = re.search(r"void \*params\[\] = \{(.*?)\};", src, re.S).group(1)
        args = [a.strip().rsplit(" ", 1) for a in decl.split("CUdeviceptr profile_scratch")[1].split(",") if a.strip()]
        order = [p.strip().lstrip("&") for p in params.split(",") if p.strip()]
        by_name = {name: ctype for ctype, name in args}
        kernel_args = [n for n in order if n.startswith("arg")]
        types = [t for t in _flatten(signature.values()) if t != "constexpr"]
        assert len(types) == len(kernel_args), (types, kernel_args)
        scratch = [n for n in order if not n.startswith("arg")]
        assert scratch == ["global_scratch", "profile_scratch"], order
        return types, [_C_SIZES[by_name[n]] for n in kernel_args], len(scratch)
    # 3.7+: one C launcher, driven by the expanded signature and driver.c's extractors.
    try:  # 3.8+: shared by the backends, told the descriptor's type
        from triton.backends.driver import expand_signature

        expanded = expand_signature(signature.values(), None, "nvTmaDesc")
    except ImportError:  # 3.7: the NVIDIA driver's own
        expanded = nvd.expand_signature(signature.values(), None)
    types = [t for t in _flatten(expanded) if t != "constexpr"]
    sizes = _extractor_sizes()
    src = (TRITON_DIR / "backends" / "nvidia" / "driver.c").read_text()
    scratch = len(re.findall(r"extractPointer\(params\[params_idx\+\+\], (?:global|profile)_scratch_obj\)", src))
    return types, [8 if t.startswith("*") else sizes[t] for t in types], scratch


def _extractor_sizes() -> dict[str, int]:
    """Type name -> storage size from driver.c's extraction_map (3.7+)."""
    src = (TRITON_DIR / "backends" / "nvidia" / "driver.c").read_text()
    out = {}
    for size, names in re.findall(r"\.size\s*=\s*sizeof\((\w+)\),(?:\s*\.alignment\s*=\s*[^,]+,)?\s*\.name\s*=\s*\{([^}]*)\}",
                                  src):
        for n in re.findall(r'"(\w+)"', names):
            out[n] = _C_SIZES[size]
    return out


def _flatten(sig) -> list:
    out = []
    for s in sig:
        out.extend(_flatten(s) if isinstance(s, tuple) else [s])
    return out


def launcher_bytes(t: str, v: Any) -> bytes:
    """The bytes Triton's launcher passes for value v of parameter type t,
    little-endian (the kernel reads the low bytes of a wider storage: u1 is a
    u32 from 3.7 on). Conversions as backends/nvidia's: a C double to float,
    PyFloat_Pack2 for fp16, the fp32's top half for bf16."""
    import ctypes
    import struct

    if t.startswith("*"):
        return int(v.data_ptr()).to_bytes(8, "little")
    if t == "fp16":
        return struct.pack("<e", float(v))
    if t == "bf16":
        return bytes(ctypes.c_float(float(v)))[2:]
    if t == "fp32":
        return bytes(ctypes.c_float(float(v)))
    if t == "fp64":
        return struct.pack("<d", float(v))
    bits = 8 if t == "u1" else int(t[1:])
    return (int(v) & ((1 << bits) - 1)).to_bytes(bits // 8, "little")


def cubin_param_sizes(cubin: bytes) -> list[int] | None:
    if not CUOBJDUMP.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        dump = subprocess.run([str(CUOBJDUMP), "-elf", f.name], capture_output=True, text=True, check=True).stdout
    params = re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+).*?Size\s*:\s*(0x[0-9a-f]+)", dump)
    sizes = {int(o, 16): int(s, 16) for o, s in params}
    return [sizes[i] for i in sorted(sizes)]


# -- Triton's launch metadata --------------------------------------------------------------------------

def triton_launch_plan(compiled) -> dict:
    """What Triton's launcher launches a CompiledKernel with."""
    from triton.compiler import make_backend

    md = compiled.metadata
    packed = make_backend(TARGET).pack_metadata(md)  # (num_warps, num_ctas, shared[, cluster x, y, z])
    cluster = tuple(packed[3:6]) if len(packed) >= 6 else ((md.num_ctas, 1, 1) if md.num_ctas != 1 else (1, 1, 1))
    return {"name": md.name, "threads": 32 * packed[0], "num_ctas": packed[1], "shared": packed[2],
            "cluster": tuple(int(c) for c in cluster),
            "global_scratch": (md.global_scratch_size, md.global_scratch_align),
            "profile_scratch": (md.profile_scratch_size, md.profile_scratch_align),
            "cooperative": bool(md.launch_cooperative_grid), "pdl": bool(md.launch_pdl)}


def lazytriton_launch_plan(binary) -> dict:
    """What lazytriton's C++ core reads from the binary's metadata (csrc/python/core_module.cc)."""
    m = _core.Kernel(binary.cubin, binary.metadata).metadata
    return {"name": m["name"], "threads": 32 * m["num_warps"], "num_ctas": m["num_ctas"], "shared": m["shared"],
            "cluster": tuple(int(c) for c in m["cluster_dims"]),
            "global_scratch": (m["global_scratch_size"], m["global_scratch_align"]),
            "profile_scratch": (m["profile_scratch_size"], m["profile_scratch_align"]),
            "cooperative": bool(m["launch_cooperative_grid"]), "pdl": bool(m["launch_pdl"])}


# Every field of Triton's metadata is one of these two: read by lazytriton's decoder (kernel.cc
# launch_meta_from) and compared here with what it reports back (_core.Kernel(...).metadata), or
# listed as irrelevant to launching, with the reason. A field a new Triton adds is neither, and
# fails the matrix naming it: teach the decoder to read it (and the launch to honour it), or say
# here why a launch does not need it.
def _same(field):
    return lambda theirs, ours: _plain(theirs[field]) == _plain(ours.get(field))


def _target(theirs, ours):  # CUDA: the arch number and the warp size (HIP: the name, as gfx)
    t = theirs["target"]
    return (ours["gfx"] if t.backend == "hip" else ours["arch"], ours["warp_size"]) == (t.arch, t.warp_size)


def _abi(theirs, ours):  # the host tensor descriptor parameter layout: two flags from Triton 3.7 on
    major, minor = (int(x) for x in theirs["triton_version"].split(".")[:2])
    return ours["lt_tensordesc_abi"] == (1 if (major, minor) < (3, 7) else 2)


TMA_FIELDS = {"swizzle", "elem_size", "elem_type", "block_size", "fp4_padded", "is_im2col"}


def _tensordesc(theirs, ours):  # each descriptor's lowering: every field of it is read
    t = _plain(theirs["tensordesc_meta"] or [])
    return len(t) == len(ours["tensordesc_meta"]) and all(
        set(a) <= TMA_FIELDS and all(_plain(b[k]) == v for k, v in a.items()) for a, b in zip(t, ours["tensordesc_meta"]))


def _cluster(theirs, ours):  # Triton 3.5's explicit cluster shape
    return tuple(max(1, int(c)) for c in theirs["cluster_dims"]) == tuple(ours["cluster_dims"])


LAUNCH_FIELDS = {
    **{f: _same(f) for f in ("name", "num_warps", "num_ctas", "shared", "tmem_size", "global_scratch_size",
                             "global_scratch_align", "profile_scratch_size", "profile_scratch_align",
                             "launch_cooperative_grid", "launch_pdl", "warp_size")},
    "target": _target, "triton_version": _abi, "tensordesc_meta": _tensordesc, "cluster_dims": _cluster,
}
_COMPILE_OPTION = "a compile option: it shaped the binary (and is in lazytriton's compile key); a launch does not read it"
NOT_FOR_LAUNCH = {
    "hash": "Triton's own cache key of the compile; lazytriton keys its cache itself",
    "arch": "the target's arch as ptxas spells it ('sm90'); the decoder reads the number from target",
    "backend_name": "the backend, which the decoder reads from target.backend",
    "extern_libs": "the libdevice paths linked in at compile time",
    "supported_fp8_dtypes": "what the front end accepts: checked at compile time",
    "deprecated_fp8_dot_operand_dtypes": "what the front end warns about at compile time",
    "allowed_dot_input_precisions": "what the front end accepts: checked at compile time",
    **{f: _COMPILE_OPTION for f in (
        "debug", "num_stages", "maxnreg", "enable_fp_fusion", "enable_reflect_ftz", "sanitize_overflow",
        "default_dot_input_precision", "max_num_imprecise_acc_default", "ptx_version", "ptx_options",
        "ir_override", "instrumentation_mode", "fpsan_homomorphic_casts", "sched4reg",
        "num_buffers_warp_spec", "num_consumer_groups", "reg_dec_producer", "reg_inc_consumer")},
    "clc": _COMPILE_OPTION + " (cluster launch control is lowered into the kernel, sm_100+)",
    "min_shared_mem": _COMPILE_OPTION + " (the shared memory it reserves is in shared)",
}
# Fields named by a prefix, with the reason.
NOT_FOR_LAUNCH_PREFIXES = {
    "TRITON_": "a cache-invalidating environment variable that was set at compile time (TRITON_DISABLE_LINE_INFO, "
               "...): Triton records it with the compile; it shaped the binary, a launch does not read it",
}


def metadata_differences(theirs: dict, ours: dict) -> list[str]:
    """Every field of Triton's metadata (`theirs`, by name) that lazytriton neither reads the same
    (`ours`: _core.Kernel(...).metadata) nor lists as irrelevant to launching."""
    out = []
    for f in sorted(theirs):
        if f in NOT_FOR_LAUNCH or any(f.startswith(p) for p in NOT_FOR_LAUNCH_PREFIXES):
            continue
        if f not in LAUNCH_FIELDS:
            out.append(f"{f}={theirs[f]!r}: a metadata field lazytriton neither reads (kernel.cc launch_meta_from, "
                       "check.py LAUNCH_FIELDS) nor lists as irrelevant to launching (check.py NOT_FOR_LAUNCH)")
        elif not LAUNCH_FIELDS[f](theirs, ours):
            out.append(f"{f}: Triton has {theirs[f]!r}, lazytriton read {ours.get(f)!r}")
    return out


# -- the checks ------------------------------------------------------------------------------------------

def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        v = {str(kk): vv for kk, vv in v.items()}
    return json.loads(json.dumps(v, default=str))


def _options(opts: dict) -> dict:
    return {k: (tuple(_tup(x) for x in v) if isinstance(v, list) else v) for k, v in opts.items()}


def _tup(x):
    return tuple(_tup(i) for i in x) if isinstance(x, list) else x


@dataclass
class Report:
    failures: list = field(default_factory=list)
    cases: dict = field(default_factory=dict)

    def expect(self, cond: bool, what: str) -> bool:
        if not cond:
            self.failures.append(what)
        return cond


def check_case(case: Case, rep: Report) -> None:
    info = rep.cases.setdefault(case.name, {"calls": 0, "configs": 0, "compiled": 0, "unsupported": None})
    why = case.needs()
    if why:
        info["unsupported"] = why
        return
    k = lazytriton.kernel(case.kernel)
    spec = k.spec
    fn = jit_function(case.kernel)
    specs_by_key: dict = {}
    for ci, (args, kwargs) in enumerate(case.calls):
        label = f"{case.name} call {ci} {args[:0]}{_short(args, kwargs)}"
        info["calls"] += 1
        theirs = triton_binds(case.kernel, args, kwargs)
        call = k._bind(tuple(args), dict(kwargs))
        shape = k._shape(call)
        res = Resolution(k, (0,), call, 0, (1,), shape)
        res.target = TARGET
        cands = res._candidates()
        if spec.autotuned and len(cands) > 1:
            kept = spec.prune([c.config for c in cands], res.named, {})
            cands = [c for c in cands if any(c.config is kc for kc in kept)]
        if not rep.expect(len(cands) == len(theirs), f"{label}: lazytriton binds {len(cands)} configs, "
                                                     f"Triton {len(theirs)}"):
            continue
        info["configs"] += len(cands)
        for c, t in zip(cands, theirs):
            b = c.bound
            where = f"{label} config {c.index}"
            rep.expect(dict(b.signature) == t["signature"], f"{where}: signature {b.signature} != Triton's {t['signature']}")
            rep.expect(dict(b.constexprs) == t["constexprs"],
                       f"{where}: constexprs {b.constexprs} != Triton's {t['constexprs']}")
            rep.expect(_plain(b.attrs) == _plain(t["attrs"]) if b.attrs.keys() == t["attrs"].keys() else False,
                       f"{where}: attrs {b.attrs} != Triton's {t['attrs']}")
            ours = _plain(b.options.__dict__)
            diff = {kk: (ours.get(kk), t["options"].get(kk)) for kk in set(ours) | set(t["options"])
                    if ours.get(kk) != t["options"].get(kk)}
            rep.expect(not diff, f"{where}: options differ from Triton's (lazytriton, Triton): {diff}")
        # The stub: its key bits and slot types say what Triton's binder said (first config's binding).
        t0 = theirs[0]
        stub = stubgen.load_stub(shape)
        key = stub.key(call)
        rep.expect(isinstance(key, tuple), f"{label}: the stub built for this call rejected it")
        if not isinstance(key, tuple):
            continue
        n_call = k._n_call
        for i, (name, slot) in enumerate(zip(shape.names[:n_call], shape.slots[:n_call])):
            bits = (key[(2 * i) // 64] >> ((2 * i) % 64)) & 3
            kidx = spec.arg_names.index(name)
            ttype = t0["signature"][name]
            tdiv = ["tt.divisibility", 16] in _plain(t0["attrs"].get((kidx,), []))
            if slot.kind == "constexpr":
                ours_type, ours_div = "constexpr", False
            elif slot.kind == "int":
                ours_type = "constexpr" if (slot.specialize and bits & 1) else slot.param_type()
                ours_div = bool(bits & 2) and ours_type != "constexpr"
            elif slot.kind == "ptr":
                ours_type, ours_div = slot.param_type(), bool(bits & 1)
            else:
                ours_type, ours_div = slot.param_type(), False
            rep.expect((ours_type, ours_div) == (ttype, tdiv and ttype != "constexpr"),
                       f"{label}: argument {name}: stub says {ours_type}{' D' if ours_div else ''}, Triton "
                       f"{ttype}{' D' if tdiv else ''}")
        # An annotated int of 1 has no attrs entry, of 3 an empty one: the same code.
        spec_id = json.dumps([t0["signature"], _plain({str(kk): v for kk, v in t0["attrs"].items() if v}),
                              _plain({str(kk): repr(v) for kk, v in t0["constexprs"].items()}),
                              t0["options"],
                              # Autotune key values (and what heuristics read) select a tuning of their own.
                              [repr(v) for v, sl in zip(call, shape.slots) if sl.in_key]], sort_keys=True)
        skey = (shape.digest(), key)
        rep.expect(specs_by_key.setdefault(skey, spec_id) == spec_id,
                   f"{label}: one stub key for two Triton specializations:\n  {specs_by_key[skey]}\n  {spec_id}")
        # Packing: what the stub passes vs Triton's launcher.
        packed = stub.params(call)
        is_param = [t0["signature"].get(n, "constexpr") != "constexpr" for n in shape.names[:n_call]]
        our_types = [sl.param_type() for sl, p in zip(shape.slots, is_param) if p]
        our_sizes = [len(packed[i]) for i, p in enumerate(is_param) if p]
        t_types, t_sizes, t_scratch = triton_launcher_params(t0["signature"], t0["constexprs"])
        rep.expect(our_types == t_types, f"{label}: packed parameter types {our_types} != Triton's launcher's {t_types}")
        values = [v for v, p in zip(call, is_param) if p]
        for name, t, v, got in zip([n for n, p in zip(shape.names, is_param) if p], our_types, values,
                                   [packed[i] for i, p in enumerate(is_param) if p]):
            want = launcher_bytes(t, v)[:len(got)]
            rep.expect(got == want, f"{label}: argument {name} ({t}, {v!r}) packed as {got.hex()}, Triton's "
                                    f"launcher passes {want.hex()}")
        rep.expect(t_scratch == 2, f"{label}: Triton's launcher appends {t_scratch} scratch pointers, lazytriton 2")
        if ci < case.compile_calls:
            _compile_and_compare(case, fn, k, cands, theirs, our_sizes, t_sizes, label, rep, info)
    info["stub_keys"], info["specializations"] = len(specs_by_key), len(set(specs_by_key.values()))
    rep.expect(info["stub_keys"] == info["specializations"],
               f"{case.name}: {info['stub_keys']} stub keys for {info['specializations']} Triton specializations "
               "(one specialization resolved under two keys)")


def _short(args, kwargs) -> str:
    def s(v):
        return "arr" if isinstance(v, DeviceArray) else repr(v)
    return "(" + ", ".join([s(a) for a in args] + [f"{kk}={s(v)}" for kk, v in kwargs.items()]) + ")"


_AGAIN = 12  # at most, Triton's compiles again of a kernel whose cubin is not lazytriton's


def _builds(src, options: dict, cubin: bytes, ours: bytes) -> set:
    """The cubins Triton builds for `src`: `cubin` and those of up to _AGAIN compiles more, its
    cache bypassed, until one is `ours` or two differ. Triton 3.9 builds a warp-specialized
    matmul two ways, about 6 times in 10 the one and 4 the other: three more compiles all
    alike while lazytriton's was the other way happened in about one run of twenty."""
    import os

    old = os.environ.get("TRITON_ALWAYS_COMPILE")
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    builds = {cubin}
    try:
        for _ in range(_AGAIN):
            builds.add(triton.compile(src, target=TARGET, options=_options(options)).asm["cubin"])
            if ours in builds or len(builds) > 1:
                break
        return builds
    finally:
        if old is None:
            os.environ.pop("TRITON_ALWAYS_COMPILE")
        else:
            os.environ["TRITON_ALWAYS_COMPILE"] = old


def _compile_and_compare(case, fn, k, cands, theirs, our_sizes, t_sizes, label, rep, info) -> None:
    compile_all(k.spec, TARGET, cands)  # the compile server's workers (a Gluon kernel: Gluon's source)
    for c, t in zip(cands, theirs):
        where = f"{label} config {c.index}"
        src = fn.ASTSource(fn, t["signature"], t["constexprs"], t["attrs"])  # Triton's own choice of source
        try:
            theirs_ck = triton.compile(src, target=TARGET, options=_options(t["options"]))
            t_err = None
        except Exception as exc:
            theirs_ck, t_err = None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
        if c.binary is None or theirs_ck is None:
            if rep.expect(c.binary is None and theirs_ck is None,
                          f"{where}: lazytriton compile {'failed: ' + str(c.error) if c.binary is None else 'worked'}, "
                          f"Triton's {'failed: ' + str(t_err) if theirs_ck is None else 'worked'}"):
                info["unsupported"] = f"this Triton cannot compile it for sm_90 (nor can lazytriton): {t_err}"
            continue
        info["compiled"] += 1
        info.setdefault("plans", []).append({kk: v for kk, v in lazytriton_launch_plan(c.binary).items()
                                             if kk != "name"})
        if c.binary.cubin != theirs_ck.asm["cubin"]:
            builds = _builds(src, t["options"], theirs_ck.asm["cubin"], c.binary.cubin)
            if c.binary.cubin not in builds and len(builds) > 1:
                # Triton's own compiles of this kernel differ from run to run (warp specialization in
                # 3.5 and 3.9): no one cubin to compare with; the launch metadata below still is.
                info["varies"] = f"Triton built {len(builds)} different cubins"
            else:
                rep.expect(c.binary.cubin in builds, f"{where}: lazytriton's cubin is not Triton's")
        for why in metadata_differences(theirs_ck.metadata._asdict(),
                                        _core.Kernel(c.binary.cubin, c.binary.metadata).metadata):
            rep.expect(False, f"{where}: Triton's metadata: {why}")
        ours, tp = lazytriton_launch_plan(c.binary), triton_launch_plan(theirs_ck)
        rep.expect(ours == tp, f"{where}: launch metadata differs (lazytriton, Triton): "
                               f"{ {kk: (ours[kk], tp[kk]) for kk in ours if ours[kk] != tp.get(kk)} }")
        sizes = cubin_param_sizes(c.binary.cubin)
        if sizes is not None:
            rep.expect(sizes == our_sizes + [8, 8], f"{where}: cubin parameters {sizes} != lazytriton's packing "
                                                    f"{our_sizes} + 2 scratch pointers")
            rep.expect(all(ts >= cs for ts, cs in zip(t_sizes, sizes)) and len(t_sizes) == len(sizes) - 2,
                       f"{where}: Triton's launcher storage {t_sizes} does not cover the cubin's parameters {sizes}")


def run(names: list[str] | None = None) -> dict:
    rep = Report()
    for case in cases():
        if names and case.name not in names:
            continue
        try:
            check_case(case, rep)
        except Exception:
            rep.failures.append(f"{case.name}: raised\n{traceback.format_exc()}")
    return {"triton": triton.__version__, "python": sys.version.split()[0], "lazytriton": lazytriton.__file__,
            "cases": rep.cases, "failures": rep.failures}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as one JSON line")
    ap.add_argument("--case", action="append", help="only this case (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the launch metadata of every compiled config")
    a = ap.parse_args(argv)
    report = run(a.case)
    if a.json:
        print(json.dumps(report))
    else:
        print(f"triton {report['triton']} (python {report['python']})")
        for name, info in report["cases"].items():
            state = f"unsupported: {info['unsupported']}" if info["unsupported"] else "ok"
            print(f"  {name}: {info['calls']} calls, {info['configs']} configs bound, {info['compiled']} compiled; {state}")
            if a.verbose:
                for plan in info.get("plans", []):
                    print(f"      {plan}")
        for f in report["failures"]:
            print("FAIL", f)
        print(f"{len(report['failures'])} mismatches")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
