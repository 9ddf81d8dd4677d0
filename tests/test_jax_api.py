"""lazytriton.jax's jax-triton 0.4 surface, checked on a machine without a GPU:
what each call lowers to for CUDA, and the errors (kernel and argument named)."""
import json
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lazytriton import jax as ltj  # noqa: E402

F32 = jax.ShapeDtypeStruct((64,), jnp.float32)


@triton.jit
def inc_kernel(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def n_first_inc_kernel(n, x, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def acc_kernel(x, acc, n, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(acc + offs, mask=m)
    tl.store(out + offs, tl.load(x + offs, mask=m) + a, mask=m)
    tl.store(acc + offs, a + 1, mask=m)


@triton.jit
def old_inc_kernel(x, n, out, BLOCK: tl.constexpr):  # jax-triton 0.3's convention: out aliases x
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def scale_kernel(x, s, out, BLOCK: tl.constexpr = 64):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs) * s)


@triton.jit
def copy_twice_kernel(a, x, y):
    v = tl.load(a)
    tl.store(x, v)
    tl.store(y, v)


@triton.jit
def add_fn(a, b):
    return a + b


@triton.jit
def mul_fn(a, b):
    return a * b


@triton.jit
def dispatch_kernel(x, y, out, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, FN(tl.load(x + offs), tl.load(y + offs)))


def lowered(f, *avals):
    return jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",))


def text(f, *avals) -> str:
    return lowered(f, *avals).as_text()


def payload(t: str) -> dict:
    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', t)
    assert m, t
    return json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))


def inc_aliased(x):
    return ltj.triton_call(x, 64, kernel=inc_kernel, out_type=x, grid=(1,), BLOCK=64, input_output_aliases={0: 0})


def inc_ref(x):
    r = jax.new_ref(x)
    assert ltj.triton_call(r, 64, kernel=inc_kernel, out_type=(), grid=(1,), BLOCK=64) == ()
    return r[...]


# -- Refs and aliases ----------------------------------------------------------

def test_ref_is_updated_in_place_and_lowers_as_an_alias():
    t_ref, t_alias = text(inc_ref, F32), text(inc_aliased, F32)
    d = payload(t_ref)
    assert d == payload(t_alias)  # one call site: same binding, same tuning record
    assert d["aliases"] == [[0, 0]] and d["args"][0]["buffer"] == 1  # the kernel writes the output buffer
    assert "output_operand_aliases" in t_ref


def test_scalar_before_ref_and_ref_with_an_allocated_output():
    def scalar_first(x):
        r = jax.new_ref(x)
        ltj.triton_call(64, r, kernel=n_first_inc_kernel, out_type=(), grid=(1,), BLOCK=64)
        return r[...]

    d = payload(text(scalar_first, F32))
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [64, 1, 64] and d["aliases"] == [[0, 0]]

    def with_output(x, acc):
        r = jax.new_ref(acc)
        out = ltj.triton_call(x, r, 64, kernel=acc_kernel, out_type=x, grid=(1,), BLOCK=64)
        return out, r[...]

    d = payload(text(with_output, F32, F32))
    # x: input 0; acc: input 1 aliased to the Ref's output (1); out: output 0.
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 2 + 1, 64, 2 + 0, 64]
    assert d["aliases"] == [[1, 1]]


def test_aliases_with_refs_are_refused_clearly():
    # (Refs inside tuple arguments are taken: tests/test_tuples.py.)
    def both(x):
        r = jax.new_ref(x)
        return ltj.triton_call(r, 64, kernel=inc_kernel, out_type=x, grid=(1,), BLOCK=64,
                               input_output_aliases={0: 0})

    with pytest.raises(ValueError, match="cannot be combined with Ref"):
        lowered(both, F32)

    def no_outputs(x):  # as jax-triton's own test: the Ref is the cause, whatever the indices say
        r = jax.new_ref(x)
        ltj.triton_call(r, 64, kernel=inc_kernel, out_type=(), grid=(1,), BLOCK=64, input_output_aliases={0: 0})
        return r[...]

    with pytest.raises(ValueError, match="cannot be combined with Ref"):
        lowered(no_outputs, F32)


def test_old_alias_convention_gets_the_0_4_explanation():
    f = lambda x: ltj.triton_call(x, 64, kernel=old_inc_kernel, out_type=x, grid=(1,), BLOCK=64,  # noqa: E731
                                  input_output_aliases={0: 0})
    with pytest.raises(ValueError, match=r"old_inc_kernel: out_type has 0 unaliased outputs, but 1 kernel "
                                         r"parameters have no argument \(out\).*NOT declared again"):
        lowered(f, F32)


