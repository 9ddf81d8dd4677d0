// The slot table, read: how each slot of a call's argument shape is read from Python,
// packed and keyed. One reader for both Python stubs: the table-driven stub
// (generic_stub.cc) walks a table made at run time from specialize.Shape.table(); a
// generated stub (lazytriton.runtime.stubgen) embeds the same rows as constants and calls
// read_slot once per slot, which the compiler folds into straight-line code.
#pragma once
#include <Python.h>

#include <cstring>

#include "lazytriton/slot_spec.h"
#include "python_args.h"

namespace lt::pyargs {

// A descriptor's storage, left uninitialized until read_slot fills it: a call zeroes
// only what it uses.
union DescCell {
  DescCell() {}
  HostTensorDesc d;
};

// SlotSpec, a slot table row decoded (slot_spec, value_words), is lazytriton/slot_spec.h's: the C++
// bundles decode their variants' rows with it too.
using lt::SlotSpec;

// Reads slot i (`arg`) as `s` says: its parameter into *cell (a descriptor into *desc), its
// bits into the key's bit words and its value words at key[*vw] on (advancing *vw), the device
// of an array into *devices (array_reads.h fold_device). False: not this shape (no error set).
__attribute__((always_inline)) inline bool read_slot(const SlotSpec& s, PyObject* arg, size_t i, uint64_t* cell,
                                                     HostTensorDesc* desc, uint64_t* key, size_t* vw, int* devices) {
  IntVal iv;
  double d = 0;
  switch (s.kind) {
    case SlotKind::kPtr:
      if (!get_pointer(arg, s.dtype, cell, devices)) return false;
      key_put_bits(key, i, ptr_bit(s.specialize, *cell));
      return true;
    case SlotKind::kInt: {
      uint64_t bits;
      if (!read_int(arg, &iv) || encode_int(s.int_spec, iv, cell, &bits) != Fit::kOk) return false;
      key_put_bits(key, i, bits);
      if (s.in_key) key[(*vw)++] = iv.bits;
      return true;
    }
    case SlotKind::kFloat:
      if (!(s.annotated ? get_real(arg, &d) : get_float(arg, &d)) || encode_float(s.ty, d, cell) != Fit::kOk)
        return false;
      if (s.in_key) std::memcpy(&key[(*vw)++], &d, 8);
      return true;
    case SlotKind::kBool:  // tl.int1 (annotated): an int too, as its low byte (Triton's launcher)
      if (!read_int(arg, &iv) || encode_flag(s.annotated, iv, cell) != Fit::kOk) return false;
      if (s.in_key) key[(*vw)++] = iv.bits;
      return true;
    case SlotKind::kDesc:  // the block shape is the key: it is the kernel's type
      *desc = HostTensorDesc{};
      if (!get_tensor_desc(arg, s.dtype, s.rank, desc, devices)) return false;
      for (int j = 0; j < desc->rank; ++j) key[(*vw)++] = uint64_t(desc->block[j]);
      return true;
    case SlotKind::kFolded:  // an array or a number here is another shape
      if (!is_folded_constexpr(arg)) return false;
      [[fallthrough]];
    case SlotKind::kConstexpr:
      constexpr_key(arg, &key[*vw]);
      *vw += 2;
      return true;
  }
  return false;
}

// Whether a call's arrays may be handed to a kernel on `device` (python_args.h launch_context):
// all there, else each pointer accessible from it. descs: the call's descriptors, in slot order.
inline bool arrays_here(const SlotSpec* table, size_t n, const uint64_t* cells, const DescCell* descs,
                        int devices, int device) {
  if (devices == kNoArrays || devices == device) return true;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if (table[i].kind == SlotKind::kPtr && !accessible(cells[i])) return false;
    if (table[i].kind == SlotKind::kDesc && !accessible(descs[k++].d.base)) return false;
  }
  return true;
}

// Slot i of a resolved call as a kernel parameter (call_layout.h pack_params); `*k` counts the
// descriptors so far (a descriptor slot is always a parameter).
__attribute__((always_inline)) inline ParamRef param_of(const SlotSpec& s, const Entry& e, size_t i, uint64_t* cells, const DescCell* descs,
                         size_t* k, const char* name) {
  if (!e.is_param[i]) return {};
  if (s.kind == SlotKind::kDesc) return {nullptr, &descs[(*k)++].d, name};
  return {&cells[i]};
}

// Per slot, the bytes passed to the kernel (None for a constexpr; a descriptor's fields as a
// tuple): what the stubs' params(args) returns, for tests.
inline PyObject* params_tuple(const SlotSpec* table, size_t n, const uint64_t* cells, const DescCell* descs) {
  PyObject* t = PyTuple_New(Py_ssize_t(n));
  if (!t) return nullptr;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const SlotSpec& s = table[i];
    PyObject* item = is_constexpr_slot(s) ? Py_NewRef(Py_None)
                     : s.kind == SlotKind::kDesc
                         ? desc_tuple(descs[k++].d)
                         : PyBytes_FromStringAndSize(reinterpret_cast<const char*>(&cells[i]), Py_ssize_t(s.size));
    if (!item) return Py_DECREF(t), nullptr;
    PyTuple_SET_ITEM(t, Py_ssize_t(i), item);
  }
  return t;
}

}  // namespace lt::pyargs
