"""Run by tests/test_launch_bytes.py in a process whose libcuda.so.1 is
fake_cuda.c: launches each case through lazytriton (first call, then the
stub) and through Triton's own launcher (driver.py's CudaLauncher, the code
Triton runs for a launch, compiled against the same fake driver), and prints
one JSON object per case with the parameter bytes each handed to
cuLaunchKernelEx. Argv: the JSON file to write."""
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import driver as nvd

import lazytriton
from lazytriton.cpp import bundle
from lazytriton.runtime import stubgen
from lazytriton.model import tensor_desc, tuples
from lazytriton.model.arrays import DeviceArray, PointerArg, itemsize
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.model.spec import kernel_spec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels import tma, tuple_kernels  # noqa: E402

try:  # Gluon (@triton.experimental.gluon.jit) kernels: Triton 3.5+
    from kernels import gluonk  # noqa: E402
except ImportError:  # pragma: no cover
    gluonk = None

# The fake device: sm_90 (descriptors lowered to TMA), or $FAKE_CUDA_CC=80 (decomposed descriptors).
SM90 = GPUTarget("cuda", int(os.environ.get("FAKE_CUDA_CC", "90")), 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
LOG = os.environ["FAKE_CUDA_LOG"]
# Beside the probe's output (the test's own directory): nothing is left in the temp directory.
BUNDLE = os.environ.get("FAKE_CUDA_BUNDLE_EXE") and tempfile.mkdtemp(prefix="lt-bundle-",
                                                                      dir=Path(sys.argv[1]).resolve().parent)
BASE = 0x7F0000000000
# What Triton's launcher gets from triton.set_allocator for a kernel's global scratch (Gluon's
# device-side descriptors); lazytriton carves its own, so tests compare that parameter apart.
TRITON_SCRATCH = 0x7D0000000000


def array(shape, dtype, addr):
    n = 1
    for s in shape:
        n *= s
    return DeviceArray(addr, dtype, n * itemsize(dtype), tuple(shape))


def desc(shape, block, dtype="fp16", addr=BASE, strides=None, padding="zero"):
    base = array(shape, dtype, addr)
    if strides is None:
        return lazytriton.TensorDescriptor.from_tensor(base, list(block), padding=padding)
    return lazytriton.TensorDescriptor(base, list(shape), list(strides), list(block), padding)


class TritonBase:
    """A descriptor's base as Triton's launcher reads it (data_ptr())."""

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


def for_triton(v):
    """A call argument as Triton's own launcher takes it."""
    if isinstance(v, tuple):
        return tuple(for_triton(x) for x in v)
    if isinstance(v, DeviceArray):
        return v.ptr
    if tensor_desc.is_descriptor(v):
        d = tensor_desc.read(v, "probe")
        return types.SimpleNamespace(base=TritonBase(d.ptr), shape=list(d.shape), strides=list(d.strides),
                                     block_shape=list(d.block), padding="nan" if d.nan else "zero",
                                     round_f32_to_tf32=d.tf32)
    return v


def bind_value(v):
    if isinstance(v, tuple):
        return tuple(bind_value(x) for x in v)
    if isinstance(v, DeviceArray):
        return PointerArg(v.ptr, v.dtype)
    if tensor_desc.is_descriptor(v):
        return tensor_desc.bind_value(tensor_desc.read(v, "probe"))
    return v


def param_sizes(cubin: bytes) -> list[int]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        dump = subprocess.run([str(CUOBJDUMP), "-elf", str(path)], capture_output=True, text=True, check=True).stdout
    sizes = {int(o, 16): int(s, 16) for o, s in re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+).*?Size\s*:\s*(0x[0-9a-f]+)",
                                                               dump)}
    return [sizes[i] for i in sorted(sizes)]


def records() -> list[dict]:
    if not os.path.exists(LOG):
        return []
    with open(LOG) as f:
        out = [json.loads(line) for line in f]
    os.remove(LOG)
    return out


