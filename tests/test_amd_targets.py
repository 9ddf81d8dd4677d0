"""AMD targets on the CPU: Triton's AMD backend compiles HSACO here, so naming a
target, compiling for it, its options in the cache keys, HSACO in the cache and
the JAX lowering for ROCm are all checked without an AMD GPU (the launch bytes:
test_launch_bytes_hip.py)."""
import json
import re

import pytest
import triton
import triton.language as tl

from lazytriton.cache import keys
from lazytriton.model.arrays import PointerArg
from lazytriton.cache import Cache
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.compile.targets import device_target, target_for
from lazytriton.model.spec import KernelSpecError, kernel_spec


@triton.jit
def scale(x, out, n, s, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(out + o, tl.load(x + o, mask=m) * s, mask=m)


ARGS = {"x": PointerArg(0x7F0000000000, "fp32"), "out": PointerArg(0x7F0000400000, "fp32"), "n": 1000, "s": 0.5}


def bind(target, **meta):
    spec = kernel_spec(scale)
    return spec, Binder(spec, target).bind((), {**ARGS, "BLOCK": 256, **meta})


@pytest.mark.parametrize("name, backend, arch, warp", [
    ("gfx942", "hip", "gfx942", 64), ("gfx90a", "hip", "gfx90a", 64), ("gfx950", "hip", "gfx950", 64),
    ("gfx1100", "hip", "gfx1100", 32), ("gfx942:sramecc+:xnack-", "hip", "gfx942", 64),
    (90, "cuda", 90, 32), ("sm_90", "cuda", 90, 32), ("sm80", "cuda", 80, 32), ("100", "cuda", 100, 32)])
def test_target_for_names(name, backend, arch, warp):
    t = target_for(name)
    assert (t.backend, t.arch, t.warp_size) == (backend, arch, warp)


@pytest.mark.parametrize("name", ["gfx", "gfx12ab0", "mi300", "sm_9x", ""])
def test_target_for_refuses_unknown_names(name):
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        target_for(name)


def test_device_target_reads_the_backend():
    hip = device_target({"backend": "hip", "arch": "gfx942", "warp_size": 64, "capability": (9, 4)})
    assert (hip.backend, hip.arch, hip.warp_size) == ("hip", "gfx942", 64)
    cuda = device_target({"backend": "cuda", "arch": "sm_90", "warp_size": 32, "capability": (9, 0)})
    assert (cuda.backend, cuda.arch, cuda.warp_size) == ("cuda", 90, 32)
    assert device_target((8, 6)).arch == 86  # a capability tuple, as before


@pytest.mark.parametrize("arch, warp", [("gfx942", 64), ("gfx90a", 64), ("gfx950", 64), ("gfx1100", 32)])
def test_compiles_hsaco_for_amd_targets(arch, warp):
    target = target_for(arch)
    spec, b = bind(target, num_warps=4)
    binary = compile_one(spec, target, b)
    assert binary.cubin[:4] == b"\x7fELF"  # an HSACO code object
    md = binary.metadata
    assert (md["arch"], md["warp_size"], md["target"]) == (arch, warp, {"backend": "hip", "arch": arch, "warp_size": warp})
    assert "hsaco" in binary.asm_names


def test_amd_options_and_target_are_in_the_compile_key():
    def key(target, **meta):
        spec, b = bind(target, **meta)
        return keys.compile_key(spec.fn, b.signature, b.constexprs, b.attrs, vars(b.options), target)

    gfx942 = target_for("gfx942")
    base = key(gfx942)
    assert base == key(gfx942)
    others = [key(target_for("gfx90a")), key(target_for("sm_90")), key(gfx942, waves_per_eu=2),
              key(gfx942, matrix_instr_nonkdim=16), key(gfx942, kpack=2), key(gfx942, num_stages=3)]
    assert len({base, *others}) == 1 + len(others)


def test_a_config_may_set_amd_options_but_not_unknown_names():
    cfgs = [triton.Config({"BLOCK": 256, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}, num_warps=4)]
    kernel_spec(triton.autotune(configs=cfgs, key=["n"])(scale))  # Triton's AMD idiom: options in the kwargs
    bad = [triton.Config({"BLOCK": 256, "waves_per_cu": 2})]
    with pytest.raises(KernelSpecError, match="kernel scale: config 0 sets 'waves_per_cu', which is not a parameter"):
        kernel_spec(triton.autotune(configs=bad, key=["n"])(scale))


def test_hsaco_is_persisted_in_the_cache(tmp_path):
    target = target_for("gfx942")
    spec, b = bind(target)
    binary = compile_one(spec, target, b)
    k = keys.compile_key(spec.fn, b.signature, b.constexprs, b.attrs, vars(b.options), target)
    Cache(tmp_path).store_binary(k, binary)
    again = Cache(tmp_path).load_binary(k)  # a new process's view: from disk
    assert again is not None and again.cubin == binary.cubin and again.metadata["arch"] == "gfx942"


def test_jax_lowers_for_rocm_to_the_handler():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    n = 1000

    def f(x):
        return ltj.triton_call(x, n=n, s=2.0, kernel=scale, out_type=x, grid=lambda m: (triton.cdiv(n, m["BLOCK"]),),
                               BLOCK=256, backend_options={"waves_per_eu": 2})

    aval = jax.ShapeDtypeStruct((n,), jnp.float32)
    text = jax.jit(f).trace(aval).lower(lowering_platforms=("rocm",)).as_text()
    assert re.search(rf"stablehlo.custom_call @{ltj.CUSTOM_CALL_TARGET_NAME}\(", text), text[-3000:]
    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
    d = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))
    assert d["options"].get("waves_per_eu") == 2
    # the same call lowers for CUDA to the same handler: one lowering rule, one target name
    cuda = jax.jit(f).trace(aval).lower(lowering_platforms=("cuda",)).as_text()
    assert f"@{ltj.CUSTOM_CALL_TARGET_NAME}(" in cuda
