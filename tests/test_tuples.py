"""Tuple arguments (issue 10), without a GPU: lazytriton's leaves must say
exactly what Triton's own binder says about every tuple element (type, == 1
folded into a constexpr, tt.divisibility 16, the path it is keyed by), the
stubs (generated and table-driven) must read the elements into the same key
bits and bytes, check the structure, and the keys must tell apart what
compiles differently. Pointers are made-up addresses nothing dereferences."""
import struct

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton import _core
from lazytriton.runtime import stubgen
from lazytriton.model import tuples
from lazytriton.model.arrays import DeviceArray
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.runtime import fixed
from lazytriton.runtime.tuner import written_buffers

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def nested(xs, out, n, BLOCK: tl.constexpr):
    # xs = (x, (y, scale, k)): out = x + y * scale * k; y is overwritten with x.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(xs[0] + offs, mask=m)
    b = tl.load(xs[1][0] + offs, mask=m)
    tl.store(out + offs, a + b * xs[1][1] * xs[1][2], mask=m)
    tl.store(xs[1][0] + offs, a, mask=m)


@triton.jit(do_not_specialize=["xs", "n"])
def nospec(xs, n):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["sizes"])
@triton.jit
def keyed(xs, sizes, out, BLOCK: tl.constexpr):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=[], reset_to_zero=["xs"])
@triton.jit
def zeroing(xs, out, BLOCK: tl.constexpr):
    pass


def arr(addr: int, dtype: str = "fp32") -> DeviceArray:
    return DeviceArray(addr, dtype, 4096)


A, B, C = 0x7F0000000000, 0x7F0000000100, 0x7F0000000200  # 16-byte aligned
ODD = 0x7F0000000004


def shape_and_stubs(k, args):
    shape = k._shape(args)
    return shape, stubgen.load_stub(shape), stubgen.generic_stub(shape)


@pytest.fixture
def k(cache_dir):
    return lazytriton.kernel(nested)


def test_leaves_paths_and_structure(k):
    args = ((arr(A), (arr(B, "fp16"), 2.5, 7)), arr(C), 100, 64)
    shape = k._shape(args)
    assert shape.names == ("xs[0]", "xs[1][0]", "xs[1][1]", "xs[1][2]", "out", "n", "BLOCK")
    assert shape.paths == ((0, 0), (0, 1, 0), (0, 1, 1), (0, 1, 2), (1,), (2,), (3,))
    assert shape.args == ("xs", "out", "n", "BLOCK")
    assert shape.tuples == (((0,), 2), ((0, 1), 3))
    assert [s.param_type() for s in shape.slots] == ["*fp32", "*fp16", "fp32", "i32", "*fp32", "i32", "constexpr"]
    assert shape.leaf_values(args)[1:4] == [args[0][1][0], 2.5, 7]
    # No tuple: the shape (and its digest, so existing stubs and tuning keys) is as before.
    flat = lazytriton.kernel(keyed)._shape((arr(A), 3, arr(B)))
    assert flat.flat and flat.arg_names == flat.names


def triton_view(binder: Binder, shape, args):
    """Per leaf, from Triton's binder: (type, folded into a constexpr, tt.divisibility 16)."""
    bound = binder.bind((), dict(zip(shape.arg_names, args)))
    flat = tuples.flat_signature(bound.signature)
    out = {}
    for name, path in zip(shape.names, shape.slot_paths()):
        folded = path in bound.constexprs
        div = ["tt.divisibility", 16] in bound.attrs.get(path, [])
        out[name] = (flat[name], folded, div)
    return out, bound


ELEMENT_VALUES = [0, 1, 2, 16, 17, 32, -16, 2**31 - 16, 2**31, 2**40, 2**40 + 1, 2**63 + 16, 2**63 + 5]


