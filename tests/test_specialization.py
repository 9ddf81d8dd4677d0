"""lazytriton specializes calls itself and must agree exactly with Triton.

The generated C++ stub computes a call key whose first words hold 2 bits per
argument (ints: bit0 = value == 1, bit1 = value % 16 == 0; pointers: bit0 =
address % 16 == 0), and LazyKernel._shape picks each argument's slot (its
integer class, dtype, kind). Triton's own binder (lazytriton.compile.compiler.Binder
runs Triton's create_function_from_signature and _pack_args) decides what is
compiled: an int == 1 becomes a constexpr, a divisible int or aligned pointer
gets tt.divisibility 16. The stub's bits and lazytriton's slots must say the
same thing for every value; otherwise a stub would launch a binary compiled for
another specialization (wrong results) or resolve one binary many times.

No GPU: the stub is built and called for real. Nothing is resolved, so it
returns the key; pointers are made-up addresses that nothing dereferences.
"""
import ctypes
import math
import struct
from dataclasses import dataclass

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton import _core
from lazytriton.model import specialize
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DTYPE_IDS, DTYPES, DeviceArray, triton_dtype
from lazytriton.compile.compiler import Binder

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit(do_not_specialize=["nospec_i32", "nospec_i64", "nospec_u64", "nospec_p"],
            do_not_specialize_on_alignment=["noalign_i32", "noalign_i64", "noalign_u64", "noalign_p"])
def probe(n_i32, n_i64, n_u64,                       # plain ints, one per integer class
          nospec_i32, nospec_i64, nospec_u64,        # do_not_specialize
          noalign_i32, noalign_i64, noalign_u64,     # do_not_specialize_on_alignment
          ann_i64: tl.int64, ann_u32: tl.uint32, ann_i8: tl.int8,  # type fixed by annotation
          p, nospec_p, noalign_p, flag, x,
          # one pointer per Triton dtype (lazytriton.model.arrays.DTYPES order)
          p_u1, p_i8, p_i16, p_i32, p_i64, p_u8, p_u16, p_u32, p_u64,
          p_fp16, p_bf16, p_fp32, p_fp64, p_fp8e4nv, p_fp8e5, p_fp8e4b15, p_fp8e4b8, p_fp8e5b16,
          BLOCK: tl.constexpr):
    pass


# A value of each integer class that is neither 1 nor a multiple of 16: fills
# the positions a test is not looking at without specializing them.
FILL = {"i32": 3, "i64": 2**40 + 3, "u64": 2**63 + 3}
INT_VALUES = [0, 1, 2, 8, 15, 16, 17, 24, 32, 48, -1, -8, -16, -17, 2**31 - 16, 2**31 - 1, -2**31, 2**31,
              -2**31 - 1, 2**32, 2**32 + 1, 2**32 + 8, 2**63 - 1, -2**63, 2**63, 2**63 + 8, 2**63 + 16, 2**64 - 16,
              2**64 - 1]
# Aligned and unaligned addresses (never dereferenced).
ADDRESSES = [0x7F0000000000, 0x7F0000000010, 0x7F0000000008, 0x7F0000000004, 0x7F0000000001, 0x10, 0x8,
             2**64 - 16, 2**64 - 8]


def int_class(v: int) -> str:
    return "i32" if -2**31 <= v < 2**31 else "i64" if -2**63 <= v < 2**63 else "u64"


def array(addr: int, dtype: str = "fp32") -> DeviceArray:
    return DeviceArray(addr, dtype, 1024)


def call(**values) -> tuple:
    """Positional args for `probe`: fillers, overridden by name."""
    args = {f"{flavor}_{c}": FILL[c] for flavor in ("n", "nospec", "noalign") for c in FILL}
    args.update(ann_i64=3, ann_u32=3, ann_i8=3, p=array(0x1000), nospec_p=array(0x1000), noalign_p=array(0x1000),
                flag=False, x=0.5, BLOCK=64)
    args.update({f"p_{d}": array(0x2000 + 0x100 * i, d) for i, d in enumerate(DTYPES)})
    args.update(values)
    return tuple(args[name] for name in probe.arg_names)


