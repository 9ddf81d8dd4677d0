// Triton's packing rules for scalar kernel arguments, written once and free of
// Python: one encoder per slot kind (integers, floats, flags, the pointer
// alignment bit). The Python stubs (generated and table-driven), the C++
// bundles, the tuning launches and the JAX handler's scalars all pack through
// these. Which rule applies (the slot's type, whether == 1 and % 16 are keyed)
// is decided in Python (lazytriton.model.specialize.Slot) or by a bundle's
// signature; these functions only carry it out. Tensor descriptors are
// encoded by tensor_desc.h.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

#include "lazytriton/scalar_bits.h"

namespace lt {

// A scalar kernel parameter type as Triton spells it ("i32", "fp16", "u1"),
// plus pointers and host tensor descriptors.
enum class Ty : uint8_t { kPtr, kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64, kU1, kFp16, kBf16, kFp32, kFp64, kDesc };

inline bool is_int(Ty t) { return t >= Ty::kI8 && t <= Ty::kU64; }
inline bool is_float(Ty t) { return t >= Ty::kFp16 && t <= Ty::kFp64; }

// A scalar type's Ty ("i32" -> kI32; Triton's "i1" is u1); false if `name` is not one.
inline bool scalar_type(std::string_view name, Ty* out) {
  struct Named { std::string_view name; Ty ty; };
  static constexpr Named kTypes[] = {{"i8", Ty::kI8}, {"i16", Ty::kI16}, {"i32", Ty::kI32}, {"i64", Ty::kI64},
                                     {"u8", Ty::kU8}, {"u16", Ty::kU16}, {"u32", Ty::kU32}, {"u64", Ty::kU64},
                                     {"u1", Ty::kU1}, {"i1", Ty::kU1}, {"fp16", Ty::kFp16}, {"bf16", Ty::kBf16},
                                     {"fp32", Ty::kFp32}, {"fp64", Ty::kFp64}};
  for (const auto& t : kTypes)
    if (name == t.name) return *out = t.ty, true;
  return false;
}

inline const char* type_name(Ty t) {
  static const char* const kNames[] = {"ptr", "i8", "i16", "i32", "i64", "u8", "u16", "u32",
                                       "u64", "u1", "fp16", "bf16", "fp32", "fp64", "desc"};
  return kNames[int(t)];
}

// Bytes of a kernel parameter of type `t` (a descriptor's are per ABI: tensor_desc.h).
inline size_t param_bytes(Ty t) {
  switch (t) {
    case Ty::kI8: case Ty::kU8: case Ty::kU1: return 1;
    case Ty::kI16: case Ty::kU16: case Ty::kFp16: case Ty::kBf16: return 2;
    case Ty::kI32: case Ty::kU32: case Ty::kFp32: return 4;
    default: return 8;
  }
}

// Why a value was refused; kOk when it was packed.
enum class Fit : uint8_t {
  kOk,
  kNotInt,      // a bool for an unannotated int slot (Triton makes it u1)
  kWrongClass,  // an unannotated int of another class than the slot's (i32 / i64 / u64)
  kOutOfRange,  // an annotated int outside its type, or a flag beyond 64 bits
  kNotBool,     // an int for an unannotated bool slot
  kFp16Range,   // rounds beyond fp16's 65504 (Triton's launcher raises OverflowError)
};

// An integer (or a bool) read from any face: its 64 bits, whether it is an
// unsigned value above INT64_MAX, whether it was a bool.
struct IntVal {
  uint64_t bits = 0;
  bool big = false;
  bool is_bool = false;
  int64_t value() const { return int64_t(bits); }
};

// How an int slot packs: its type; annotated (type fixed by the kernel: any
// value in range, or a bool as 0 or 1 with no bits keyed) or Triton's class
// of the value; whether the == 1 bit (fold) and the % 16 bit (div) are keyed.
struct IntSpec {
  Ty ty;
  bool annotated, fold, div;
};

// Triton's class of an unannotated int: i32 if it fits, else i64, else u64.
inline Ty int_class(IntVal v) {
  if (v.big) return Ty::kU64;
  return v.value() >= INT32_MIN && v.value() <= INT32_MAX ? Ty::kI32 : Ty::kI64;
}

inline bool int_fits(IntVal v, Ty t) {
  if (v.big) return t == Ty::kU64;
  int64_t x = v.value();
  switch (t) {
    case Ty::kI8: return x >= INT8_MIN && x <= INT8_MAX;
    case Ty::kI16: return x >= INT16_MIN && x <= INT16_MAX;
    case Ty::kI32: return x >= INT32_MIN && x <= INT32_MAX;
    case Ty::kI64: return true;
    case Ty::kU8: return x >= 0 && x <= UINT8_MAX;
    case Ty::kU16: return x >= 0 && x <= UINT16_MAX;
    case Ty::kU32: return x >= 0 && x <= UINT32_MAX;
    case Ty::kU64: return x >= 0;
    default: return false;
  }
}

// The parameter's bytes into `cell` (little-endian: the low bytes of the
// value) and its 2 key bits into *bits (bit 0: == 1, bit 1: % 16). The call
// key's value word, where the slot has one, is v.bits.
inline Fit encode_int(const IntSpec& s, IntVal v, void* cell, uint64_t* bits) {
  if (v.is_bool && !s.annotated) return Fit::kNotInt;
  if (!s.annotated && int_class(v) != s.ty) return Fit::kWrongClass;
  if (s.annotated && !int_fits(v, s.ty)) return Fit::kOutOfRange;
  std::memcpy(cell, &v.bits, param_bytes(s.ty));
  bool keyed = !v.is_bool;  // Triton's binder attaches no specialization to a bool
  *bits = uint64_t(keyed && s.fold && v.bits == 1) | uint64_t(keyed && s.div && v.bits % 16 == 0) << 1;
  return Fit::kOk;
}

// A bool parameter (u1) as its low byte, as Triton's launcher passes it (the
// kernel reads bit 0). Unannotated: a bool only; annotated tl.int1: an int too.
// The key's value word is v.bits.
inline Fit encode_flag(bool annotated, IntVal v, void* cell) {
  if (!v.is_bool && !annotated) return Fit::kNotBool;
  if (v.big) return Fit::kOutOfRange;
  uint8_t low = uint8_t(v.bits);
  std::memcpy(cell, &low, 1);
  return Fit::kOk;
}

// A float parameter in its type, as Triton's launcher packs it (fp16 rounded
// to even, refused past its range; bf16 truncated). The key's value word is
// the double's bits.
inline Fit encode_float(Ty t, double d, void* cell) {
  switch (t) {
    case Ty::kFp16: {
      uint16_t h;
      if (!fp16_bits(d, &h)) return Fit::kFp16Range;
      std::memcpy(cell, &h, 2);
      return Fit::kOk;
    }
    case Ty::kBf16: {
      uint16_t h = bf16_bits(d);
      std::memcpy(cell, &h, 2);
      return Fit::kOk;
    }
    case Ty::kFp32: {
      float f = float(d);
      std::memcpy(cell, &f, 4);
      return Fit::kOk;
    }
    default:
      std::memcpy(cell, &d, 8);
      return Fit::kOk;
  }
}

// A pointer's key bit: 16-byte aligned, where alignment is keyed (tt.divisibility 16).
inline uint64_t ptr_bit(bool align, uint64_t addr) { return uint64_t(align && addr % 16 == 0); }

}  // namespace lt