@pytest.mark.parametrize("stub_kind", ["generated", "generic"])
@pytest.mark.parametrize("value", ELEMENT_VALUES)
def test_element_specialization_matches_triton(k, stub_kind, value):
    binder = Binder(k.spec, TARGET)
    for addr in (A, ODD):
        args = ((arr(addr), (arr(B), 1.5, value)), arr(C), 33, 64)
        shape, gen, generic = shape_and_stubs(k, args)
        stub = gen if stub_kind == "generated" else generic
        key = stub.key(args)
        view, bound = triton_view(binder, shape, args)
        for i, (name, slot) in enumerate(zip(shape.names, shape.slots)):
            t, folded, div = view[name]
            bits = (key[(2 * i) // 64] >> ((2 * i) % 64)) & 3
            if slot.kind == "int":
                assert bits == (int(folded) | int(div) << 1), (name, value, bits, t, folded, div)
                if not folded:
                    assert t == slot.int_type, (name, value)
            elif slot.kind == "ptr":
                assert bits == int(div) and t == slot.param_type(), (name, hex(addr))
            else:
                assert bits == 0 and not div
                assert t == ("constexpr" if slot.kind == "constexpr" else slot.param_type())
        # The kernel parameters the stub packs are Triton's, leaf by leaf.
        params = stub.params(args)
        assert struct.unpack("<Q", params[0])[0] == addr
        assert params[2] == struct.pack("<f", 1.5)
        assert len(params[3]) == {"i32": 4, "i64": 8, "u64": 8}[shape.slots[3].int_type]


def test_tuple_elements_ignore_do_not_specialize(cache_dir):
    """Triton specializes a tuple's elements with its defaults, whatever the parameter says."""
    k = lazytriton.kernel(nospec)
    args = ((1, 32, arr(A)), 16)
    shape, gen, generic = shape_and_stubs(k, args)
    bound = Binder(k.spec, TARGET).bind((), dict(zip(shape.arg_names, args)))
    assert bound.constexprs[(0, 0)] == 1 and bound.signature["xs"] == ("constexpr", "i32", "*fp32")
    assert ["tt.divisibility", 16] in bound.attrs[(0, 1)] and ["tt.divisibility", 16] in bound.attrs[(0, 2)]
    assert bound.signature["n"] == "i32" and not bound.attrs.get((1,))  # n itself: not specialized
    assert [s.specialize for s in shape.slots[:3]] == [True, True, True]
    key = gen.key(args)
    assert key == generic.key(args)
    assert key[0] & 0b111111 == 0b1 | 0b10 << 2 | 0b01 << 4  # ==1; %16; aligned
    assert (key[0] >> 6) & 3 == 0  # n: do_not_specialize


def test_constexpr_none_bool_and_jit_elements(k):
    args = ((arr(A), (arr(B), 2.0, tl.constexpr(5))), arr(C), 10, 64)
    shape = k._shape(args)
    assert [s.kind for s in shape.slots[:4]] == ["ptr", "ptr", "float", "constexpr"]
    b = Binder(k.spec, TARGET).bind((), dict(zip(shape.arg_names, args)))
    assert b.signature["xs"] == ("*fp32", ("*fp32", "fp32", "constexpr"))
    gen = stubgen.load_stub(shape)
    k5, k6 = gen.key(args), gen.key(((arr(A), (arr(B), 2.0, tl.constexpr(6))), arr(C), 10, 64))
    assert k5 != k6  # constexpr elements are keyed by value
    mixed = (None, True, nested)
    shape2 = k._shape((mixed, arr(C), 10, 64))
    assert [s.kind for s in shape2.slots[:3]] == ["constexpr", "bool", "constexpr"]


def test_keys_tell_apart_dtypes_alignment_and_structure(k):
    base = ((arr(A), (arr(B), 2.0, 3)), arr(C), 10, 64)
    s0 = k._shape(base)
    other_dtype = ((arr(A), (arr(B, "bf16"), 2.0, 3)), arr(C), 10, 64)
    s1 = k._shape(other_dtype)
    assert s0.digest() != s1.digest()
    gen = stubgen.load_stub(s0)
    handle = _core.ResolveTable("nested")
    assert gen.launch(handle.handle, (1,), 0, other_dtype) is None  # another shape: the stub declines it
    unaligned = ((arr(A), (arr(ODD), 2.0, 3)), arr(C), 10, 64)
    assert gen.key(unaligned) != gen.key(base)
    # Another nesting with the same leaves: another shape, and the stub declines it.
    for other in [((arr(A), arr(B), 2.0, 3), arr(C), 10, 64), (((arr(A), (arr(B), 2.0)), 3), arr(C), 10, 64)]:
        assert k._shape(other).digest() != s0.digest()
        assert gen.key(other) is None and stubgen.generic_stub(s0).key(other) is None
    # A length-1 tuple, an empty one, a list: each is its own shape or refused.
    assert gen.key(((arr(A), (arr(B), 2.0, 3, 4)), arr(C), 10, 64)) is None
    assert gen.key((arr(A), arr(C), 10, 64)) is None
    assert gen.key(([arr(A), (arr(B), 2.0, 3)], arr(C), 10, 64)) is None
    e = k._shape(((), arr(C), 10, 64))
    assert e.tuples == (((0,), 0),) and e.names == ("out", "n", "BLOCK")
    assert stubgen.load_stub(e).key(((), arr(C), 10, 64)) is not None
    assert stubgen.generic_stub(e).key(((1,), arr(C), 10, 64)) is None


def test_autotune_key_naming_a_tuple_keys_its_elements(cache_dir):
    k = lazytriton.kernel(keyed)
    args = ((arr(A), arr(B)), (100, 7.5, True), arr(C))
    shape = k._shape(args)
    assert [s.in_key for s in shape.slots] == [False, False, True, True, True, False]
    gen = stubgen.load_stub(shape)
    key = gen.key(args)
    assert key == stubgen.generic_stub(shape).key(args)
    assert key[1:4] == (100, struct.unpack("<Q", struct.pack("<d", 7.5))[0], 1)
    assert gen.key(((arr(A), arr(B)), (101, 7.5, True), arr(C)))[1] == 101
    assert shape.portable_key(key, args) == key[:-1]


@pytest.mark.parametrize("bad, match", [
    ((arr(A), [arr(B)]), r"argument xs\[1\]: unsupported argument type list"),
    ((arr(A), ("x",)), r"argument xs\[1\]\[0\]: unsupported argument type str"),
    ((arr(A), object()), r"argument xs\[1\]: unsupported argument type object"),
])
def test_bad_elements_are_named(k, bad, match):
    with pytest.raises(TypeError, match=rf"kernel nested, {match}"):
        k[(1,)](bad, arr(C), 10, BLOCK=64)


def test_named_tuples_and_reset_to_zero_on_a_tuple_are_refused(k):
    import collections

    Pair = collections.namedtuple("Pair", "x y")
    with pytest.raises(TypeError, match=r"kernel nested, argument xs: is a named tuple \(Pair\)"):
        k[(1,)](Pair(arr(A), (arr(B), 1.0, 2)), arr(C), 10, BLOCK=64)
    z = lazytriton.kernel(zeroing)
    with pytest.raises(TypeError, match="kernel zeroing, argument xs: is a tuple, and reset_to_zero names it"):
        z[(1,)]((arr(A), arr(B)), arr(C))


def test_compiled_kernel_flattens_tuple_leaves_like_the_stub(k):
    """The binary's parameters are the tuple's non-constexpr leaves in order
    (TTIR header), and the written-buffer analysis names the element written."""
    args = ((arr(A), (arr(B), 2.0, 1)), arr(C), 100, 64)
    shape = k._shape(args)
    bound = Binder(k.spec, TARGET).bind((), dict(zip(shape.arg_names, args)))
    assert bound.constexprs[(0, 1, 2)] == 1  # the 1 inside the tuple is folded
    binary = compile_one(k.spec, TARGET, bound)
    header = binary.ttir.split("tt.func public")[1].split("attributes")[0]
    import re
    params = re.findall(r"%([\w.]+): ([^ ]+)", header)
    assert [ty for _, ty in params] == ["!tt.ptr<f32>", "!tt.ptr<f32>", "f32", "!tt.ptr<f32>", "i32"]
    # Triton 3.7+ names tuple elements by path; 3.5/3.6 number them (xs, xs_0, xs_1).
    assert [n for n, _ in params] in (["xs.0", "xs.1.0", "xs.1.1", "out", "n"], ["xs", "xs_0", "xs_1", "out", "n"])
    cand = type("C", (), {})()
    cand.bound, cand.binary = bound, binary
    names = list(shape.names[:-1])
    values = tuple(shape.leaf_values(args)[:-1])
    arrays = {n: (v.ptr, 4096) for n, v in zip(names, values) if isinstance(v, DeviceArray)}
    assert written_buffers([cand], names, arrays, []) == ["out", "xs[1][0]"]
    # Which leaves are kernel parameters: the 1 is not.
    is_param = bound.is_param(names)
    assert is_param == [True, True, True, False, True, True]
    # A fixed-layout launch (the tuner's trials) reads the leaves in that order, from the slot table.
    index = {n: i for i, n in enumerate(n for n in names if n in arrays)}
    sources = fixed.param_sources("kernel z", list(shape.table()[:-1]), is_param, names, values,
                                  lambda i: index[names[i]])
    assert sources == [(0, 0), (1, 0), (-1, 0x40000000), (2, 0), (-1, 100)]  # 2.0 as fp32 bits


def test_generic_stub_layout_is_validated():
    G = __import__("lazytriton._generic_stub", fromlist=["Stub"])
    row = (1, -1, 0, 0, 1, 0, 1, 2)
    with pytest.raises(ValueError, match="not inside"):
        G.Stub(("a",), (row,), 2, 0, ("xs",), ((0, 3),), (((0,), 2),))  # element 3 of a 2-tuple
    with pytest.raises(ValueError, match="not inside"):
        G.Stub(("a",), (row,), 2, 0, ("xs",), ((1,),), ())  # argument 1 of 1
    s = G.Stub(("a",), (row,), 2, 0, ("xs",), ((0, 1),), (((0,), 2),))
    assert s.key(((5, 9),)) == (0, 0) and s.key(((5, 32),)) == (2, 0) and s.key(((5, 1),)) == (1, 0)
    assert s.params(((5, 9),)) == (struct.pack("<i", 9),)
    assert s.key(((5, 9, 1),)) is None and s.key((5,)) is None and s.key(([5, 9],)) is None


# -- JAX: tuples of arrays, Refs and scalars, flattened as in jax-triton 0.4 ------------------

@triton.jit
def pair_add(xs, out, n, BLOCK: tl.constexpr):
    # xs = (x, (y, scale)): out = x + y * scale
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(xs[0] + offs, mask=m) + tl.load(xs[1][0] + offs, mask=m) * xs[1][1], mask=m)


@triton.jit
def pair_inc(xs, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(xs[0] + offs, tl.load(xs[0] + offs, mask=m) + 1, mask=m)
    tl.store(xs[1] + offs, tl.load(xs[1] + offs, mask=m) + 2, mask=m)


def _jax():
    return pytest.importorskip("jax")


def lower_text(f, *avals) -> str:
    jax = _jax()
    return jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


def jax_descriptor(t: str) -> dict:
    import json
    import re

    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', t)
    assert m, t
    return json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))


