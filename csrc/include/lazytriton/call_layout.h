// A call's layout, the same on every face (the Python stubs, generated and table-driven, the
// C++ bundles, the JAX call site): its call key and its kernel parameters.
//
// The call key: first 2 bits per slot (bit 0: an int == 1, or a pointer 16-byte aligned;
// bit 1: an int % 16 == 0), key_bit_words(n) words of them; then each slot's value words (an
// autotune key's value, a constexpr's two, a descriptor's block shape); last, one word that
// keeps apart keys of different layouts in one table (a stub's shape word, a bundle's context,
// a call site's buffer count). lazytriton.model.specialize.Shape writes the same layout for the
// Python stubs (key_words, bit_words, value_words).
//
// The kernel parameters: pack_params, the one loop that turns a call's slots into the
// parameter array Kernel::launch takes (a descriptor expands into several, per the kernel's
// metadata; a slot folded into the binary into none).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "lazytriton/kernel.h"

namespace lt {

constexpr size_t key_bit_words(size_t n_slots) { return (2 * n_slots + 63) / 64; }

// Slot i's 2 bits (ptr_bit, or encode_int's) into the key's bit words (zeroed before).
inline void key_put_bits(uint64_t* key, size_t i, uint64_t bits) { key[(2 * i) / 64] |= bits << ((2 * i) % 64); }
inline uint64_t key_bits_of(const uint64_t* key, size_t i) { return key[(2 * i) / 64] >> ((2 * i) % 64) & 3; }

// One call slot as a kernel parameter: its packed bytes (`cell`), or the host tensor descriptor
// it expands into (`desc`, named `name` in errors), or neither (not a parameter: folded into the
// binary as a constexpr).
struct ParamRef {
  void* cell = nullptr;
  const HostTensorDesc* desc = nullptr;
  const char* name = "";
};

// One step of pack_params: slot i's parameter(s) at out[np] on.
template <class At>
inline void pack_param(const LaunchMeta& m, const std::string& kernel, size_t i, At& at, DescParams* descs,
                       void** out, size_t& np, size_t& nd) {
  const ParamRef p = at(i);
  if (p.desc) {
    np += pack_tensor_desc(m.tensordesc, m.tensordesc_abi, nd, *p.desc, descs[nd], out + np, kernel, p.name);
    ++nd;
  } else if (p.cell) {
    out[np++] = p.cell;
  }
}

// The kernel parameters of slots 0..n-1 into `out` (`at(i)`: slot i's ParamRef, asked in
// order); descriptors are encoded into `descs` (one per descriptor, uninitialized storage is
// fine). Returns how many parameters it wrote. `kernel` names the kernel in errors.
template <class At>
inline size_t pack_params(const Kernel& k, const std::string& kernel, size_t n, At&& at, DescParams* descs,
                          void** out) {
  size_t np = 0, nd = 0;
  for (size_t i = 0; i < n; ++i) pack_param(k.meta(), kernel, i, at, descs, out, np, nd);
  return np;
}

// The same for a number of slots known at compile time (a generated stub): unrolled, so that
// each at(i) folds for its slot.
template <class At, size_t... I>
inline size_t pack_params(const Kernel& k, const std::string& kernel, std::index_sequence<I...>, At&& at,
                          DescParams* descs, void** out) {
  size_t np = 0, nd = 0;
  (pack_param(k.meta(), kernel, I, at, descs, out, np, nd), ...);
  return np;
}

}  // namespace lt