@dataclass
class Probe:
    kernel: lazytriton.LazyKernel
    shape: specialize.Shape
    stub: object
    handle: object  # keeps the C++ LazyKernel alive while its address is used
    binder: Binder

    def observe(self, args: tuple):
        """(stub bits, Triton bits, Triton binding, lazytriton slots) for one call."""
        shape = self.kernel._shape(args)
        assert shape == self.shape, "the call must fit the prebuilt stub (same integer classes and dtypes)"
        key = self.stub.launch(self.handle.handle, (1,), 0, args)
        assert isinstance(key, tuple), f"stub rejected a call of its own shape: {key!r}"
        bound = self.binder.bind(args, {})
        stub_bits, triton_bits = {}, {}
        for i, (name, slot) in enumerate(zip(shape.names, shape.slots)):
            stub_bits[name] = (key[(2 * i) // 64] >> ((2 * i) % 64)) & 3
            divisible = ["tt.divisibility", 16] in bound.attrs.get((i,), [])
            if slot.kind == "ptr":
                triton_bits[name] = int(divisible)
            elif slot.kind == "int":
                triton_bits[name] = int(bound.signature[name] == "constexpr") | int(divisible) << 1
            else:  # bool, float, constexpr: Triton attaches no specialization, the stub no bits
                assert not divisible and bound.signature[name] in ("u1", "fp32", "constexpr")
                triton_bits[name] = 0
        return stub_bits, triton_bits, bound, dict(zip(shape.names, shape.slots))


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path_factory.mktemp("ltcache")))
        k = lazytriton.kernel(probe)
        shape = k._shape(call())
        module = stubgen.load_stub(shape)
    handle = _core.ResolveTable("probe")
    return Probe(k, shape, module, handle, Binder(k.spec, TARGET))


def slot_type(slot: specialize.Slot) -> str:
    """The Triton type a slot passes to the kernel (what the stub packs, by its C member)."""
    t = {"ptr": lambda: "*" + DTYPES[slot.dtype], "int": lambda: slot.int_type, "float": lambda: slot.float_type,
         "bool": lambda: "u1", "constexpr": lambda: "constexpr"}[slot.kind]()
    assert slot.param_type() == t  # what LazyKernel.resolve (and the JAX path) report
    return t


@pytest.mark.parametrize("value", INT_VALUES)
def test_int_bits_and_class_match_triton(stub, value):
    cls = int_class(value)
    stub_bits, triton_bits, bound, slots = stub.observe(call(**{f"n_{cls}": value, f"nospec_{cls}": value}))
    for name in (f"n_{cls}", f"nospec_{cls}"):
        assert stub_bits[name] == triton_bits[name], (name, value, bound.signature[name], bound.attrs)
        # Triton's type for the value is lazytriton's class, unless Triton folded a 1 into a constexpr.
        if bound.signature[name] != "constexpr":
            assert slots[name].int_type == bound.signature[name], (name, value)
    # The fillers (and every other argument) agree too.
    for name in stub_bits:
        if not name.startswith(("noalign_", "ann_")):
            assert stub_bits[name] == triton_bits[name], name


def test_int_bits_with_do_not_specialize_on_alignment(stub):
    mismatches = []
    for value in INT_VALUES:
        name = f"noalign_{int_class(value)}"
        stub_bits, triton_bits, _, _ = stub.observe(call(**{name: value}))
        if stub_bits[name] != triton_bits[name]:
            mismatches.append((value, stub_bits[name], triton_bits[name]))
    assert not mismatches, "(value, stub bits, Triton bits): " + repr(mismatches)


def test_annotated_int_bits(stub):
    mismatches = []
    for name, values in {"ann_i64": [0, 1, 16, 17, -2**63, 2**63 - 1], "ann_u32": [0, 1, 16, 2**32 - 1],
                         "ann_i8": [-128, -16, 1, 16, 127]}.items():
        for value in values:
            stub_bits, triton_bits, bound, slots = stub.observe(call(**{name: value}))
            assert bound.signature[name] == slots[name].int_type == name[4:]  # the annotation wins
            if stub_bits[name] != triton_bits[name]:
                mismatches.append((name, value, stub_bits[name], triton_bits[name]))
    assert not mismatches, "(argument, value, stub bits, Triton bits): " + repr(mismatches)


