// The resolve-once table every face shares (the Python stubs' kernel, the JAX
// call site, the C++ bundle): calls are keyed by their specialization
// (alignment, ==1 and divisibility of arguments, autotune key values); a key
// seen for the first time is resolved once (compiled and tuned; concurrent
// callers of the same key wait for it), and every later call with that key
// finds its Entry without a lock and launches directly. A key is resolved by
// the table's resolver (resolve()), or by a caller that resolves it itself
// (claim(), then publish() or fail(): the Python launcher, which already runs
// in Python when it resolves); both are de-duplicated alike. While a key is
// tuned online (over the calls that follow its first), its resolver answers
// each call with a one-call entry (Entry::once): launched by that call,
// never installed, so the next call of the key asks the resolver again.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lazytriton/kernel.h"
#include "lazytriton/tuning.h"

namespace lt {

using CallKey = std::vector<uint64_t>;

// For callers with a fixed argument layout (the JAX handler, C++ embedders):
// where one kernel parameter comes from.
struct ParamSource {
  int32_t buffer = -1;  // >= 0: the address of that call buffer
  uint64_t bits = 0;    // else this scalar, in the parameter's C type (low bytes)
  int32_t desc = -1;    // >= 0: Entry::descs[desc], a tensor descriptor on call buffer `buffer`
};

// A host tensor descriptor argument of a fixed-layout call: everything but
// its base address is fixed; it is encoded (tensor_desc.h) on every launch.
struct DescSource {
  int32_t buffer = -1;
  HostTensorDesc desc;  // base: set per launch
  std::string name;     // the argument's name, for errors
};

// A call buffer zeroed before every launch (jax-triton's zeroed_outputs).
struct ZeroSpec {
  int32_t buffer;
  uint64_t bytes;
};

// What a resolved key launches.
struct Entry {
  std::shared_ptr<Kernel> kernel;
  // Bit i set: call argument i is a runtime kernel parameter (not folded into
  // the binary as a constexpr, e.g. an int specialized to 1).
  std::vector<bool> is_param;
  // Grid for callers that fix it at resolution time (C++ embedders, JAX).
  Dim3 grid;
  // Fixed-layout callers: every kernel parameter's source, and the buffers
  // to zero before each launch.
  std::vector<ParamSource> sources;
  std::vector<DescSource> descs;
  std::vector<ZeroSpec> zero;
  // Opaque data owned by the layer that resolved the entry (e.g. the Python
  // config meta-parameters a grid callable needs).
  std::shared_ptr<void> user;
  // A one-call entry of online tuning (a candidate launched by this call only): never
  // installed. With a timer, the launch that takes it records its events around the launch.
  bool once = false;
  std::shared_ptr<LaunchTimer> timer;
};

// Launches entry `e` through `launch` (a face's own packing, then Kernel::launch). A candidate of
// online tuning whose timer this launch takes is timed (Kernel::launch records the events right
// around the driver call); should it throw, its timer keeps the error and false is returned: the
// caller asks its resolver again, which drops the candidate and answers another for this call.
template <class F>
bool launch_entry_timed(const Entry& e, F&& launch) {
  if (!e.timer || !e.timer->take()) {
    launch();
    return true;
  }
  try {
    e.timer->arm();
    launch();
    e.timer->disarm();
    return true;
  } catch (const std::exception& ex) {
    e.timer->disarm();
    e.timer->fail(ex.what());
    return false;
  }
}

class ResolveTable {
 public:
  // Called without any lazytriton lock held; returns the entry for `key`.
  // `call_ctx` is whatever the caller passed to resolve() (its arguments).
  using Resolver = std::function<std::shared_ptr<const Entry>(const CallKey& key, void* call_ctx)>;

  // A table whose keys are resolved by `resolver`; with none, only through claim().
  ResolveTable(std::string name, Resolver resolver = nullptr);
  ~ResolveTable();

  const std::string& name() const { return name_; }

  // Lock-free lookup for the launch hot path; nullptr if `key` is unresolved.
  const Entry* find(const uint64_t* key, size_t n) const noexcept;

  // Slow path: resolves `key` once. Concurrent callers with the same key wait
  // for the first one and share its result (or its exception). The caller
  // must not hold locks the resolver needs (for Python: release the GIL).
  // A one-call entry (Entry::once) is not installed: it is kept alive for this
  // thread until its next resolution, and the next call resolves again.
  const Entry* resolve(const uint64_t* key, size_t n, void* call_ctx);

  // For a caller that resolves `key` itself: its entry (installed, or installed
  // by the resolution in flight, which is waited for; its error is rethrown),
  // or nullptr: the caller now owns the key's resolution and must end it with
  // publish() or fail(), which wake the callers waiting for it. The caller
  // must not hold locks the owner of a resolution in flight needs.
  const Entry* claim(const uint64_t* key, size_t n);
  const Entry* publish(const CallKey& key, std::shared_ptr<const Entry> entry);
  void fail(const CallKey& key, std::exception_ptr error);  // the next call of `key` resolves it again
  // Ends it with no entry and no error: a caller that launched this call itself (online
  // tuning); those waiting claim the key again.
  void release(const CallKey& key);

  // The entry for `key` as an owning pointer (nullptr if unresolved).
  std::shared_ptr<const Entry> entry(const uint64_t* key, size_t n) const;

  // Installs a known entry (e.g. loaded from the persistent cache).
  const Entry* install(const CallKey& key, std::shared_ptr<const Entry> entry);

  size_t size() const;
  void clear();

 private:
  void finish(const CallKey& key, std::shared_ptr<const Entry> entry, std::exception_ptr error);

  struct Table {
    std::vector<std::pair<CallKey, std::shared_ptr<const Entry>>> rows;
  };
  struct InFlight {
    bool done = false;
    std::exception_ptr error;
    std::shared_ptr<const Entry> entry;  // none, and no error: released (claim it again)
  };

  std::string name_;
  Resolver resolver_;
  std::atomic<const Table*> table_;
  std::vector<std::unique_ptr<const Table>> tables_;  // every published table, kept for lock-free readers
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<CallKey, std::shared_ptr<InFlight>> in_flight_;
};

}  // namespace lt
