"""Run by tests/test_launch_bytes_hip.py in a process whose libamdhip64.so is
fake_hip.c and whose lazytriton driver is HIP (LAZYTRITON_DRIVER=hip): launches
each case through lazytriton (first call with its tuning trials, the generated
stub, the table-driven stub; lazytriton.jax call sites lowered for ROCm and
launched by the XLA handler's C++; optionally a C++ bundle) and through
Triton's own HIP launcher (driver.py's HIPLauncher and driver.c, the code
Triton runs for a launch on ROCm, built against the same fake library), and
writes one JSON object per case with what each handed the HIP runtime.
Argv: the JSON file to write."""
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import triton
from triton.backends.amd import driver as amd_driver
from triton.compiler import make_backend
from triton.tools.tensor_descriptor import TensorDescriptor as TritonTensorDescriptor

import lazytriton
from lazytriton import _core
from lazytriton.cpp import bundle
from lazytriton.runtime import stubgen
from lazytriton.model import tensor_desc, tuples
from lazytriton.model.arrays import DeviceArray, PointerArg
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.compile.targets import ast_source, device_target
from lazytriton.model.spec import kernel_spec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels import tma, tuple_kernels  # noqa: E402
from kernels.hip_kernels import axpy_flag, mixed_scalars, tuned_scale  # noqa: E402

LOG = os.environ["FAKE_HIP_LOG"]
BUNDLE = os.environ.get("FAKE_HIP_BUNDLE_DIR")
BASE = 0x7F0000000000
ITEM = {"fp32": 4, "fp16": 2, "i32": 4}


def array(n, dtype, addr):
    return DeviceArray(addr, dtype, n * ITEM[dtype], (n,))


class TritonBase:
    """A descriptor's base as Triton reads it: data_ptr(), and the dtype's size and kind
    (triton.tools.tensor_descriptor.TensorDescriptor checks them)."""

    def __init__(self, ptr, dtype):
        self.ptr = ptr
        self.dtype = types.SimpleNamespace(itemsize=ITEM[dtype], is_floating_point=dtype.startswith("fp"))

    def data_ptr(self):
        return self.ptr


def for_triton(v):
    """A call argument as Triton's own launcher takes it."""
    if isinstance(v, tuple):
        return tuple(for_triton(x) for x in v)
    if isinstance(v, DeviceArray):
        return v.ptr
    if tensor_desc.is_descriptor(v):
        # Triton's own class: 3.5/3.6's HIP launcher expands only its instances
        d = tensor_desc.read(v, "probe")
        return TritonTensorDescriptor(TritonBase(d.ptr, v.base.dtype), list(d.shape), list(d.strides), list(d.block),
                                      "nan" if d.nan else "zero")
    return v


def bind_value(v):
    if isinstance(v, tuple):
        return tuple(bind_value(x) for x in v)
    if isinstance(v, DeviceArray):
        return PointerArg(v.ptr, v.dtype)
    if tensor_desc.is_descriptor(v):
        return tensor_desc.bind_value(tensor_desc.read(v, "probe"))
    return v


def param_sizes(amdgcn: str, name: str) -> list[int]:
    """The kernel's argument sizes from its code object metadata (amdhsa.kernels
    .args; hidden arguments, which the runtime fills itself, left out)."""
    meta = amdgcn[amdgcn.index("amdhsa.kernels"):]
    kernel = next(k for k in re.split(r"\n  - ", meta) if re.search(rf"\.name:\s+{re.escape(name)}\n", k))
    args = re.split(r"\n\s+- ", kernel[kernel.index(".args:"):].split("\n    .", 1)[0])[1:]
    out = []
    for a in args:
        kind = re.search(r"\.value_kind:\s+(\S+)", a).group(1)
        if not kind.startswith("hidden_"):
            out.append(int(re.search(r"\.size:\s+(\d+)", a).group(1)))
    return out


def records() -> list[dict]:
    if not os.path.exists(LOG):
        return []
    with open(LOG) as f:
        out = [json.loads(line) for line in f]
    os.remove(LOG)
    return out


TARGET = None