def test_jax_tuple_argument_lowers_flattened():
    jax = _jax()
    import jax.numpy as jnp
    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    f32 = jax.ShapeDtypeStruct((256,), jnp.float32)
    f16 = jax.ShapeDtypeStruct((256,), jnp.float16)

    def f(x, y):
        return ltj.triton_call((x, (y, 2.5)), n=256, kernel=pair_add, out_type=x, grid=(2,), BLOCK=128)

    d = jax_descriptor(lower_text(f, f32, f16))
    assert d["v"] == jax_ffi.PAYLOAD_VERSION >= 5
    assert [a["name"] for a in d["args"]] == ["xs[0]", "xs[1][0]", "xs[1][1]", "out", "n", "BLOCK"]
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 1, 2.5, 2, 256, 128]
    assert [a.get("dtype") for a in d["args"][:2]] == ["fp32", "fp16"]
    assert d["layout"] == [[0, [1, 2]], 3, 4, 5]
    # Another nesting of the same leaves is another call site.
    g = lambda x, y: ltj.triton_call(((x, y), 2.5), n=256, kernel=pair_add, out_type=x, grid=(2,), BLOCK=128)  # noqa
    assert jax_descriptor(lower_text(g, f32, f16))["layout"] == [[[0, 1], 2], 3, 4, 5]

    # The handler's side: the call rebuilt from the payload and the buffers is
    # the tuple the kernel was traced with, and lazytriton reads it as leaves.
    d["n_inputs"], d["aliases"] = 2, []
    for a in d["args"]:
        if "input" in a:
            a["buffer"] = a.pop("input")
    site = jax_ffi.Site(d)
    args = site.call_args(((A, 1024), (B, 512), (C, 1024)))
    assert isinstance(args[0], tuple) and isinstance(args[0][1], tuple) and args[0][1][1] == 2.5
    assert args[0][0].ptr == A and args[0][1][0].ptr == B and args[1].ptr == C and args[2:] == [256, 128]
    shape = site.lazy._shape(tuple(args))
    assert shape.names == ("xs[0]", "xs[1][0]", "xs[1][1]", "out", "n", "BLOCK")
    assert [s.param_type() for s in shape.slots[:3]] == ["*fp32", "*fp16", "fp32"]
    assert stubgen.generic_stub(shape).key(tuple(args)) is not None


