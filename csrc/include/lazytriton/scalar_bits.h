// Half-width float scalars packed exactly as Triton's launcher packs them
// (backends/nvidia/driver.c: extractFP16, extractBF16), with no Python: the
// Python stubs (python_args.h) and the C++ bundles (bundle.cc) share these.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace lt {

// fp16 as CPython's PyFloat_Pack2 (what Triton calls): rounded half to even
// straight from the double (no detour through float, which could round
// twice). False where PyFloat_Pack2 raises OverflowError: finite values that
// round beyond 65504. Infinities and NaNs pack (a NaN as the quiet NaN).
inline bool fp16_bits(double d, uint16_t* out) {
  uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  if (std::isnan(d)) return *out = uint16_t(sign | 0x7e00), true;
  if (std::isinf(d)) return *out = uint16_t(sign | 0x7c00), true;
  if (d == 0) return *out = sign, true;
  int e;
  double f = std::frexp(std::fabs(d), &e) * 2;  // |d| = f * 2**(e - 1), f in [1, 2); every step here is exact
  --e;
  if (e >= 16) return false;
  if (e < -25) {  // below half the smallest subnormal: zero
    f = 0, e = 0;
  } else if (e < -14) {  // subnormal
    f = std::ldexp(f, 14 + e), e = 0;
  } else {
    e += 15, f -= 1;  // biased exponent; the implicit 1 dropped
  }
  f *= 1024;
  uint32_t bits = uint32_t(f);  // truncated; then rounded half to even
  if (f - bits > 0.5 || (f - bits == 0.5 && bits % 2 == 1)) {
    if (++bits == 1024) {  // the carry left the mantissa
      bits = 0;
      if (++e == 31) return false;
    }
  }
  *out = uint16_t(sign | uint32_t(e) << 10 | bits);
  return true;
}

// bf16 as Triton packs it: the top half of float(d), truncated (not rounded).
inline uint16_t bf16_bits(double d) {
  float f = float(d);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

}  // namespace lt