def triton_launch(fn, args, meta, grid, sizes_env, flatten=False, options=None):
    """Compiles `fn` for these arguments as lazytriton's compiler does, and launches
    it with Triton's own launcher; returns (its cuLaunchKernelEx records, signature)."""
    spec = kernel_spec(fn)
    names = [p.name for p in spec.params]
    bound = Binder(spec, SM90).bind((), {**dict(zip(names, (bind_value(a) for a in args))), **meta, **(options or {})})
    binary = compile_one(spec, SM90, bound)
    md = binary.metadata
    sizes_env[md["name"]] = param_sizes(binary.cubin)
    os.environ["FAKE_CUDA_PARAM_SIZES"] = ";".join(f"{k}:{','.join(map(str, v))}" for k, v in sizes_env.items())

    # Triton's launcher, as CompiledKernel.run calls it (driver.py, CudaLauncher.__call__).
    full = dict(zip(names, args))
    full.update(meta)
    signature, values = dict(bound.signature), [for_triton(full[n]) for n in names]
    if flatten:
        # Triton 3.5/3.6's launcher expands only top-level descriptors (a descriptor in a tuple
        # fails its assert); the kernel's parameters are its leaves' expansions in order (the
        # cubin's table): the reference is its launcher on the flattened signature.
        signature = tuples.flat_signature(signature)
        values = [leaf for v in values for _, leaf in tuples.leaves(v)]
    src = types.SimpleNamespace(constants=bound.constexprs, signature=signature,
                                fn=types.SimpleNamespace(arg_names=list(signature)))
    launcher = nvd.CudaLauncher(src, types.SimpleNamespace(**md))
    _, function, *_ = triton.runtime.driver.active.utils.load_binary(md["name"], binary.cubin, md["shared"], 0)
    triton_args = values
    launcher(*grid, 0, function, (md["num_warps"], md["num_ctas"], md["shared"]), None, None, None, *triton_args)
    return records(), str(bound.signature)


def lazytriton_launches(fn, args, meta, grid):
    """lazytriton's records: the first call (resolution, tuning), later calls
    (the generated stub: LAZYTRITON_STUB_BUILD=sync), the table-driven stub."""
    k = lazytriton.kernel(fn)
    for _ in range(3):
        k[grid](*args, stream=0, **meta)
    bound = k._bind_call(args, meta)
    assert stubgen.generic_stub(k._shape(bound)).launch(k._handle, grid, 0, bound) is True
    return k, records()


def run_case(name, fn, args, meta, grid, sizes_env, flatten=False, source=None):
    theirs, sig = triton_launch(fn, args, meta, grid, sizes_env, flatten)
    _, ours = lazytriton_launches(fn, args, meta, grid)
    if source and BUNDLE:  # the winner written into a bundle, for the C++ program ($FAKE_CUDA_BUNDLE_EXE)
        bundle.Bundle(BUNDLE).add(fn, *args, grid=grid, stream=0, source=source, **meta)
        assert not records()  # resolved from the cache: nothing launched
    return {"case": name, "triton": theirs, "lazytriton": ours, "signature": sig}


