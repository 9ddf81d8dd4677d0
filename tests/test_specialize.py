"""lazytriton.model.specialize: Triton's rules written once.

Pinned: slot codes and shape digests name stubs and enter tuning keys (persistent
records), so they must not change when the rules' code moves (the values below
were computed before lazytriton.model.specialize existed, from stubgen's Slot/Shape).

Cross-checked: the C++ bundle's description of a call (lazytriton.cpp.bundle) and
the Python stubs' reading of it (LazyKernel._shape, and the call key the
table-driven stub computes in C++) agree for every kind of argument, and with
Triton's own binder. This replaced a run-time guard in bundle.make_variant.
"""
import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton.compile.compiler import Binder
from lazytriton.model import specialize, tuples
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DeviceArray, PointerArg
from lazytriton.model.specialize import Flags, Shape, Slot
from lazytriton.cpp import bundle

from kernels import annotated, tuple_kernels

SLOTS = {
    "ptr": (Slot("ptr", dtype=11), "ptr:11::0:1:0"),
    "ptr_noalign": (Slot("ptr", dtype=9, specialize=False), "ptr:9::0:0:0"),
    "i32": (Slot("int", int_type="i32"), "int:-1:i32:0:1:0"),
    "i64_key": (Slot("int", int_type="i64", in_key=True), "int:-1:i64:0:1:1"),
    "u64_dnsoa": (Slot("int", int_type="u64", divisibility=False), "int:-1:u64:0:1:0:div0"),
    "ann_i16": (Slot("int", int_type="i16", annotated=True, specialize=False), "int:-1:i16:1:0:0:div1"),
    "f32_key": (Slot("float", in_key=True), "float:-1::0:1:1"),
    "ann_fp16": (Slot("float", float_type="fp16", annotated=True), "float:-1::1:1:0:fp16"),
    "bool": (Slot("bool"), "bool:-1::0:1:0"),
    "u1": (Slot("bool", annotated=True, in_key=True), "bool:-1::1:1:1"),
    "cx": (Slot("constexpr"), "constexpr:-1::0:1:0"),
    "folded": (Slot("constexpr", folded=True), "constexpr:-1::0:1:0:folded"),
    "desc": (Slot("desc", dtype=9, rank=2), "desc:9::0:1:0:r2"),
}


def test_slot_codes_and_shape_digests_are_unchanged():
    assert {k: s.code() for k, (s, _) in SLOTS.items()} == {k: code for k, (_, code) in SLOTS.items()}
    flat = Shape(tuple(SLOTS), tuple(s for s, _ in SLOTS.values()))
    assert flat.digest() == "265ca040d372c94d0773" and flat.key_words() == 11
    assert flat.table()[5] == (1, -1, 1, 1, 0, 0, 1, 2) and flat.table()[7] == (2, -1, 0, 1, 1, 0, 1, 0)
    nested = Shape(("x", "xs[0]", "xs[1]", "n"),
                   (Slot("ptr", dtype=11), Slot("int", int_type="i32"), Slot("float"),
                    Slot("int", int_type="i32", in_key=True)),
                   ((0,), (1, 0), (1, 1), (2,)), ("x", "xs", "n"), (((1,), 2),))
    assert nested.digest() == "34e4ed4c6baa61a96a74"


@pytest.mark.parametrize("row, digest", [
    ((1,) * 11, "335ab4c5d23007622005"),
    ((2**40, 48, 2**40, 2**40, 2**40, 255, True, 2.5, 2.5, 2.5, 2.5), "3b9aaa2601777cefa276"),
    ((None,) + (5,) * 10, "d789d8a04f85c294e59c"),
])
def test_kernel_shapes_are_unchanged(row, digest):
    assert lazytriton.kernel(annotated.scalar_probe)._shape(row).digest() == digest


def test_tuple_shape_is_unchanged():
    k = lazytriton.kernel(tuple_kernels.add_pair)
    a = DeviceArray(4096, "fp32", 64)
    shape = k._shape(((a, DeviceArray(4112, "fp16", 64)), a, 2**33, 64))
    assert shape.digest() == "f840be8128acfba63f35"


@triton.jit(do_not_specialize=["nospec"], do_not_specialize_on_alignment=["noalign", "noalign_p"])
def every_kind(p, noalign_p, n, nospec, noalign, x, flag, i16: tl.int16, h: tl.float16, bf: tl.bfloat16,
               b1: tl.int1, big: tl.uint64, pair, BLOCK: tl.constexpr):
    pass  # only bound (specialized), never compiled


def ptr(addr: int, dtype: str = "fp32") -> PointerArg:
    return PointerArg(addr, dtype)


ROWS = [
    (ptr(4096), ptr(4096), 1, 1, 1, 0.5, True, 1, 1, 1, True, 1, (ptr(4096), 1)),
    (ptr(4100), ptr(4112, "fp16"), 32, 32, 32, 2.5, False, 32, 3, 2.5, 1, 32, (ptr(4104, "bf16"), 48)),
    (ptr(4112), ptr(4100), 2**40, 2**40 + 16, 2**63, 1e30, True, True, 3.5, 0, 7, 2**64 - 16, (ptr(8), 2**63)),
    (ptr(4096), ptr(4096), -16, 17, -1, 1.0, False, -32768, 0.0, -2.0, False, 0, (ptr(4096), -16)),
]