def test_jax_aliases_index_flattened_operands_and_refs_inside_tuples():
    jax = _jax()
    import jax.numpy as jnp
    from lazytriton import jax as ltj

    f32 = jax.ShapeDtypeStruct((64,), jnp.float32)

    def aliased(a, b):  # operands: xs[0] = 0, xs[1] = 1, n = 2 (jax-triton 0.4 counts the flattened leaves)
        return ltj.triton_call((a, b), 64, kernel=pair_inc, out_type=(a, b), grid=(1,), BLOCK=64,
                               input_output_aliases={0: 0, 1: 1})

    t = lower_text(aliased, f32, f32)
    d = jax_descriptor(t)
    assert d["aliases"] == [[0, 0], [1, 1]] and "output_operand_aliases" in t
    assert [a.get("buffer") for a in d["args"][:2]] == [2, 3]  # each element writes its output buffer

    def refs(a, b):
        ra = jax.new_ref(a)
        assert ltj.triton_call((ra, b), 64, kernel=pair_inc, out_type=(), grid=(1,), BLOCK=64) == ()
        return ra[...]

    with pytest.raises(ValueError, match="operand 2 is a scalar"):
        lower_text(lambda a, b: ltj.triton_call((a, b), 64, kernel=pair_inc, out_type=a, grid=(1,), BLOCK=64,
                                                input_output_aliases={2: 0}), f32, f32)
    dr = jax_descriptor(lower_text(refs, f32, f32))
    # The Ref inside the tuple is discharged into an input aliased to an extra output.
    assert dr["aliases"] == [[0, 0]] and dr["args"][0]["buffer"] == 2 and dr["args"][1]["buffer"] == 1


