// The value types of lazytriton/bundle.h: element type names, constexpr
// values (Constant), what a grid function reads (Meta) and host tensor
// descriptors (TensorDesc).
#include "lazytriton/bundle.h"

#include <sstream>

namespace lt {

const char* dtype_name(int d) { return d >= 0 && d < kNumDtypes ? kDtypeNames[d] : "?"; }

int dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDtypes; ++i)
    if (name == kDtypeNames[i]) return i;
  return kNoDtype;
}

TensorDesc::TensorDesc(DevicePtr base, const int64_t* shape, size_t n_shape, const int64_t* strides,
                       size_t n_strides, const int64_t* block, size_t n_block, Padding padding,
                       bool round_f32_to_tf32)
    : nbytes(base.nbytes) {
  desc.base = base.addr;
  desc.dtype = base.dtype;
  desc.nan_padding = padding == kNan;
  desc.tf32 = round_f32_to_tf32;
  if (n_shape != n_strides || n_shape != n_block || n_shape < 1 || n_shape > size_t(kMaxDescRank)) return;  // rank 0
  desc.rank = int(n_shape);
  for (size_t i = 0; i < n_shape; ++i) desc.shape[i] = shape[i], desc.strides[i] = strides[i], desc.block[i] = block[i];
}

int64_t Constant::as_int() const {
  if (type_ != kInt && type_ != kBool) throw Error("constant " + repr() + " is not an integer");
  return i_;
}

double Constant::as_float() const {
  if (type_ == kFloat) return d_;
  if (type_ == kInt) return double(i_);
  throw Error("constant " + repr() + " is not a number");
}

const std::string& Constant::as_string() const {
  if (type_ != kString) throw Error("constant " + repr() + " is not a string");
  return s_;
}

std::string Constant::repr() const {
  switch (type_) {
    case kNone: return "None";
    case kBool: return i_ ? "True" : "False";
    case kInt: return std::to_string(i_);
    case kFloat: {
      std::ostringstream os;
      os.precision(17);
      os << d_;
      std::string s = os.str();
      return s.find_first_of(".en") == std::string::npos ? s + ".0" : s;
    }
    case kString: return "'" + s_ + "'";
  }
  return "?";
}

bool Constant::operator==(const Constant& o) const {
  if (type_ != o.type_) return false;
  if (type_ == kFloat) return d_ == o.d_;
  if (type_ == kString) return s_ == o.s_;
  return i_ == o.i_;
}

const Constant* Meta::find(std::string_view name) const {
  for (const auto& kv : items_)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

const Constant& Meta::at(std::string_view name) const {
  if (const Constant* c = find(name)) return *c;
  std::string have;
  for (const auto& kv : items_) have += (have.empty() ? "" : ", ") + kv.first;
  throw Error("kernel " + kernel_ + ": no meta-parameter '" + std::string(name) + "' (it has: " +
              (have.empty() ? "none" : have) + ")");
}

}  // namespace lt
