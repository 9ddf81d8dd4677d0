// Triton's spelling of parameter types, as signatures and bundle variants
// write them: scalars ("i32", "fp16", "u1"), pointers ("*fp32"), tensor
// descriptors ("tensordesc<fp16[64, 64]>") and tuples ("[*fp32,[i32,fp32]]").
// Private to liblazytriton.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lt::sigtypes {

enum class Ty : uint8_t { kPtr, kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64, kU1, kFp16, kBf16, kFp32, kFp64, kDesc };

inline bool is_int(Ty t) { return t >= Ty::kI8 && t <= Ty::kU64; }
inline bool is_float(Ty t) { return t >= Ty::kFp16 && t <= Ty::kFp64; }

// A scalar type's Ty ("i32" -> kI32); false if `name` is not one.
bool scalar_type(std::string_view name, Ty* out);

// "tensordesc<fp16[64, 64]>" (spaces optional) as Triton spells it: its element
// type, rank, block shape and canonical spelling; false if it is not one.
bool parse_desc_type(const std::string& t, int* dtype, int* rank, int64_t* block, std::string* canonical);

// Splits a signature at the commas outside brackets: "[*fp32,i32],i32" -> "[*fp32,i32]", "i32".
std::vector<std::string> split_top(std::string_view sig, const std::string& what);

// A tuple type "[*fp32,[i32,fp32]]" (Triton's spelling): each leaf's path
// suffix ("[1][0]") and type, in order, and the nesting ("[_,[_,_]]").
void tuple_leaves(const std::string& t, const std::string& path, std::vector<std::pair<std::string, std::string>>& leaves,
                  std::string& structure, const std::string& what);

}  // namespace lt::sigtypes
