// A call site whose argument layout is fixed when it is made: device buffers
// change per call (a JAX custom call's operands and results, a C++ caller's
// pointers), scalars and meta-parameters do not. Its entries are keyed by the
// 16-byte alignment of the buffers (the only specialization left open), and
// a resolved call launches with no Python, no allocation and no host sync, so
// it can be captured into a CUDA graph.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lazytriton/call_layout.h"
#include "lazytriton/resolve_table.h"

namespace lt {

// The call key of a fixed-layout call, laid out as every call key (call_layout.h): each
// buffer's bits (bit 0: 16-byte aligned), then the buffer count. Writes
// alignment_key_words(n) words to `key`.
constexpr size_t alignment_key_words(size_t n) { return key_bit_words(n) + 1; }
void alignment_key(const uint64_t* buffers, size_t n, uint64_t* key);

// Zeroes e.zero's buffers, then launches e.kernel with parameters taken from
// e.sources (buffer addresses from `buffers`, scalars from the entry); its
// scratch, if any, from `arena` (see Kernel::launch).
void launch_fixed(const Entry& e, cu::CUcontext ctx, cu::CUstream stream, const uint64_t* buffers, size_t n,
                  ScratchArena* arena = nullptr);

// An entry's parameters on these buffers, packed once for callers that launch them many times
// (the tuner's trials, the benchmarks' loops): the same sources and the same packing as
// launch_fixed, into storage of its own. Zeroing e.zero is the caller's.
struct FixedParams {
  FixedParams(const Entry& e, const uint64_t* buffers, size_t n);
  FixedParams(const FixedParams&) = delete;  // `params` points into the object
  FixedParams& operator=(const FixedParams&) = delete;
  std::vector<void*> params;  // what Kernel::launch takes

 private:
  std::vector<uint64_t> slots_;
  std::vector<DescParams> descs_;
};

class CallSite {
 public:
  CallSite(std::string name, size_t n_buffers, ResolveTable::Resolver resolver)
      : n_buffers_(n_buffers), table_(std::move(name), std::move(resolver)) {}

  const std::string& name() const { return table_.name(); }
  size_t n_buffers() const { return n_buffers_; }
  ResolveTable& table() { return table_; }

  // Launches on `stream` in `ctx`. An unresolved key is resolved first, once
  // across threads, by the resolver (which gets `call_ctx`). A caller whose
  // launches may be captured into a graph passes the arena its scratch lives in.
  void launch(cu::CUcontext ctx, cu::CUstream stream, const uint64_t* buffers, void* call_ctx,
              ScratchArena* arena = nullptr);

 private:
  size_t n_buffers_;
  ResolveTable table_;
};

}  // namespace lt