def test_alias_indices_count_flattened_operands_scalars_included():
    f = lambda x: ltj.triton_call(64, x, kernel=n_first_inc_kernel, out_type=x, grid=(1,), BLOCK=64,  # noqa: E731
                                  input_output_aliases={1: 0})
    assert payload(text(f, F32))["aliases"] == [[0, 0]]
    g = lambda x: ltj.triton_call(64, x, kernel=n_first_inc_kernel, out_type=x, grid=(1,), BLOCK=64,  # noqa: E731
                                  input_output_aliases={0: 0})
    with pytest.raises(ValueError, match="operand 0 is a scalar"):
        lowered(g, F32)


def test_zeroed_outputs_index_flattened_outputs_aliased_ones_included():
    f = lambda x, y: ltj.triton_call(x, y, 64, kernel=acc_kernel, out_type={"acc": y, "out": x},  # noqa: E731
                                     grid=(1,), BLOCK=64, input_output_aliases={1: 0}, zeroed_outputs=(0,))
    d = payload(text(f, F32, F32))
    assert d["configs"][0]["zeroed"] == [0] and d["args"][1]["buffer"] == 2 + 0 and d["args"][3]["buffer"] == 2 + 1


# -- out_type, pytrees, options ---------------------------------------------------

def test_out_type_and_the_deprecated_out_shape():
    pytree = lambda a: {"a": a, "bs": (a,)}  # noqa: E731
    g = lambda a: ltj.triton_call(a, kernel=copy_twice_kernel, out_type=pytree(a), grid=(1,))  # noqa: E731
    out = jax.eval_shape(g, jax.ShapeDtypeStruct((1,), jnp.int32))
    assert jax.tree.structure(out) == jax.tree.structure(pytree(0))
    with pytest.warns(DeprecationWarning, match="out_shape= is deprecated"):
        jax.eval_shape(lambda x: ltj.triton_call(x, 64, kernel=inc_kernel, out_shape=x, grid=(1,), BLOCK=64,
                                                 input_output_aliases={0: 0}), F32)
    with pytest.raises(TypeError, match="not both"):
        jax.eval_shape(lambda x: ltj.triton_call(x, 64, kernel=inc_kernel, out_shape=x, out_type=x, grid=(1,),
                                                 BLOCK=64), F32)


def test_backend_options_merge_and_conflict_as_jax_triton():
    f = lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,),  # noqa: E731
                                  backend_options={"num_warps": 2, "enable_fp_fusion": False, "maxnreg": 128})
    assert payload(text(f, F32))["options"] == {"num_warps": 2, "enable_fp_fusion": False, "maxnreg": 128}
    with pytest.raises(ValueError, match=r"scale_kernel: cannot specify \['num_warps'\].*backend_options"):
        lowered(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,), num_warps=4,
                                          backend_options={"num_warps": 2}), F32)
    with pytest.raises(TypeError, match=r"backend_options\['extern_libs'\] must be hashable"):
        lowered(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,),
                                          backend_options={"extern_libs": {"libdevice": "/p"}}), F32)
    with pytest.raises(ValueError, match=r"backend_options\['sanitize_overflow'\] is not a compile option"):
        lowered(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,),
                                          backend_options={"sanitize_overflow": True}), F32)


def test_option_values_checked_where_given():
    # Not inside the first compile, with Triton's "'>' not supported between 'str' and 'int'".
    with pytest.raises(TypeError, match=r"triton_call scale_kernel: num_warps='4': num_warps takes an int"):
        lowered(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,), num_warps="4"), F32)
    with pytest.raises(ValueError, match=r"triton_call scale_kernel: num_stages=-1: num_stages takes an int >= 0"):
        lowered(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,),
                                          backend_options={"num_stages": -1}), F32)


def test_bad_out_type_says_its_cause_alone():
    with pytest.raises(TypeError, match=r"triton_call scale_kernel: out_type takes a pytree of objects with .shape "
                                        r"and .dtype .* it holds 'f32' \(str\)") as info:
        lowered(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type="f32", grid=(1,)), F32)
    # Not shown after lazytriton's own "AttributeError: 'str' object has no attribute 'shape'".
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_lowering_for_the_cpu_says_a_gpu_is_needed():
    f = lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,))  # noqa: E731
    with pytest.raises(NotImplementedError, match=r"triton_call scale_kernel: a Triton kernel runs on a CUDA or ROCm "
                                                  r"GPU, and JAX is lowering this call for cpu .*"
                                                  r"lower\(lowering_platforms=\(\"cuda\",\)\)"):
        jax.jit(f).trace(F32).lower(lowering_platforms=("cpu",))
    assert "custom_call" in text(f, F32)  # what the error suggests works without a GPU