def stub_spec(slot: Slot, bits: int) -> str:
    """The specialization the C++ stub keyed, in a signature's spelling."""
    if slot.kind == "ptr":
        return "16" if bits & 1 else ""
    if slot.kind == "int":
        return "1" if bits & 1 else "16" if bits & 2 else ""
    assert bits == 0, slot
    return ""


def stub_view(k, args: tuple) -> tuple[list, list]:
    """(types, specs) per leaf as the Python stubs read the call: LazyKernel's slots,
    and the bits of the call key the table-driven stub (C++) computes."""
    shape = k._shape(args)
    key = stubgen.generic_stub(shape).key(args)
    assert isinstance(key, tuple)
    values = shape.leaf_values(args)
    types = [specialize.kernel_type(sl, v, "x") for sl, v in zip(shape.slots, values)]
    specs = [stub_spec(sl, (key[(2 * i) // 64] >> ((2 * i) % 64)) & 3) for i, sl in enumerate(shape.slots)]
    return types, specs


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_bundle_description_equals_the_stubs_slots_and_tritons_binder(row, tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path))
    args = ROWS[row] + (64,)
    k = lazytriton.kernel(every_kind)
    desc = bundle.describe(every_kind, "m:every_kind")
    types, specs, constexprs, _, layout, table = bundle.specialize_values(desc, list(args), {})
    assert (types, specs) == stub_view(k, args)
    # The slot table a variant carries (what the C++ binder walks) is the stub's, row for row, and
    # lazy mode's table for these types (before any winner: from the signature alone) is the same.
    assert table == [list(r) for r in k._shape(args).table()]
    assert bundle.slot_table(desc, types, layout) == table
    assert constexprs == {"BLOCK": 64} and layout[-2] == "[_,_]"
    # Triton's binder: the reference both follow.
    bound = Binder(k.spec, GPUTarget("cuda", 90, 32)).bind(args, {})
    sig = tuples.flat_signature(bound.signature)
    paths = k._shape(args).slot_paths()
    for name, path, t, s in zip(k._shape(args).names, paths, types, specs):
        if sig[name] == "constexpr" and name != "BLOCK":  # Triton folded it: == 1
            assert s == "1", name
            continue
        assert t == sig[name], name
        assert (s == "16") == (["tt.divisibility", 16] in bound.attrs.get(path, [])), name


@triton.jit
def with_desc(d, p, n):
    pass


def test_bundle_describes_a_descriptor_as_the_stub_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path))
    base = DeviceArray(4096, "fp16", 256 * 128 * 2, (256, 128))
    args = (lazytriton.TensorDescriptor.from_tensor(base, [64, 32]), ptr(4096), 48)
    desc = bundle.describe(with_desc, "m:with_desc")
    types, specs, _, _, layout, table = bundle.specialize_values(desc, list(args), {})
    assert (types, specs) == stub_view(lazytriton.kernel(with_desc), args)
    assert table == [list(r) for r in lazytriton.kernel(with_desc)._shape(args).table()]
    assert bundle.slot_table(desc, types, layout) == table
    assert types[0] == "tensordesc<fp16[64, 32]>" and specs == ["", "16", "16"]


@pytest.mark.parametrize("block", [[1, 1], [64, 32], [1, 8, 1]], ids=str)
def test_lazy_modes_table_takes_any_descriptor_block(block):
    # Lazy mode reads a C++ signature's types with stand-in values; the tutorials pass a dummy
    # block ([1, 1]) that the winner's pre_hook replaces: its stand-in must pass the descriptor's
    # checks (16-byte strides) whatever the block (it had strides [1, 1]: ValueError on a GPU).
    desc = bundle.describe(with_desc, "m:with_desc")
    types = [f"tensordesc<fp16[{', '.join(map(str, block))}]>", "*fp32", "i32"]
    table = bundle.slot_table(desc, types)
    assert len(table) == 3 and table[0][0] != table[1][0]


def test_flags_follow_the_declaration():
    spec = lazytriton.kernel(every_kind).spec
    flags = {p.name: specialize.flags_of(p) for p in spec.params}
    assert flags["n"] == Flags() and flags["i16"] == Flags(annotation="i16")
    assert (flags["nospec"].specialize, flags["nospec"].divisible) == (False, False)
    assert (flags["noalign"].specialize, flags["noalign"].divisible) == (True, False)
    assert flags["BLOCK"].constexpr


@pytest.mark.parametrize("v, wide", [(0.5, False), (0.0, False), (float("inf"), False), (float("nan"), False),
                                     (1e-39, True), (1e39, True), (3.4028234663852886e38, False),
                                     (1.1754943508222875e-38, False), (1, False), (True, False)])
def test_fp64_rule(v, wide):
    assert specialize.needs_fp64(v) is wide