def test_jax_bad_tuple_arguments_are_named():
    jax = _jax()
    import collections

    import jax.numpy as jnp
    from lazytriton import jax as ltj

    f32 = jax.ShapeDtypeStruct((64,), jnp.float32)
    Pair = collections.namedtuple("Pair", "a b")
    cases = [
        (lambda a, b: ([a, b], 64), r"argument xs is a list; pass a plain tuple"),
        (lambda a, b: (Pair(a, b), 64), r"argument xs is a Pair; pass a plain tuple"),
        (lambda a, b: ((a, [b]), 64), r"argument xs\[1\] is a list"),
        (lambda a, b: ((a, tl.constexpr(3)), 64), r"argument xs\[1\] is a constexpr"),
    ]
    for make, match in cases:
        with pytest.raises(TypeError, match=rf"triton_call pair_inc: {match}"):
            lower_text(lambda a, b: ltj.triton_call(*make(a, b), kernel=pair_inc, out_type=(), grid=(1,),
                                                    BLOCK=64), f32, f32)


# -- C++ bundles: a tuple argument is one signature entry, its elements separate launch arguments ------

CPP_TEST = r"""
#include "launch_add_pair.h"

int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  auto add = b.kernel("tuple_kernels:add_pair", "[*fp32,[*fp32,fp32]],*fp32,i32", {{"BLOCK", 128}});
  auto axpy = b.kernel("nested_axpy", "[*fp32,[*fp32,*fp32]], [i32,[fp32,u1]]");
  float* p = reinterpret_cast<float*>(uintptr_t(1) << 20);
  std::string names;
  for (const auto& n : add.arg_names()) names += n + " ";
  std::printf("names: %s\n", names.c_str());
  std::printf("spec1: %s\n", add.specialization({p, p + 1, 2.5, p, 4096}).c_str());
  std::printf("spec2: %s\n", axpy.specialization({p, p, p + 2, 1, 0.5, true}).c_str());
  std::printf("spec3: %s\n", axpy.specialization({p, p, p, 4096, 0.5, false}).c_str());
  TRY("count", add.specialization({p, p + 1, p, 4096}));
  TRY("element type", add.specialization({p, p, 7, p, 4096}));
  TRY("element pointer", add.specialization({p, 3, 2.5, p, 4096}));
  TRY("flat signature", b.kernel("add_pair", "*fp32,*fp32,fp32,*fp32,i32", {{"BLOCK", 128}}));
  TRY("other nesting", b.kernel("add_pair", "[[*fp32,*fp32],fp32],*fp32,i32", {{"BLOCK", 128}}));
  TRY("unbalanced", b.kernel("add_pair", "[*fp32,[*fp32,fp32],*fp32,i32", {{"BLOCK", 128}}));
  TRY("bad element", b.kernel("add_pair", "[*fp32,[*f32,fp32]],*fp32,i32", {{"BLOCK", 128}}));
  TRY("unannotated i8", b.kernel("add_pair", "[*fp32,[*fp32,i8]],*fp32,i32", {{"BLOCK", 128}}));
  TRY("no winner", b.kernel("add_pair", "[*fp32,[*fp32,fp32]],*fp32,i32", {{"BLOCK", 256}}));
  // The typed stub of `lazytriton export-cpp`: one C++ parameter per tuple element.
  auto handle = launch_add_pair_handle(b);
  std::printf("stub: %s\n", handle.specialization({p, p + 1, 2.5, p, 4096}).c_str());
  if (lt::driver_available())  // the pointers are made up: never launch them on a real GPU
    report("stub launch", "skipped: a GPU is present");
  else
    TRY("stub launch", launch_add_pair(handle, nullptr, lt::Dim3{1}, p, p + 1, 2.5f, p, 4096));
}
"""



