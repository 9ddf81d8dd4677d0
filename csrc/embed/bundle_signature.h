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

#include "lazytriton/encode.h"

namespace lt::sigtypes {

// Scalar types (Ty, scalar_type) are encode.h's: the packing rules read them too.
using lt::is_float;
using lt::is_int;
using lt::scalar_type;
using lt::Ty;

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