def test_readme_jax_example_without_a_gpu_says_a_gpu_is_needed():
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has a GPU here: the example runs (tests/test_gpu_readme.py)")
    x = jnp.ones(64, jnp.float32)
    with pytest.raises(NotImplementedError, match=r"triton_call scale_kernel: a Triton kernel runs on a CUDA or ROCm"):
        jax.jit(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,)))(x)


@triton.heuristics({"EVEN": lambda a: a["n"] % 64 == 0, "SCALE": lambda a: 2 * a.get("SCALE", 1)})
@triton.jit
def heuristic_scale_kernel(x, n, out, EVEN: tl.constexpr, SCALE: tl.constexpr):
    offs = tl.arange(0, 64)
    v = tl.load(x + offs) * SCALE
    if EVEN:
        v += 1
    tl.store(out + offs, v)


def test_keyword_a_heuristic_sets_is_overwritten_as_triton_does():
    """Triton's Heuristics.run overwrites a call's keyword of the name it sets, the heuristic
    seeing the call's value (JAX code passes USE_INITIAL_STATE= or IS_VARLEN= to such kernels);
    lazytriton.jax once refused it."""
    def call(**kw):
        return lambda x: ltj.triton_call(x, 64, kernel=heuristic_scale_kernel, out_type=x, grid=(1,), **kw)

    assert payload(text(call(), F32))["configs"][0]["heuristics"] == {"EVEN": True, "SCALE": 2}
    # EVEN overwritten (the heuristic does not read it); SCALE's heuristic reads the call's value.
    d = payload(text(call(EVEN=False, SCALE=4), F32))
    assert d["configs"][0]["heuristics"] == {"EVEN": True, "SCALE": 8}


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128})], key=[])
@triton.jit
def tuned_scale_kernel(x, s, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs) * s)


def test_launch_options_reach_every_config_of_an_autotuned_kernel():
    """Options no triton.Config carries (launch_pdl, debug, enable_fp_fusion) reach every config,
    as Triton merges a call's options with each config's; lazytriton.jax once refused them."""
    from lazytriton.jax import ffi as jax_ffi

    f = lambda x: ltj.triton_call(x, 2.0, kernel=tuned_scale_kernel, out_type=x, grid=(1,),  # noqa: E731
                                  backend_options={"launch_pdl": True, "enable_fp_fusion": False, "maxnreg": 96})
    d = payload(text(f, F32))
    assert d["options"] == {"launch_pdl": True, "enable_fp_fusion": False}
    assert [c.get("maxnreg") for c in d["configs"]] == [96, 96]  # maxnreg: a Config field, set per config
    site = jax_ffi.Site(d)
    assert site.options == {"launch_pdl": True, "enable_fp_fusion": False}
    for cfg in site.lazy.spec.configs:  # what each candidate compiles with
        meta = site.lazy.meta_kwargs(cfg, {}, site.options)
        assert meta["launch_pdl"] is True and meta["enable_fp_fusion"] is False and meta["maxnreg"] == 96


def test_has_side_effect_cost_estimate_and_no_jaxpr_dce():
    call = lambda x, **kw: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,), **kw)  # noqa: E731
    assert "has_side_effect = true" in text(lambda x: call(x, has_side_effect=True), F32)
    assert "has_side_effect = true" not in text(call, F32)
    hlo = jax.jit(lambda x: call(x, cost_estimate={"flops": 123, "bytes_accessed": 456})).trace(F32).lower(
        lowering_platforms=("cuda",)).compiler_ir("hlo").as_hlo_text()
    assert re.search(r"cost_estimate_json\s*=\s*.*flops\\22\s*:\s*123", hlo)
    jaxpr = jax.make_jaxpr(lambda x: call(x, has_side_effect=True))(F32)
    assert jaxpr.eqns[0].params["has_side_effect"] is True
    from jax._src.interpreters import partial_eval as pe

    dced, _ = pe.dce_jaxpr(jaxpr.jaxpr, [False])
    assert [e.primitive for e in dced.eqns] == [ltj.triton_call_p]


def test_keyword_scalar_operand_stays_out_of_the_metaparameters():
    jaxpr = jax.make_jaxpr(lambda x: ltj.triton_call(x, s=3.0, kernel=scale_kernel, out_type=x, grid=(1,)))(F32)
    (eqn,) = jaxpr.eqns
    assert len(eqn.invars) == 1 and "s" not in eqn.params["metaparams"] and eqn.params["metaparams"]["BLOCK"] == 64