@pytest.mark.parametrize("addr", ADDRESSES, ids=hex)
def test_pointer_alignment_matches_triton(stub, addr):
    stub_bits, triton_bits, _, _ = stub.observe(call(p=array(addr), nospec_p=array(addr), noalign_p=array(addr)))
    for name in ("p", "nospec_p", "noalign_p"):
        assert stub_bits[name] == triton_bits[name], (name, hex(addr))
    assert stub_bits["p"] == (addr % 16 == 0)  # the rule itself, so agreement is not vacuous
    assert stub_bits["nospec_p"] == stub_bits["noalign_p"] == 0


def test_every_dtype(stub):
    stub_bits, triton_bits, bound, slots = stub.observe(call())
    for d in DTYPES:
        name = f"p_{d}"
        assert bound.signature[name] == slot_type(slots[name]) == f"*{d}", name
        assert stub_bits[name] == triton_bits[name] == 1  # 0x2000 + 0x100 * i is aligned
    # Each dtype is checked by the stub: rotate the dtypes by one and no pointer fits.
    rotated = {f"p_{d}": array(0x2000, DTYPES[(i + 1) % len(DTYPES)]) for i, d in enumerate(DTYPES)}
    for name, arr in rotated.items():
        assert stub.stub.launch(stub.handle.handle, (1,), 0, call(**{name: arr})) is None, name


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("x", [0.0, 1.0, 16.0, -2.5, 1e300, math.inf, math.nan])
def test_bool_and_float_are_not_specialized(stub, flag, x):
    stub_bits, triton_bits, bound, slots = stub.observe(call(flag=flag, x=x))
    assert bound.signature["flag"] == slot_type(slots["flag"]) == "u1"
    assert bound.signature["x"] == slot_type(slots["x"]) == "fp32"
    assert stub_bits["flag"] == stub_bits["x"] == triton_bits["flag"] == triton_bits["x"] == 0


@triton.jit
def annotated(f32: tl.float32, f16: tl.float16, bf16: tl.bfloat16, f64: tl.float64, b1: tl.int1,
              i64: tl.int64, u32: tl.uint32, i8: tl.int8):
    pass


@pytest.mark.parametrize("name, value", [
    ("f32", 2.5), ("b1", True), ("i64", 5), ("i64", 1), ("u32", 5), ("i8", -5),
    pytest.param("f32", 2, id="f32-given-int"),
    pytest.param("f16", 2.5, id="f16"),
    pytest.param("bf16", 2.5, id="bf16"),
    pytest.param("f64", 2.5, id="f64"),
    pytest.param("b1", 1, id="b1-given-int"),
    pytest.param("i64", True, id="i64-given-bool"),
    pytest.param("i64", 2.5, id="i64-given-float"),
])
def test_annotated_scalar_slot_matches_triton_signature(name, value):
    # The slot decides the C type the stub passes; Triton's signature is the type the kernel reads.
    k = lazytriton.kernel(annotated)
    values = {**dict(f32=1.5, f16=1.5, bf16=1.5, f64=1.5, b1=True, i64=3, u32=3, i8=3), name: value}
    args = tuple(values[p.name] for p in k.spec.params)
    slots = dict(zip(k.spec.arg_names, k._shape(args).slots))
    assert slot_type(slots[name]) == Binder(k.spec, TARGET).bind(args, {}).signature[name]