def triton_launch(fn, args, meta, grid, sizes_env, options=None):
    """Compiles `fn` for these arguments as lazytriton's compiler does and launches it
    with Triton's own HIP launcher; returns (its records, signature, metadata)."""
    spec = kernel_spec(fn)
    names = [p.name for p in spec.params]
    bound = Binder(spec, TARGET).bind((), {**dict(zip(names, (bind_value(a) for a in args))), **meta,
                                           **(options or {})})
    binary = compile_one(spec, TARGET, bound)
    md = binary.metadata
    # The same compile through Triton (a hit in its cache), for the code object's argument table.
    kernel = triton.compile(ast_source(spec.fn, bound.signature, bound.constexprs, bound.attrs), target=TARGET,
                            options=bound.options.__dict__)
    assert bytes(kernel.kernel) == bytes(binary.cubin)
    sizes_env[md["name"]] = param_sizes(kernel.asm["amdgcn"], md["name"])
    os.environ["FAKE_HIP_PARAM_SIZES"] = ";".join(f"{k}:{','.join(map(str, v))}" for k, v in sizes_env.items())
    full = dict(zip(names, args))
    full.update(meta)
    signature = dict(bound.signature)
    src = types.SimpleNamespace(constants=bound.constexprs, signature=signature,
                                fn=types.SimpleNamespace(arg_names=list(signature)))
    # A cooperative kernel's launcher asks the active HIPDriver whether the device can (ours: a
    # stand-in namespace): made as a plain one, then switched as its __init__ would have left it.
    launcher = amd_driver.HIPLauncher(src, types.SimpleNamespace(**{**md, "launch_cooperative_grid": False}))
    launcher.launch_cooperative_grid = md["launch_cooperative_grid"]
    _, function, *_ = triton.runtime.driver.active.utils.load_binary(md["name"], binary.cubin, md["shared"], 0)
    values = [for_triton(full[n]) for n in names]
    # The packed metadata CompiledKernel.run hands its launcher (3.5: cluster dimensions too).
    packed = make_backend(TARGET).pack_metadata(types.SimpleNamespace(**md))
    launcher(*grid, 0, function, packed, None, None, None, *values)
    return records(), str(bound.signature), md


def lazytriton_launches(fn, args, meta, grid):
    """lazytriton's records: the first call (resolution, tuning), two later calls
    (the generated stub: LAZYTRITON_STUB_BUILD=sync), the table-driven stub."""
    k = lazytriton.kernel(fn)
    for _ in range(3):
        k[grid](*args, stream=0, **meta)
    bound = k._bind_call(args, meta)
    assert stubgen.generic_stub(k._shape(bound)).launch(k._handle, grid, 0, bound) is True
    return k, records()


def run_case(name, fn, args, meta, grid, sizes_env, source=None):
    theirs, sig, md = triton_launch(fn, args, meta, grid, sizes_env)
    _, ours = lazytriton_launches(fn, args, meta, grid)
    if source and BUNDLE:  # the winner written into a bundle, for the C++ program
        bundle.Bundle(BUNDLE).add(fn, *args, grid=grid, stream=0, source=source, **meta)
        assert not records()  # resolved from the cache: nothing launched
    return {"case": name, "triton": theirs, "lazytriton": ours, "signature": sig,
            "warp_size": md["warp_size"], "num_warps": md["num_warps"], "arch": md["arch"],
            "waves_per_eu": md.get("waves_per_eu")}


