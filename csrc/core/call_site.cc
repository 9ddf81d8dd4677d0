#include "lazytriton/call_site.h"

#include <cstring>
#include <vector>

#include "lazytriton/tuning.h"

namespace lt {

void alignment_key(const uint64_t* buffers, size_t n, uint64_t* key) {
  std::memset(key, 0, alignment_key_words(n) * sizeof(uint64_t));
  key[0] = n;  // sites with different buffer counts never share a key
  for (size_t i = 0; i < n; ++i)
    if (buffers[i] % 16 == 0) key[1 + i / 64] |= uint64_t(1) << (i % 64);
}

void launch_fixed(const Entry& e, cu::CUcontext ctx, cu::CUstream stream, const uint64_t* buffers, size_t n,
                  ScratchArena* arena) {
  constexpr size_t kMax = 256;
  const LaunchMeta& m = e.kernel->meta();
  const size_t ns = e.sources.size();
  if (ns > kMax) throw Error("kernel " + m.name + ": more than 256 parameters");
  uint64_t slots[kMax];
  void* params[kMax + 8 * kMaxDescParams];
  // Descriptors are encoded into this launch's parameter bytes: host work, fine under capture.
  constexpr size_t kInlineDescs = 8;
  DescParams inline_descs[kInlineDescs];  // no initialization: packing writes what it passes
  std::vector<DescParams> heap_descs(e.descs.size() > kInlineDescs ? e.descs.size() : 0);
  std::vector<void*> heap_params;
  DescParams* descs = e.descs.size() <= kInlineDescs ? inline_descs : heap_descs.data();
  void** out = params;
  if (e.descs.size() > kInlineDescs) {
    heap_params.resize(ns + e.descs.size() * kMaxDescParams);
    out = heap_params.data();
  }
  size_t np = 0, k = 0;
  for (size_t i = 0; i < ns; ++i) {
    const ParamSource& s = e.sources[i];
    if (s.buffer >= 0 && size_t(s.buffer) >= n)
      throw Error("kernel " + m.name + ": parameter " + std::to_string(i) + " reads buffer " +
                  std::to_string(s.buffer) + " of " + std::to_string(n));
    if (s.desc >= 0) {
      const DescSource& ds = e.descs[size_t(s.desc)];
      HostTensorDesc d = ds.desc;
      d.base = buffers[s.buffer];
      np += pack_tensor_desc(m.tensordesc, m.tensordesc_abi, k, d, descs[k], out + np, m.name, ds.name.c_str());
      ++k;
      continue;
    }
    slots[i] = s.buffer >= 0 ? buffers[s.buffer] : s.bits;
    out[np++] = &slots[i];
  }
  for (const ZeroSpec& z : e.zero)
    if (z.bytes && size_t(z.buffer) < n) zero_buffer(stream, {buffers[z.buffer], z.bytes});
  e.kernel->launch(ctx, stream, e.grid, out, np, arena);
}

void CallSite::launch(cu::CUcontext ctx, cu::CUstream stream, const uint64_t* buffers, void* call_ctx,
                      ScratchArena* arena) {
  // On the stack: this runs on every launch of a JAX custom call.
  constexpr size_t kInline = alignment_key_words(1024);
  uint64_t inline_key[kInline];
  std::vector<uint64_t> heap_key;
  const size_t words = alignment_key_words(n_buffers_);
  uint64_t* key = inline_key;
  if (words > kInline) {
    heap_key.resize(words);
    key = heap_key.data();
  }
  alignment_key(buffers, n_buffers_, key);
  const Entry* e = table_.find(key, words);
  if (!e) e = table_.resolve(key, words, call_ctx);
  launch_fixed(*e, ctx, stream, buffers, n_buffers_, arena);
}

}  // namespace lt