def triton_bytes(t: str, v) -> bytes:
    """The bytes Triton's launcher passes for a scalar of signature type `t`
    (backends/nvidia: extractFP16 = PyFloat_Pack2, extractBF16 = the fp32's top
    half, truncated; ints in their C type)."""
    if t == "fp16":
        return struct.pack("<e", float(v))
    if t == "bf16":
        return bytes(ctypes.c_float(float(v)))[2:]
    if t == "fp32":
        return bytes(ctypes.c_float(float(v)))  # C's double -> float: inf beyond fp32's range
    if t == "fp64":
        return struct.pack("<d", float(v))
    if t == "u1":  # Triton 3.6 parses it with "B" (the low byte); 3.9 as a u32 the kernel reads one byte of
        return bytes([int(v) & 0xFF])
    return int(v).to_bytes(int(t[1:]) // 8, "little", signed=t[0] == "i")


@pytest.mark.parametrize("name, value", [
    ("f32", 2.5), ("f32", 2), ("f32", True), ("f32", 1e300), ("f32", -0.0), ("f32", math.inf),
    ("f16", 2.5), ("f16", 0.1), ("f16", 3), ("f16", 65504.0), ("f16", 1e-8), ("f16", -math.inf), ("f16", False),
    ("bf16", 0.1), ("bf16", -3.3), ("bf16", 7), ("bf16", 1e300),
    ("f64", 1 / 3), ("f64", 2**60 + 1), ("f64", True),
    ("b1", True), ("b1", False), ("b1", 1), ("b1", 0), ("b1", 2), ("b1", 3), ("b1", 257),
    ("i64", -2**63), ("i64", 2**63 - 1), ("i64", True), ("u32", 2**32 - 1), ("i8", -128), ("i8", 127),
])
def test_annotated_scalar_is_packed_as_triton_packs_it(cache_dir, name, value):
    k = lazytriton.kernel(annotated)
    values = {**dict(f32=1.5, f16=1.5, bf16=1.5, f64=1.5, b1=True, i64=3, u32=3, i8=3), name: value}
    args = tuple(values[p.name] for p in k.spec.params)
    shape = k._shape(args)
    packed = dict(zip(shape.names, stubgen.load_stub(shape).params(args)))
    signature = Binder(k.spec, TARGET).bind(args, {}).signature
    for n in shape.names:
        assert packed[n] == triton_bytes(signature[n], values[n]), (n, values[n], signature[n])


@triton.jit
def annotated_keys(n: tl.int64, m: tl.uint8, BLOCK: tl.constexpr):
    pass


@pytest.mark.parametrize("value", [0, 16, 32, 1, 3, True, False])
def test_annotated_int_given_bool_or_int_bits(cache_dir, value):
    # Triton specializes an int given to an annotated int parameter (% 16), never a bool.
    k = lazytriton.kernel(annotated_keys)
    args = (value, value, 64)
    shape = k._shape(args)
    key = stubgen.load_stub(shape).key(args)
    bound = Binder(k.spec, TARGET).bind(args, {})
    for i, name in enumerate(("n", "m")):
        divisible = ["tt.divisibility", 16] in bound.attrs.get((i,), [])
        assert bound.signature[name] == shape.slots[i].int_type
        assert (key[0] >> (2 * i)) & 3 == int(divisible) << 1, (name, value)


def test_shapes_never_share_a_key(cache_dir):
    # One kernel's table holds every shape's keys: a key resolved for fp32 arrays
    # (or an int) must not be found for fp16 arrays (or a float) with the same bits.
    k = lazytriton.kernel(probe)
    keys = set()
    for override in [{}, dict(p=array(0x1000, "fp16")), dict(n_i32=2**40 + 3), dict(flag=3), dict(x=3),
                     dict(BLOCK=None)]:
        args = call(**override)
        keys.add(stubgen.load_stub(k._shape(args)).key(args))
    assert len(keys) == 6


# Framework dtype names (NumPy/ml_dtypes/PyTorch): lazytriton must name each as
# Triton's canonicalize_dtype does, and refuse what Triton refuses.
FRAMEWORK_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                    "float32", "float64", "bfloat16", "half", "float", "double", "float8_e4m3fn", "float8_e5m2",
                    "float8_e4m3fnuz", "float8_e5m2fnuz", "torch.bfloat16", "torch.float8_e4m3fn",
                    "torch.float8_e5m2", "complex64", "float8_e8m0fnu", "float4_e2m1fn", "int4",
                    "float8_e4m3b11fnuz"]  # ml_dtypes' (exponent bias 11), not Triton's fp8e4b15 (bias 15)


@pytest.mark.parametrize("name", FRAMEWORK_DTYPES)
def test_dtype_names_match_triton(name):
    from triton._utils import canonicalize_dtype

    try:
        expected = canonicalize_dtype(name)
    except KeyError:
        expected = None
    assert triton_dtype(name) == expected
    if expected is not None:
        assert expected in DTYPE_IDS


def test_ml_dtypes_objects_match_triton():
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from triton._utils import canonicalize_dtype

    for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        dt = np.dtype(getattr(ml_dtypes, n))
        assert triton_dtype(dt) == canonicalize_dtype(dt), n


# -- constexpr arguments -------------------------------------------------------------------------

def constexpr_key(stub, value) -> tuple:
    return stub.stub.launch(stub.handle.handle, (1,), 0, call(BLOCK=value))


