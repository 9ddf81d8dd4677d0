#include "lazytriton/call_site.h"

#include <cstring>
#include <vector>

#include "lazytriton/encode.h"
#include "lazytriton/tuning.h"

namespace lt {

void alignment_key(const uint64_t* buffers, size_t n, uint64_t* key) {
  const size_t bits = key_bit_words(n);
  std::memset(key, 0, bits * sizeof(uint64_t));
  for (size_t i = 0; i < n; ++i) key_put_bits(key, i, ptr_bit(true, buffers[i]));
  key[bits] = n;  // sites with different buffer counts never share a key
}

namespace {

// Parameter i of `e` read from its source (call_layout.h pack_params asks in order): a call
// buffer's address or a scalar's bits into slots[i], or a descriptor on a buffer via `desc`
// (pack_params encodes each before it asks for the next, so one suffices).
auto fixed_source(const Entry& e, const uint64_t* buffers, size_t n, uint64_t* slots, HostTensorDesc& desc) {
  return [&e, buffers, n, slots, &desc](size_t i) -> ParamRef {
    const ParamSource& s = e.sources[i];
    if (s.buffer >= 0 && size_t(s.buffer) >= n)
      throw Error("kernel " + e.kernel->meta().name + ": parameter " + std::to_string(i) + " reads buffer " +
                  std::to_string(s.buffer) + " of " + std::to_string(n));
    if (s.desc >= 0) {
      const DescSource& ds = e.descs[size_t(s.desc)];
      desc = ds.desc;
      desc.base = buffers[s.buffer];
      return {nullptr, &desc, ds.name.c_str()};
    }
    slots[i] = s.buffer >= 0 ? buffers[s.buffer] : s.bits;
    return {&slots[i]};
  };
}

}  // namespace

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
  HostTensorDesc desc;
  size_t np = pack_params(*e.kernel, m.name, ns, fixed_source(e, buffers, n, slots, desc), descs, out);
  for (const ZeroSpec& z : e.zero)
    if (z.bytes && size_t(z.buffer) < n) zero_buffer(stream, {buffers[z.buffer], z.bytes});
  e.kernel->launch(ctx, stream, e.grid, out, np, arena);
}

FixedParams::FixedParams(const Entry& e, const uint64_t* buffers, size_t n)
    : params(e.sources.size() + e.descs.size() * kMaxDescParams), slots_(e.sources.size()), descs_(e.descs.size()) {
  HostTensorDesc desc;
  params.resize(pack_params(*e.kernel, e.kernel->meta().name, e.sources.size(),
                            fixed_source(e, buffers, n, slots_.data(), desc), descs_.data(), params.data()));
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
  if (const Entry* e = table_.find(key, words)) return launch_fixed(*e, ctx, stream, buffers, n_buffers_, arena);
  for (;;) {
    const Entry* e = table_.resolve(key, words, call_ctx);
    if (launch_entry_timed(*e, [&] { launch_fixed(*e, ctx, stream, buffers, n_buffers_, arena); })) return;
  }
}

}  // namespace lt
