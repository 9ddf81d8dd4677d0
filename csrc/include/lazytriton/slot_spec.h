// A slot table row, decoded: how one slot of a call is read, packed and keyed. The rows are
// lazytriton.model.specialize.Shape.table()'s (contract.SLOT_ROW's fields); every face that walks
// a call's slots decodes them here: the Python stubs (csrc/python/slot_table.h read_slot, the
// table-driven stub's table and a generated stub's constants) and the C++ bundles (a variant's
// "table", bundle_kernel.cc). Free of Python.
#pragma once
#include <cstddef>

#include "lazytriton/contract.h"
#include "lazytriton/encode.h"
#include "lazytriton/tensor_desc.h"

namespace lt {

struct SlotSpec {
  SlotKind kind = SlotKind::kConstexpr;
  int dtype = -1;  // ptr, desc: its element type id
  int rank = 0;  // desc: its rank
  bool annotated = false, specialize = true, in_key = false;
  IntSpec int_spec{Ty::kI32, false, true, true};  // int: how encode_int packs it
  Ty ty = Ty::kPtr;  // int, float, bool: the parameter type
  size_t size = 8;  // bytes of the kernel parameter
};

// Why a row's codes are out of range (nullptr: a valid row); checked before slot_spec decodes it.
constexpr const char* slot_row_error(int kind, int dtype, int code, bool annotated, int float_code) {
  if (kind < 0 || kind >= kNumSlotKinds) return "bad kind";
  if ((kind == int(SlotKind::kPtr) || kind == int(SlotKind::kDesc)) && (dtype < 0 || dtype >= kNumDtypes))
    return "bad dtype";
  if (kind == int(SlotKind::kInt) &&
      (code < 0 || code >= int(annotated ? sizeof kIntTypes / sizeof kIntTypes[0] : sizeof kIntClasses / sizeof kIntClasses[0])))
    return "bad int_code";
  if (kind == int(SlotKind::kFloat) && (float_code < 0 || float_code >= int(sizeof kFloatTypes / sizeof kFloatTypes[0])))
    return "bad float_code";
  if (kind == int(SlotKind::kDesc) && (code < 1 || code > kMaxDescRank)) return "a descriptor slot's rank is 1 to 5";
  return nullptr;
}

// A row's fields decoded (valid codes: slot_row_error first).
constexpr SlotSpec slot_spec(int kind, int dtype, int code, bool annotated, bool specialize, bool in_key,
                             bool divisibility, int float_code) {
  SlotSpec s;
  s.kind = SlotKind(kind);
  s.dtype = dtype;
  s.rank = s.kind == SlotKind::kDesc ? code : 0;
  s.annotated = annotated, s.specialize = specialize, s.in_key = in_key;
  if (s.kind == SlotKind::kInt) {
    s.ty = annotated ? kIntTypes[code] : kIntClasses[code];
    s.int_spec = {s.ty, annotated, specialize, divisibility};
  } else if (s.kind == SlotKind::kFloat) {
    s.ty = kFloatTypes[float_code];
  } else if (s.kind == SlotKind::kBool) {
    s.ty = Ty::kU1;
  }
  s.size = s.kind == SlotKind::kInt || s.kind == SlotKind::kFloat || s.kind == SlotKind::kBool ? param_bytes(s.ty) : 8;
  return s;
}

// A constexpr (declared, or folded into the binary by its value): not a kernel parameter of any call.
constexpr bool is_constexpr_slot(const SlotSpec& s) {
  return s.kind == SlotKind::kConstexpr || s.kind == SlotKind::kFolded;
}

// The call key words a slot takes after the bit words (specialize.Slot.value_words).
constexpr size_t value_words(const SlotSpec& s) {
  return s.kind == SlotKind::kDesc ? size_t(s.rank) : is_constexpr_slot(s) ? 2 : size_t(s.in_key);
}

}  // namespace lt