def compiled_tuple_variant(kernel, source, args: tuple, kwargs: dict, meta: dict | None = None):
    """(description, variant, cubin) of a call compiled for sm_90 without a GPU: what tuning would write."""
    from lazytriton.cpp import bundle
    from lazytriton.compile.compiler import Candidate, compile_all
    from lazytriton.runtime.resolve import Resolved
    from lazytriton.model.spec import kernel_spec

    spec, desc = kernel_spec(kernel), bundle.describe(kernel, source)
    cand = Candidate(0, None, Binder(spec, TARGET).bind(args, kwargs))
    compile_all(spec, TARGET, [cand])
    assert cand.binary is not None, cand.error
    values = list(args) + [kwargs[p["name"]] for p in desc["params"][len(args):]]
    names = [tuples.leaf_name(p["name"], sub) for p, v in zip(desc["params"], values) for sub, _ in tuples.leaves(v)]
    flat = cand.bound.flat_signature
    types = [flat.get(n, "constexpr") for n in names]
    is_param = [t != "constexpr" for t in types]
    kern = _core.Kernel(cand.binary.cubin, cand.binary.metadata)
    res = Resolved(_core.Entry(kern, is_param, meta or {}), [p["name"] for p in desc["params"]], tuple(values),
                   types, meta or {}, None, (), names)
    return (desc, *bundle.make_variant(desc, None, res, values, {}, device="compiled without a GPU"))


def tuple_kernels():
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from kernels import tuple_kernels as tk

    return tk


@pytest.fixture(scope="module")
def tuple_bundle(tmp_path_factory):
    from lazytriton.cpp import bundle
    from lazytriton.model.arrays import PointerArg

    tk = tuple_kernels()
    d = tmp_path_factory.mktemp("tuple-bundle")
    P = lambda a: PointerArg(a, "fp32")  # noqa: E731
    desc, v, cubin = compiled_tuple_variant(tk.add_pair, "tuple_kernels:add_pair",
                                            ((P(1 << 20), (P((1 << 20) + 4), 2.5)), P(1 << 20), 4096), {"BLOCK": 128})
    bundle.write_variant(d, desc, v, cubin)
    cfg = tk.nested_axpy.configs[0]
    desc, v, cubin = compiled_tuple_variant(tk.nested_axpy, "tuple_kernels:nested_axpy",
                                            ((P(1 << 20), (P(1 << 20), P((1 << 20) + 8))), (1, (0.5, True))),
                                            cfg.all_kwargs(), meta=dict(cfg.kwargs))
    bundle.write_variant(d, desc, v, cubin)
    return d