@pytest.mark.parametrize("a, b", [(16, 32), (True, 1), (False, 0), (None, 0), (1.0, 1), (0.0, -0.0), (2**70, 2**71)])
def test_distinct_constexpr_values_get_distinct_keys(stub, a, b):
    # Triton compiles a separate binary for each constexpr value (and type).
    assert constexpr_key(stub, a) != constexpr_key(stub, b)
    assert constexpr_key(stub, a) == constexpr_key(stub, a)


def test_constexpr_objects_are_keyed_by_value(stub):
    for _ in range(100):  # CPython reuses a freed object's memory for the next one of its size
        first = "".join(["re", "lu"])  # built at run time, like any computed constexpr
        first_key, first_addr = constexpr_key(stub, first), id(first)
        del first
        second = "".join(["ge", "lu"])
        if id(second) == first_addr:
            break
    else:
        pytest.skip("the allocator never reused the address")
    assert constexpr_key(stub, second) != first_key


@pytest.mark.parametrize("value", ["relu", ("a", 1), ("a", 1.0), ("a", True), (0.0,), (-0.0,), frozenset({1, 2}),
                                   [1, 2]])
def test_constexpr_objects_equal_values_share_a_key(stub, value):
    other = "".join(list(value)) if isinstance(value, str) else type(value)(list(value))  # equal, not identical
    assert other == value and other is not value
    assert constexpr_key(stub, value) == constexpr_key(stub, value)
    if isinstance(value, list):  # unhashable: by identity (kept alive)
        assert constexpr_key(stub, other) != constexpr_key(stub, value)
    else:
        assert constexpr_key(stub, other) == constexpr_key(stub, value)


def test_constexpr_objects_of_other_types_or_floats_get_other_keys(stub):
    values = [("a", 1), ("a", 1.0), ("a", True), (0.0,), (-0.0,), "1", b"1", (("a",),), (("a",), 1)]
    assert len({constexpr_key(stub, v) for v in values}) == len(values)


def test_portable_key_has_constexpr_values_not_indices(stub):
    # The persistent cache must not see this process's table indices (another
    # process numbers its values in another order).
    args = call(BLOCK="relu")
    key = stub.stub.launch(stub.handle.handle, (1,), 0, args)
    portable = stub.shape.portable_key(key, args)
    assert portable[:-2] == key[:-3] and portable[-2:] == (5, "relu")
    args = call(BLOCK=64)
    key = stub.stub.launch(stub.handle.handle, (1,), 0, args)
    assert stub.shape.portable_key(key, args) == key[:-1]


@triton.jit
def optional_pointer(x, maybe, stride, out, HAS: tl.constexpr):
    pass


@pytest.mark.parametrize("generated", [False, True], ids=["table-driven", "generated"])
def test_a_none_slot_takes_only_none(cache_dir, generated):
    """Issue 23 (TransformerEngine's permute kernel): a pointer or a stride that is
    None in one call (Triton folds it into a constexpr: no kernel parameter) and
    an array or an int in the next is another specialization. The stub made for
    the first call must not take the second (it would launch the first call's
    binary with a parameter missing: out-of-bounds reads on the GPU)."""
    k = lazytriton.kernel(optional_pointer)
    x, out = DeviceArray(0x7F0000000000, "fp32", 1 << 20), DeviceArray(0x7F0000100000, "fp32", 1 << 20)
    first = (x, None, None, out, False)
    shape = k._shape(first)
    assert [s.kind for s in shape.slots] == ["ptr", "constexpr", "constexpr", "ptr", "constexpr"]
    assert shape.slots[1].folded and shape.slots[2].folded and not shape.slots[4].folded
    stub = stubgen.load_stub(shape) if generated else stubgen.generic_stub(shape)
    assert stub.key(first) is not None
    assert stub.key((x, None, None, out, True)) is not None  # a declared constexpr takes any value
    assert stub.key((x, tl.constexpr(None), None, out, False)) is not None  # Triton folds a tl.constexpr too
    for second in [(x, DeviceArray(0x7F0000200000, "fp32", 64), None, out, True),
                   (x, None, 4096, out, False), (x, None, 1, out, False), (x, None, 2.5, out, False),
                   (x, None, True, out, False)]:
        assert stub.key(second) is None, second  # not this stub's shape
        other = k._shape(second)
        assert other.digest() != shape.digest()
        assert (stubgen.load_stub(other) if generated else stubgen.generic_stub(other)).key(second) is not None