def autotuned_case(sizes_env):
    fn = tuned_scale
    n = 100_000
    x, o = array(n, "fp32", BASE), array(n, "fp32", BASE + 2**22)
    refs, mds = [], []
    for cfg in fn.configs:
        opts = {k: v for k, v in cfg.all_kwargs().items() if k != "BLOCK"}
        rec, _, md = triton_launch(fn.fn, (x, o, n, 0.5), {"BLOCK": cfg.kwargs["BLOCK"]},
                                   (triton.cdiv(n, cfg.kwargs["BLOCK"]), 1, 1), sizes_env, options=opts)
        refs.append(rec[0])
        mds.append({k: md.get(k) for k in ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")})
    grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
    k, ours = lazytriton_launches(fn, (x, o, n, 0.5), {}, grid)
    hits = lazytriton.stats()["record_hits"]
    lazytriton.kernel(fn)[grid](x, o, n, 0.5, stream=0)  # a new kernel object: the persisted winner
    assert lazytriton.stats()["record_hits"] == hits + 1
    return {"case": "autotuned", "triton_per_config": refs, "config_meta": mds, "lazytriton": ours,
            "winner": k.records[-1].winner_index, "persisted": records()}


def jax_cases(sizes_env):
    """lazytriton.jax: call sites lowered for ROCm (on this CPU), resolved as the XLA
    handler's first execution resolves them (jax_ffi.Site), then launched by the
    handler's C++ (launch_fixed) from buffer addresses alone."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []
    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    def site_of(f, *avals):
        text = jax.jit(f).trace(*avals).lower(lowering_platforms=("rocm",)).as_text()
        assert ltj.CUSTOM_CALL_TARGET_NAME in text, text[-2000:]
        m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
        d = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))
        return jax_ffi.Site(d)

    out = []
    n = 1000
    f32 = jnp.float32
    site = site_of(lambda x, y: ltj.triton_call(x, y, n=n, alpha=1.5, flag=True, kernel=axpy_flag, out_type=x,
                                                grid=lambda m: (triton.cdiv(n, m["BLOCK"]),), BLOCK=256),
                   jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32))
    bufs = [(BASE + i * 2**22, n * 4) for i in range(3)]
    x, y, z = (array(n, "fp32", b[0]) for b in bufs)
    out.append(("jax_axpy_flag", site, bufs, (4, 1, 1),
                triton_launch(axpy_flag, (x, y, z, n, 1.5, True), {"BLOCK": 256}, (4, 1, 1), sizes_env)))
    site = site_of(lambda x, y: ltj.triton_call((x, (y, 1.25)), kernel=tuple_kernels.add_pair, out_type=x, n=n,
                                                grid=lambda m: (triton.cdiv(n, m["BLOCK"]),), BLOCK=256),
                   jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32))
    out.append(("jax_add_pair", site, bufs, (4, 1, 1),
                triton_launch(tuple_kernels.add_pair, ((x, (y, 1.25)), z, n), {"BLOCK": 256}, (4, 1, 1), sizes_env)))
    cases = []
    for name, site, bufs, grid, (theirs, sig, _) in out:
        site.d["n_inputs"] = len(bufs) - 1
        entry = site.resolve(tuple(bufs), 0, 0, False)
        assert tuple(entry.grid) == grid, (name, entry.grid)
        records()  # (nothing to tune: one config)
        for _ in range(2):
            _core.launch_fixed(entry, 0, [b[0] for b in bufs])
        cases.append({"case": name, "triton": theirs, "lazytriton": records(), "signature": sig})
    return cases


def main():
    global TARGET
    # Triton's HIP utilities (load_binary, launch, build_signature_metadata) built against the fake library.
    utils = amd_driver.HIPUtils()
    triton.runtime.driver.set_active(types.SimpleNamespace(utils=utils))
    dev = _core.device_info(_core.current_device())
    TARGET = device_target(dev)
    sizes_env: dict = {}
    out = [{"case": "device", **{k: dev[k] for k in ("backend", "arch", "warp_size", "name")},
            "target": [TARGET.backend, TARGET.arch, TARGET.warp_size]}]
    n = 1000
    x, y, z = (array(n, "fp32", BASE + i * 2**22) for i in range(3))
    out.append(run_case("axpy_flag", axpy_flag, (x, y, z, n, -0.75, True), {"BLOCK": 256}, (4, 1, 1), sizes_env,
                        source="kernels.hip_kernels:axpy_flag"))
    # n % 16 == 0 and flag False: another specialization, num_warps 8 (a 512-thread block on wave64),
    # an AMD option given with the call
    out.append(run_case("axpy_flag_16", axpy_flag, (x, y, z, 1024, 2.0, False),
                        {"BLOCK": 512, "num_warps": 8, "waves_per_eu": 2},
                        (2, 1, 1), sizes_env))
    # launch_cooperative_grid: hipModuleLaunchCooperativeKernel, in Triton's launcher and through the HIP layer
    out.append(run_case("cooperative", axpy_flag, (x, y, z, n, 3.0, True), {"BLOCK": 256, "launch_cooperative_grid": True},
                        (4, 1, 1), sizes_env))
    # Host tensor descriptors: gfx942 has no TMA, so Triton decomposes each into base, shape,
    # strides and padding (its launcher's decompose_descriptor); one strided with NaN padding.
    src = DeviceArray(BASE, "fp16", 256 * 192 * 2, (256, 192))
    d_in = lazytriton.TensorDescriptor(src, [96, 128], [192, 1], [32, 64], "nan")
    d_out = lazytriton.TensorDescriptor(DeviceArray(BASE + 2**24, "fp16", 96 * 128 * 2, (96, 128)), [96, 128],
                                        [128, 1], [32, 64])
    out.append(run_case("descriptors", tma.tma_scale_store_kernel, (d_in, d_out, 2.5), {"BM": 32, "BN": 64},
                        (3, 2, 1), sizes_env))
    o = array(64, "fp32", BASE + 2**25)
    out.append(run_case("mixed_scalars", mixed_scalars, (o, 2**40 + 3, 2**63 + 5, 0.1, 1.5, True), {"STRIDE": 2},
                        (3, 2, 1), sizes_env))
    out.append(run_case("add_pair", tuple_kernels.add_pair, ((x, (y, 1.5)), z, n), {"BLOCK": 256}, (4, 1, 1),
                        sizes_env, source="kernels.tuple_kernels:add_pair"))
    out.append(autotuned_case(sizes_env))
    out += jax_cases(sizes_env)
    if BUNDLE:  # what the sizes of the bundle's kernels are, for the C++ program's launches
        out.append({"case": "param_sizes", "env": os.environ["FAKE_HIP_PARAM_SIZES"]})
    Path(sys.argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
