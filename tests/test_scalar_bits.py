"""scalar_bits.h (the fp16/bf16 packing the stubs and the C++ bundles share)
against Python's own: struct's "e" format is PyFloat_Pack2, which Triton's
launcher calls for fp16, and bf16 is the top half of the fp32, truncated."""
import ctypes
import math
import random
import struct

import pytest

from lazytriton.runtime import native

SOURCE = r"""
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "lazytriton/scalar_bits.h"

// Whole lists per call: one crossing into C++ for thousands of values.
PYBIND11_MODULE(lt_test_scalar_bits, m) {
  m.def("fp16_bits", [](const std::vector<double>& ds) {  // -1: overflow
    std::vector<int> out;
    for (double d : ds) {
      uint16_t h;
      out.push_back(lt::fp16_bits(d, &h) ? int(h) : -1);
    }
    return out;
  });
  m.def("bf16_bits", [](const std::vector<double>& ds) {
    std::vector<int> out;
    for (double d : ds) out.push_back(lt::bf16_bits(d));
    return out;
  });
}
"""


@pytest.fixture(scope="module")
def bits(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path_factory.mktemp("ltcache")))
        return native.load_module("lt_test_scalar_bits", lambda: SOURCE, "the scalar_bits test module")


def fp16_ref(d: float) -> int:
    """PyFloat_Pack2's bits, -1 where it raises OverflowError."""
    try:
        return struct.unpack("<H", struct.pack("<e", d))[0]
    except OverflowError:
        return -1


def bf16_ref(d: float) -> int:
    return int.from_bytes(bytes(ctypes.c_float(d)), "little") >> 16  # C's double -> float (inf past fp32)


def fp16_value(h: int) -> float:
    return struct.unpack("<e", struct.pack("<H", h))[0]


def fp16_edges() -> list[float]:
    """Every finite positive fp16 value's neighbourhood: the value, the exact tie
    with the next one (even and odd mantissas alike) and the doubles either side
    of each; subnormals and the overflow threshold (65520, the tie above 65504)
    included."""
    out = []
    for h in range(0, 0x7c00):
        lo = fp16_value(h)
        hi = 65536.0 if h == 0x7bff else fp16_value(h + 1)  # past the largest: the tie is 65520
        for x in (lo, (lo + hi) / 2):  # the mean of two neighbours is exact in double
            out += [x, math.nextafter(x, math.inf), math.nextafter(x, -math.inf)]
    return out + [-x for x in out]


def random_doubles(n: int, seed: int) -> list[float]:
    """Random bit patterns: mostly exponents in and around fp16's (and fp32's)
    range, some anywhere (NaNs and infinities included)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 4 == 3:
            bits = rng.getrandbits(64)
        else:
            exp = rng.randint(1023 - 30, 1023 + 20) if i % 4 else rng.randint(1023 - 160, 1023 + 140)
            bits = rng.getrandbits(1) << 63 | exp << 52 | rng.getrandbits(52)
        out.append(struct.unpack("<d", struct.pack("<Q", bits))[0])
    return out


SPECIAL = [0.0, -0.0, math.inf, -math.inf, 65504.0, 65519.99999999999, 65520.0, -65520.0, 65536.0, 1e300,
           2.0**-24, 2.0**-25, math.nextafter(2.0**-25, 1), 2.0**-26, 5e-324, -5e-324, 6.1e-5, 2.0**-14,
           1 + 2.0**-11, 1 + 2.0**-11 + 2.0**-40, 1 + 3 * 2.0**-11, 3.4028235677973366e38, 3.5e38, 1e-46]


def check(got: list[int], want: list[int], values: list[float], what: str) -> None:
    bad = [(v, hex(g), hex(w)) for v, g, w in zip(values, got, want) if g != w]
    assert not bad, f"{what}: {len(bad)} of {len(values)} differ, e.g. (value, got, want) {bad[:5]}"


@pytest.mark.parametrize("name", ["special", "edges", "random"])
def test_fp16_bits_is_pyfloat_pack2(bits, name):
    values = {"special": SPECIAL, "edges": fp16_edges(), "random": random_doubles(200_000, 1)}[name]
    values = [v for v in values if not math.isnan(v)]
    check(bits.fp16_bits(values), [fp16_ref(v) for v in values], values, "fp16")


def test_fp16_bits_nan_and_overflow(bits):
    nans = [math.nan, -math.nan, struct.unpack("<d", struct.pack("<Q", 0x7ff0000000000001))[0]]
    for got, d in zip(bits.fp16_bits(nans), nans):
        assert got >= 0 and math.isnan(fp16_value(got)), (d, got)
    assert bits.fp16_bits([65504.0, 65519.99999999999, 65520.0, -65520.0, 1e5]) == [0x7bff, 0x7bff, -1, -1, -1]


@pytest.mark.parametrize("name", ["special", "random"])
def test_bf16_bits_truncates_the_fp32(bits, name):
    values = SPECIAL + [math.nan, -math.nan] if name == "special" else random_doubles(200_000, 2)
    check(bits.bf16_bits(values), [bf16_ref(v) for v in values], values, "bf16")
    # truncated, not rounded: 1 + 3/4 of bf16's last place stays 1
    assert bits.bf16_bits([1.005859375, -1.005859375]) == [0x3f80, 0xbf80]
