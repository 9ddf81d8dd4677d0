#include "lazytriton/tuning.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "lazytriton/kernel.h"

namespace lt {
namespace {

// Leave this much device memory free when deciding where snapshots live.
constexpr size_t kDeviceHeadroom = size_t(256) << 20;

class Events {
 public:
  explicit Events(size_t n) : ev_(n, nullptr) {
    for (auto& e : ev_) check(driver().cuEventCreate(&e, cu::CU_EVENT_DEFAULT), "cuEventCreate");
  }
  ~Events() {
    for (auto e : ev_)
      if (e) driver().cuEventDestroy(e);
  }
  cu::CUevent operator[](size_t i) const { return ev_[i]; }

 private:
  std::vector<cu::CUevent> ev_;
};

float elapsed(cu::CUevent a, cu::CUevent b) {
  float ms = 0;
  check(driver().cuEventElapsedTime(&ms, a, b), "cuEventElapsedTime");
  return ms;
}

BenchResult summarize(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  BenchResult r;
  r.reps = int(ms.size());
  r.min_ms = ms.front();
  r.median_ms = r.reps % 2 ? ms[r.reps / 2] : 0.5f * (ms[r.reps / 2 - 1] + ms[r.reps / 2]);
  return r;
}

}  // namespace

std::vector<BenchResult> bench_interleaved(cu::CUstream stream, const std::vector<std::function<void()>>& launches,
                                           const std::function<void()>& prepare, const BenchOptions& opt) {
  const size_t n = launches.size();
  if (n == 0) return {};
  auto full_prepare = [&] {
    prepare();
    if (opt.flush_l2) flush_l2(stream);
  };
  for (const auto& launch : launches) {
    for (int i = 0; i < opt.warmup; ++i) {
      full_prepare();
      launch();
      counters().bench_launches++;
    }
  }
  // One timed launch each estimates the cost; the budget then sets the repetitions.
  const Driver& d = driver();
  auto timed = [&](int reps) {
    Events ev(2 * size_t(reps) * n);  // rep r, launch i: events 2(nr + i) and 2(nr + i) + 1
    cu::CUevent last = nullptr;
    for (int r = 0; r < reps; ++r) {
      for (size_t j = 0; j < n; ++j) {
        size_t e = 2 * (n * size_t(r) + (r % 2 ? n - 1 - j : j));
        full_prepare();
        check(d.cuEventRecord(ev[e], stream), "cuEventRecord");
        launches[e / 2 - n * size_t(r)]();
        check(d.cuEventRecord(last = ev[e + 1], stream), "cuEventRecord");
        counters().bench_launches++;
      }
    }
    check(d.cuEventSynchronize(last), "tuning: cuEventSynchronize");
    std::vector<std::vector<float>> ms(n, std::vector<float>(reps));
    for (int r = 0; r < reps; ++r)
      for (size_t i = 0; i < n; ++i) ms[i][r] = elapsed(ev[2 * (n * r + i)], ev[2 * (n * r + i) + 1]);
    return ms;
  };
  double est = 0;
  for (const auto& one : timed(1)) est += std::max(one[0], 1e-4f);
  est /= double(n);
  int reps = int(std::clamp(opt.target_ms / est, double(opt.min_reps), double(opt.max_reps)));
  std::vector<BenchResult> out;
  for (auto& ms : timed(reps)) out.push_back(summarize(std::move(ms)));
  return out;
}

BenchResult bench(cu::CUstream stream, const std::function<void()>& launch,
                  const std::function<void()>& prepare, const BenchOptions& opt) {
  return bench_interleaved(stream, {launch}, prepare, opt)[0];
}

LaunchTimer::LaunchTimer() {
  current_context();  // events belong to a context: the launch's (made current if none is)
  const Driver& d = driver();
  check(d.cuEventCreate(&start_, cu::CU_EVENT_DEFAULT), "cuEventCreate");
  if (cu::CUresult r = d.cuEventCreate(&stop_, cu::CU_EVENT_DEFAULT); r != cu::CUDA_SUCCESS) {
    d.cuEventDestroy(start_);
    check(r, "cuEventCreate");
  }
}

LaunchTimer::~LaunchTimer() {
  std::string why;
  if (!driver_available(&why)) return;
  driver().cuEventDestroy(start_);
  driver().cuEventDestroy(stop_);
}

namespace {
thread_local LaunchTimer* t_armed = nullptr;  // this thread's, until its next launch takes it
}  // namespace

std::atomic<int> LaunchTimer::armed_{0};

void LaunchTimer::arm() noexcept {
  if (t_armed == this) return;
  if (!t_armed) armed_.fetch_add(1, std::memory_order_relaxed);
  t_armed = this;
}

void LaunchTimer::disarm() noexcept {
  done_ = true;
  if (t_armed != this) return;
  t_armed = nullptr;
  armed_.fetch_sub(1, std::memory_order_relaxed);
}

LaunchTimer* LaunchTimer::take_armed_slow() noexcept {
  LaunchTimer* t = t_armed;
  if (t) {
    t_armed = nullptr;
    armed_.fetch_sub(1, std::memory_order_relaxed);
  }
  return t;
}

void LaunchTimer::start(cu::CUstream stream) {
  if (reserve_l2_flush()) flush_l2(stream);  // a device with no memory for it: timed without
  check(driver().cuEventRecord(start_, stream), "cuEventRecord");
}

void LaunchTimer::stop(cu::CUstream stream) {
  check(driver().cuEventRecord(stop_, stream), "cuEventRecord");
  stopped_ = true;
}

float LaunchTimer::elapsed_ms() const {
  if (!stopped_ || !failure_.empty()) return -1;
  // Queried first: NOT_READY is cuEventQuery's answer by design, while from cuEventElapsedTime it
  // is an API error that compute-sanitizer reports.
  cu::CUresult r = driver().cuEventQuery(stop_);
  if (r == cu::CUDA_ERROR_NOT_READY) return -1;  // the GPU has not passed it yet
  check(r, "cuEventQuery");
  float ms = 0;
  check(driver().cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
  return ms;
}

void LaunchTimer::fail(std::string why) { failure_ = std::move(why); }

size_t allocation_extent(cu::CUdeviceptr ptr) {
  cu::CUdeviceptr base = 0;
  size_t size = 0;
  check(driver().cuMemGetAddressRange(&base, &size, ptr), "cuMemGetAddressRange (is this a device pointer?)");
  return size_t(base + size - ptr);
}

Snapshot::Snapshot(cu::CUstream stream, std::vector<DeviceBuffer> buffers) : stream_(stream) {
  const Driver& d = driver();
  size_t total = 0;
  for (auto& b : buffers) {
    if (b.bytes == 0) b.bytes = allocation_extent(b.ptr);
    total += b.bytes;
  }
  size_t free_b = 0, total_b = 0;
  check(d.cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
  bool on_device = free_b > total + kDeviceHeadroom;
  try {
    for (const auto& b : buffers) {
      Copy c{b};
      if (on_device && d.cuMemAlloc(&c.dev, b.bytes) == cu::CUDA_SUCCESS) {
        check(d.cuMemcpyDtoDAsync(c.dev, b.ptr, b.bytes, stream), "snapshot cuMemcpyDtoDAsync");
        device_bytes_ += b.bytes;
      } else {
        c.dev = 0;
        check(d.cuMemAllocHost(&c.host, b.bytes), "snapshot cuMemAllocHost");
        check(d.cuMemcpyDtoHAsync(c.host, b.ptr, b.bytes, stream), "snapshot cuMemcpyDtoHAsync");
        host_bytes_ += b.bytes;
      }
      copies_.push_back(c);
    }
  } catch (...) {
    release();
    throw;
  }
}

Snapshot::~Snapshot() { release(); }

void Snapshot::release() {
  const Driver& d = driver();
  // Restores may still be queued: the copies must outlive them.
  d.cuStreamSynchronize(stream_);
  for (auto& c : copies_) {
    if (c.dev) d.cuMemFree(c.dev);
    if (c.host) d.cuMemFreeHost(c.host);
  }
  copies_.clear();
}

void Snapshot::restore(cu::CUstream stream) const {
  const Driver& d = driver();
  for (const auto& c : copies_) {
    if (c.dev)
      check(d.cuMemcpyDtoDAsync(c.src.ptr, c.dev, c.src.bytes, stream), "restore cuMemcpyDtoDAsync");
    else
      check(d.cuMemcpyHtoDAsync(c.src.ptr, c.host, c.src.bytes, stream), "restore cuMemcpyHtoDAsync");
  }
}

void zero_buffer(cu::CUstream stream, DeviceBuffer buf) {
  if (buf.bytes == 0) buf.bytes = allocation_extent(buf.ptr);
  check(driver().cuMemsetD8Async(buf.ptr, 0, buf.bytes, stream), "cuMemsetD8Async");
}

namespace {

std::pair<cu::CUdeviceptr, size_t> flush_buffer() {
  static std::mutex mu;
  static std::map<cu::CUcontext, std::pair<cu::CUdeviceptr, size_t>> buffers;
  cu::CUcontext ctx = current_context();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = buffers[ctx];
  if (!slot.first) {
    // Twice the L2 (at least 64 MiB) evicts it surely; the L2's own size is
    // enough to overwrite it. A device with no memory to spare gets neither:
    // not kept, so a later tuning tries again.
    const size_t l2 = size_t(device_info(context_device(ctx)).l2_bytes);
    for (size_t bytes : {std::max<size_t>(2 * l2, 64u << 20), 2 * l2, l2}) {
      if (bytes == 0) continue;
      cu::CUresult r = driver().cuMemAlloc(&slot.first, bytes);
      if (r == cu::CUDA_SUCCESS) {
        slot.second = bytes;
        break;
      }
      slot.first = 0;
      if (r != cu::CUDA_ERROR_OUT_OF_MEMORY) check(r, "L2 flush cuMemAlloc");
    }
  }
  return slot;
}

}  // namespace

size_t reserve_l2_flush() { return flush_buffer().second; }

void flush_l2(cu::CUstream stream) {
  auto buf = flush_buffer();
  if (!buf.first) throw Error("L2 flush: no device memory for its buffer (CUDA_ERROR_OUT_OF_MEMORY)");
  check(driver().cuMemsetD32Async(buf.first, 0xdeadbeef, buf.second / 4, stream), "L2 flush cuMemsetD32Async");
}

}  // namespace lt