def test_bundle_variant_records_tuple_leaves(tuple_bundle):
    from lazytriton.cpp import bundle

    (add,) = bundle.Bundle(tuple_bundle).variants("add_pair")
    assert add["layout"] == ["[_,[_,_]]", "", "", ""]
    assert add["types"] == ["*fp32", "*fp32", "fp32", "*fp32", "i32", "constexpr"]
    assert add["specs"] == ["16", "", "", "16", "16", ""]
    assert add["is_param"] == [True, True, True, True, True, False]
    assert add["signature"] == "[*fp32:16,[*fp32,fp32]],*fp32:16,i32:16"
    (axpy,) = bundle.Bundle(tuple_bundle).variants("nested_axpy")
    # dims[0] == 1 is folded (Triton: a constexpr inside the tuple); key= names the tuple: its elements' values.
    assert axpy["types"][3:] == ["i32", "fp32", "u1"] and axpy["specs"][3] == "1" and axpy["is_param"][3] is False
    assert axpy["key_values"] == {"dims[0]": 1, "dims[1][0]": 0.5, "dims[1][1]": True}
    assert axpy["layout"] == ["[_,[_,_]]", "[_,[_,_]]"]


def test_bundle_refuses_none_inside_a_tuple():
    from lazytriton.cpp import bundle
    from lazytriton.model.arrays import PointerArg

    tk = tuple_kernels()
    desc = bundle.describe(tk.add_pair, "tuple_kernels:add_pair")
    res = type("R", (), {"entry": type("E", (), {"is_param": [True] * 6})(), "types": ["*fp32"] * 6})()
    with pytest.raises(TypeError, match=r"kernel add_pair, argument xs\[1\]\[1\]: a tuple element that is not"):
        bundle.make_variant(desc, None, res, [(PointerArg(16, "fp32"), (PointerArg(16, "fp32"), None)),
                                             PointerArg(16, "fp32"), 8, 128], {}, device="x")


def test_cpp_tuple_signatures(tuple_bundle, tmp_path):
    from test_embed import CMAKE, CPP_CHECKS, NO_GPU, cmake_build, cmake_project, run

    from lazytriton.cpp import export as export_cpp

    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    tuple_kernels()
    files = export_cpp.export("kernels.tuple_kernels:add_pair", "[*fp32, [*fp32,fp32]],*fp32,i32", {"BLOCK": 128},
                              tmp_path)
    header = files[0].read_text()
    assert ("void launch_add_pair(lt::Stream stream, lt::Dim3 grid, lt::DevicePtr xs_0, lt::DevicePtr xs_1_0, "
            "float xs_1_1, lt::DevicePtr out, int32_t n);") in header
    source = files[1].read_text().replace("kernels.tuple_kernels:add_pair", "tuple_kernels:add_pair")
    assert 'kSignature = "[*fp32, [*fp32,fp32]],*fp32,i32"' in source
    files[1].write_text(source)
    (tmp_path / "api_test.cc").write_text(CPP_CHECKS + CPP_TEST)
    (tmp_path / "CMakeLists.txt").write_text(cmake_project("api_test", "api_test.cc", "launch_add_pair.cc"))
    cmake_build(tmp_path, tmp_path / "build")
    out = run(tmp_path / "build" / "api_test", tuple_bundle)
    assert out.returncode == 0, out.stdout + out.stderr
    got = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert got["names"] == "xs[0] xs[1][0] xs[1][1] out n "
    assert got["spec1"] == "*fp32:16,*fp32,fp32,*fp32:16,i32:16"
    # Triton's rules for tuple elements: 1 folded, pointers' alignment, floats and bools unspecialized.
    assert got["spec2"] == "*fp32:16,*fp32:16,*fp32,i32:1,fp32,u1"
    assert got["spec3"] == "*fp32:16,*fp32:16,*fp32:16,i32:16,fp32,u1"
    assert "kernel add_pair: takes 5 runtime arguments" in got["count"]
    assert "kernel add_pair: argument xs[1][1]: expects a float (fp32), got an integer" in got["element type"]
    assert "kernel add_pair: argument xs[1][0]: expects a device pointer" in got["element pointer"]
    assert "has 5 types but the kernel takes 3 runtime arguments" in got["flat signature"]
    assert "has no winner for signature [[*fp32,*fp32],fp32],*fp32,i32" in got["other nesting"]
    assert "unbalanced '['" in got["unbalanced"]
    assert "argument xs[1][0]: unknown element type in '*f32'" in got["bad element"]
    assert "argument xs[1][1]: an unannotated int is i32, i64 or u64" in got["unannotated i8"]
    assert "has no winner for signature" in got["no winner"] and "BLOCK=256" in got["no winner"]
    assert got["stub"] == "*fp32:16,*fp32,fp32,*fp32:16,i32:16"
    if got["stub launch"] != "skipped: a GPU is present":
        assert NO_GPU.search(got["stub launch"]), got["stub launch"]