def bundle_case(cases):
    """The C++ program's AOT launches from the bundle: one per case, in its order."""
    r = subprocess.run([os.environ["FAKE_CUDA_BUNDLE_EXE"], BUNDLE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "launched" in r.stdout, r.stdout + r.stderr
    got = records()
    return {"case": "bundle", "names": [c["case"] for c in cases], "triton": [c["triton"][0] for c in cases],
            "lazytriton": got}


def autotuned_case(sizes_env):
    """tma_scale_autotuned: its configs' pre_hooks set the block shapes. Every launch
    (tuning trials through _core's argument packing, then the stubs) must be Triton's
    launch of one config with its hook's blocks; the stubs', the winner's."""
    fn = tma.tma_scale_autotuned
    d_in = desc((128, 128), (1, 1), "fp16", BASE, padding="nan")
    d_out = desc((128, 128), (1, 1), "fp16", BASE + 2**24)
    grid = (4, 2, 1)
    refs = []
    for cfg in fn.configs:
        blocks = [cfg.kwargs["BM"], cfg.kwargs["BN"]]
        args = (d_in.__class__(d_in.base, d_in.shape, d_in.strides, blocks, "nan"),
                d_out.__class__(d_out.base, d_out.shape, d_out.strides, blocks), 0.5)
        refs.append(triton_launch(fn.fn, args, dict(cfg.kwargs), grid, sizes_env,
                                  options={"num_warps": cfg.num_warps})[0][0])
    k, ours = lazytriton_launches(fn, (d_in, d_out, 0.5), {}, grid)
    # A new kernel object (as in a new process): the persisted winner, its block shapes in its metadata.
    hits = lazytriton.stats()["record_hits"]
    lazytriton.kernel(fn)[grid](d_in, d_out, 0.5, stream=0)
    assert lazytriton.stats()["record_hits"] == hits + 1
    return {"case": "autotuned", "triton_per_config": refs, "lazytriton": ours,
            "winner": k.records[-1].winner_index, "persisted": records()}


def jax_cases(sizes_env):
    """lazytriton.jax: the call site lowered for CUDA (on this CPU), resolved as the
    XLA handler's first execution resolves it (jax_ffi.Site), then launched by the
    handler's C++ (launch_fixed) from buffer addresses alone."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []
    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    def site_of(f, *avals):
        text = jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
        m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
        d = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))
        return jax_ffi.Site(d)

    out = []
    # A host descriptor (NaN padding) and the output pointer: buffers 0 (input) and 1 (output).
    M, N, R, C = 32, 64, 96, 128
    site = site_of(lambda x: ltj.triton_call(ltj.TensorDescriptor.from_array(x, [M, N], padding="nan"),
                                             kernel=tma.tma_copy_kernel, out_type=jax.ShapeDtypeStruct((M, N), x.dtype),
                                             grid=1, M=M, N=N), jax.ShapeDtypeStruct((R, C), jnp.float32))
    bufs = [(BASE + 2**22, R * C * 4), (BASE + 2**23, M * N * 4)]
    ref_args = (desc((R, C), (M, N), "fp32", bufs[0][0], padding="nan"), array((M, N), "fp32", bufs[1][0]))
    out.append(("jax_copy", site, bufs, (1, 1, 1), triton_launch(tma.tma_copy_kernel, ref_args, {"M": M, "N": N},
                                                                  (1, 1, 1), sizes_env)))
    # A tuple operand (x, (y, scale)): its leaves are operands 0, 1 (and a scalar); the output is buffer 2.
    n = 1000
    site = site_of(lambda x, y: ltj.triton_call((x, (y, 1.25)), kernel=tuple_kernels.add_pair, out_type=x, n=n,
                                                grid=lambda m: (triton.cdiv(n, m["BLOCK"]),), BLOCK=256),
                   jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32))
    bufs = [(BASE + i * 2**22, n * 4) for i in range(3)]
    x, y, z = (array((n,), "fp32", b[0]) for b in bufs)
    out.append(("jax_add_pair", site, bufs, (4, 1, 1),
                triton_launch(tuple_kernels.add_pair, ((x, (y, 1.25)), z, n), {"BLOCK": 256}, (4, 1, 1), sizes_env)))
    # Descriptors inside a tuple operand: operands p 0, a 1, b 2 (scale a scalar); the output is buffer 3.
    M, N = 16, 32

    def tuple_descs(p, a, b):
        descs = (ltj.TensorDescriptor.from_array(a, [1, M, N]), (ltj.TensorDescriptor.from_array(b, [M, N]), 0.5, 1))
        return ltj.triton_call(p, descs, k=7, kernel=tma.tma_tuple_descs,
                               out_type=jax.ShapeDtypeStruct((2, M, N), jnp.float32), grid=2, M=M, N=N)

    site = site_of(tuple_descs, jax.ShapeDtypeStruct((1,), jnp.float32), jax.ShapeDtypeStruct((2, 32, 64), jnp.float32),
                   jax.ShapeDtypeStruct((48, 64), jnp.float32))
    bufs = [(BASE + 2**25, 4), (BASE, 2 * 32 * 64 * 4), (BASE + 2**24, 48 * 64 * 4), (BASE + 2**26, 2 * M * N * 4)]
    ref_args = (array((1,), "fp32", bufs[0][0]),
                (desc((2, 32, 64), (1, M, N), "fp32", bufs[1][0]), (desc((48, 64), (M, N), "fp32", bufs[2][0]), 0.5, 1)),
                array((2, M, N), "fp32", bufs[3][0]), 7)
    out.append(("jax_tuple_descs", site, bufs, (2, 1, 1),
                triton_launch(tma.tma_tuple_descs, ref_args, {"M": M, "N": N}, (2, 1, 1), sizes_env, flatten=True)))
    cases = []
    for name, site, bufs, grid, (theirs, sig) in out:
        site.d["n_inputs"] = len(bufs) - 1
        entry = site.resolve(tuple(bufs), 0, 0, False)
        assert tuple(entry.grid) == grid, (name, entry.grid)
        for _ in range(2):
            lazytriton._core.launch_fixed(entry, 0, [b[0] for b in bufs])
        cases.append({"case": name, "triton": theirs, "lazytriton": records(), "signature": sig})
    return cases


def jax_site(f, *avals):
    """A lazytriton.jax call site lowered for CUDA (on this CPU), as the XLA handler rebuilds it."""
    import jax

    from lazytriton.jax import ffi as jax_ffi

    text = jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
    d = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))
    return jax_ffi.Site(d)


def site_launches(site, bufs, n_outputs=1):
    """Resolves `site` as the handler's first execution does (its tuning trials' records
    first), then launches the entry twice from the buffer addresses (launch_fixed)."""
    site.d["n_inputs"] = len(bufs) - n_outputs
    entry = site.resolve(tuple(bufs), 0, 0, False)
    trials = records()
    for _ in range(2):
        lazytriton._core.launch_fixed(entry, 0, [b[0] for b in bufs])
    return entry, trials, records()


def gluon_cases(sizes_env):
    """Gluon kernels (tests/kernels/gluonk.py): the vector add, the autotuned one, the 2D
    blocked-layout kernel with a float scalar, the device-side TMA copy (sm_90, Triton 3.6+:
    its descriptors live in global scratch), standalone and through lazytriton.jax."""
    if gluonk is None:
        return []
    out = []
    n = 1000
    x, y, z = (array((n,), "fp32", BASE + i * 2**22) for i in range(3))
    meta = {"BLOCK": 512, "WARPS": 4, "num_warps": 4}
    out.append(run_case("gluon_vec_add", gluonk.vec_add, (x, y, z, n), meta, (2, 1, 1), sizes_env))
    M, N, pitch = 33, 100, 103
    a, b, o = array((M, pitch), "fp32", BASE), array((N,), "fp32", BASE + 2**22), array((M, pitch), "fp32",
                                                                                           BASE + 2**23)
    meta = {"BM": 16, "BN": 64, "WARPS": 4, "num_warps": 4}
    out.append(run_case("gluon_scale_rows", gluonk.scale_rows, (a, b, o, M, N, pitch, pitch, -1.75), meta,
                        (3, 2, 1), sizes_env))
    if gluonk.HAVE_DEVICE_TMA and SM90.arch >= 90:
        a, o = array((16, 128), "fp32", BASE), array((16, 128), "fp32", BASE + 2**22)
        out.append(run_case("gluon_tma_copy", gluonk.tma_copy, (a, o), {"M": 16, "N": 128}, (1, 1, 1), sizes_env))
    # Autotuned: Triton's launch of each config; lazytriton's trials, then the winner's launches.
    tuned = gluonk.vec_add_tuned
    n = 100_000
    x, y, z = (array((n,), "fp32", BASE + i * 2**22) for i in range(3))
    refs = [triton_launch(tuned.fn, (x, y, z, n), dict(cfg.kwargs), (triton.cdiv(n, cfg.kwargs["BLOCK"]), 1, 1),
                          sizes_env, options={"num_warps": cfg.num_warps})[0][0] for cfg in tuned.configs]
    k, ours = lazytriton_launches(tuned, (x, y, z, n), {}, lambda m: (triton.cdiv(n, m["BLOCK"]),))
    out.append({"case": "gluon_tuned", "triton_per_config": refs, "lazytriton": ours,
                "winner": k.records[-1].winner_index})
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return out
    from lazytriton import jax as ltj

    f32 = jnp.float32
    # vec_add(x, y, out, n): buffers 0, 1 and the output 2; `n` bound by name.
    n = 10_000
    bufs = [(BASE + i * 2**22, n * 4) for i in range(3)]
    x, y, z = (array((n,), "fp32", b[0]) for b in bufs)
    for name, fn, meta in (("jax_gluon_vec_add", gluonk.vec_add, {"BLOCK": 512, "WARPS": 4, "num_warps": 4}),
                           ("jax_gluon_tuned", gluonk.vec_add_tuned, {})):
        site = jax_site(lambda x, y, fn=fn, meta=meta: ltj.triton_call(
            x, y, n=n, kernel=fn, out_type=x, grid=lambda m: (triton.cdiv(n, m["BLOCK"]),), **meta),
            jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32))
        if fn is gluonk.vec_add:
            theirs = triton_launch(fn, (x, y, z, n), meta, (triton.cdiv(n, 512), 1, 1), sizes_env)[0]
        else:
            theirs = [triton_launch(fn.fn, (x, y, z, n), dict(cfg.kwargs), (triton.cdiv(n, cfg.kwargs["BLOCK"]), 1, 1),
                                    sizes_env, options={"num_warps": cfg.num_warps})[0][0] for cfg in fn.configs]
        _, trials, ours = site_launches(site, bufs)
        case = {"case": name, "triton": theirs, "trials": trials, "lazytriton": ours}
        if fn is not gluonk.vec_add:
            case["winner"] = site.lazy.records[-1].winner_index
        out.append(case)
    # scale_rows: a 2D blocked layout and a float scalar (by name) beside the buffers x 0, y 1, out 2.
    M, N = 100, 300
    bufs = [(BASE, M * N * 4), (BASE + 2**22, N * 4), (BASE + 2**23, M * N * 4)]
    meta = {"BM": 16, "BN": 64, "WARPS": 4}
    site = jax_site(lambda x, y: ltj.triton_call(x, y, M=M, N=N, stride_x=N, stride_out=N, alpha=0.375,
                                                 kernel=gluonk.scale_rows, out_type=x, grid=(7, 5), num_warps=4,
                                                 **meta),
                    jax.ShapeDtypeStruct((M, N), f32), jax.ShapeDtypeStruct((N,), f32))
    args = (array((M, N), "fp32", bufs[0][0]), array((N,), "fp32", bufs[1][0]), array((M, N), "fp32", bufs[2][0]),
            M, N, N, N, 0.375)
    theirs = triton_launch(gluonk.scale_rows, args, {**meta, "num_warps": 4}, (7, 5, 1), sizes_env)[0]
    _, trials, ours = site_launches(site, bufs)
    out.append({"case": "jax_gluon_scale_rows", "triton": theirs, "trials": trials, "lazytriton": ours})
    if gluonk.HAVE_DEVICE_TMA and SM90.arch >= 90:
        M, N = 16, 128
        bufs = [(BASE, M * N * 4), (BASE + 2**22, M * N * 4)]
        site = jax_site(lambda x: ltj.triton_call(x, kernel=gluonk.tma_copy, out_type=x, grid=1, M=M, N=N),
                        jax.ShapeDtypeStruct((M, N), f32))
        theirs = triton_launch(gluonk.tma_copy, (array((M, N), "fp32", bufs[0][0]), array((M, N), "fp32", bufs[1][0])),
                               {"M": M, "N": N}, (1, 1, 1), sizes_env)[0]
        _, trials, ours = site_launches(site, bufs)
        out.append({"case": "jax_gluon_tma_copy", "triton": theirs, "trials": trials, "lazytriton": ours})
    return out


def main():
    # Triton's driver utilities (fill_tma_descriptor, load_binary) built against the fake driver.
    utils = nvd.CudaUtils()
    triton.runtime.driver.set_active(types.SimpleNamespace(utils=utils))
    triton.set_allocator(lambda size, align, stream: TritonBase(TRITON_SCRATCH))
    sizes_env: dict = {}
    out = []
    a = array((64, 64), "fp16", BASE + 2**24)
    out.append(run_case("copy", tma.tma_copy_kernel, (desc((256, 128), (64, 64)), a), {"M": 64, "N": 64}, (1, 1, 1),
                        sizes_env, source="kernels.tma:tma_copy_kernel"))
    # A strided view (row stride 192), NaN padding, a block the swizzle splits (fp32 [32, 64] -> boxes of 32).
    d_in = desc((96, 128), (32, 64), "fp32", BASE, strides=(192, 1), padding="nan")
    d_out = desc((96, 128), (32, 64), "fp32", BASE + 2**24)
    out.append(run_case("scale_store", tma.tma_scale_store_kernel, (d_in, d_out, 2.5), {"BM": 32, "BN": 64},
                        (3, 2, 1), sizes_env, source="kernels.tma:tma_scale_store_kernel"))
    # Descriptors (rank 3 and 2) inside a nested tuple, beside a float and an int == 1 (a constexpr there).
    p = array((16,), "fp32", BASE + 2**25)
    descs = (desc((4, 32, 64), (1, 16, 32), "fp32", BASE), (desc((48, 64), (16, 32), "fp32", BASE + 2**24), 0.75, 1))
    o = array((16, 32), "fp32", BASE + 2**26)
    out.append(run_case("tuple_descs", tma.tma_tuple_descs, (p, descs, o, 12345678901), {"M": 16, "N": 32}, (2, 1, 1),
                        sizes_env, flatten=True))
    # Tuples of pointers and scalars (no descriptor).
    x, y, z = (array((1000,), "fp32", BASE + i * 2**22) for i in range(3))
    out.append(run_case("add_pair", tuple_kernels.add_pair, ((x, (y, 1.5)), z, 1000), {"BLOCK": 256}, (4, 1, 1),
                        sizes_env, source="kernels.tuple_kernels:add_pair"))
    if BUNDLE:
        out.append(bundle_case([c for c in out if c["case"] in ("copy", "scale_store", "add_pair")]))
    out.append(autotuned_case(sizes_env))
    out += jax_cases(sizes_env)
    out += gluon_cases(sizes_env)
    Path(sys.argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