def test_callable_constexpr_travels_by_name():
    call = lambda fn: lambda x, y: ltj.triton_call(x, y, kernel=dispatch_kernel, out_type=x,  # noqa: E731
                                                   grid=(1,), FN=fn, BLOCK=64)
    d_add, d_mul = payload(text(call(add_fn), F32, F32)), payload(text(call(mul_fn), F32, F32))
    assert d_add["args"][3]["scalar"]["$jit"]["qualname"] == "add_fn"
    assert d_add != d_mul
    from lazytriton.jax import ffi as jax_ffi

    assert jax_ffi._decode(d_add["args"][3]["scalar"]) is add_fn
    with pytest.raises(TypeError, match=r"dispatch_kernel: FN=.*must be bool, int, float, str, None or a "
                                        r"@triton.jit function"):
        lowered(call(lambda a, b: a), F32, F32)


def test_python_floats_are_fp32_when_representable_else_fp64():
    """jax-triton 0.4's rule: the binder's type of a float for an unannotated
    parameter, checked on the call site the handler rebuilds (signature, stub
    slot) and in the compiled kernel's parameter list."""
    from lazytriton.jax import ffi as jax_ffi
    from lazytriton.compile.compiler import Binder, compile_one
    from lazytriton.compile.targets import default_target
    from lazytriton.model.arrays import PointerArg

    call = lambda s: lambda x: ltj.triton_call(x, s, kernel=scale_kernel, out_type=x, grid=(1,))  # noqa: E731
    for s_val, want in ((42.0, "fp32"), (1e-30, "fp32"), (float("inf"), "fp32"), (0.0, "fp32"),
                        (np.float32(3.0), "fp32"), (1e-300, "fp64"), (-3e200, "fp64")):
        d = payload(text(call(s_val), F32))
        site = jax_ffi.Site(d)
        args = (PointerArg(1 << 20, "fp32"), float(s_val), PointerArg(1 << 21, "fp32"))
        slot = site.lazy._shape(args).slots[1]
        assert slot.kind == "float" and slot.float_type == want, (s_val, slot)
        bound = Binder(site.lazy.spec, default_target()).bind(args, {"BLOCK": 64})
        assert bound.signature["s"] == want, (s_val, bound.signature)
    binary = compile_one(site.lazy.spec, default_target(), bound)  # the last one: fp64
    assert re.search(r"%s: f64", binary.ttir), binary.ttir[:600]


# -- errors, transformations ----------------------------------------------------

def test_autodiff_raises_not_implemented():
    f = lambda x: jnp.sum(ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,)))  # noqa: E731
    with pytest.raises(NotImplementedError, match=r"triton_call scale_kernel cannot be differentiated.*"
                                                  r"jax\.custom_jvp or jax\.custom_vjp"):
        jax.jit(jax.grad(f)).trace(F32)


def test_pre_hooks_raise_not_implemented():
    k = triton.autotune([triton.Config({"BLOCK": 64}, pre_hook=lambda args: None)], key=["n"])(
        triton.jit(inc_kernel.fn))
    with pytest.raises(NotImplementedError, match="config 0 .* has a pre_hook"):
        lowered(lambda x: ltj.triton_call(x, 64, kernel=k, out_type=x, grid=(1,), input_output_aliases={0: 0}), F32)


def test_vmap_runs_the_call_per_element():
    f = jax.vmap(lambda x: ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,)))
    t = text(f, jax.ShapeDtypeStruct((3, 64), jnp.float32))
    assert t.count("custom_call @lazytriton_triton_call") == 1 and "stablehlo.while" in t
    assert payload(t)["args"][0]["shape"] == [64]


# -- jax.export ----------------------------------------------------------------

def test_export_for_cuda_deserializes_in_a_fresh_process(tmp_path):
    pytest.importorskip("flatbuffers")  # jax.export's serialization needs it
    assert ltj.CUSTOM_CALL_TARGET_NAME == "lazytriton_triton_call"
    exp = jax.export.export(
        jax.jit(inc_aliased), platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(ltj.CUSTOM_CALL_TARGET_NAME)])(F32)
    path = tmp_path / "inc.jax"
    path.write_bytes(exp.serialize())
    code = (
        "import sys, json, jax\n"
        "exp = jax.export.deserialize(open(sys.argv[1], 'rb').read())\n"
        "t = exp.mlir_module()\n"
        "print(json.dumps({'platforms': exp.platforms, 'target': 'lazytriton_triton_call' in t,\n"
        "                  'aliased': 'tf.aliasing_output' in t or 'output_operand_aliases' in t,\n"
        "                  'lazytriton_loaded': 'lazytriton' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"platforms": ["cuda"], "target": True, "aliased": True, "lazytriton_loaded": False}
    with pytest.raises(ValueError, match="lazytriton_triton_call"):  # the safety check names our target
        jax.export.export(jax.jit(inc_aliased), platforms=["cuda"])(F32)
