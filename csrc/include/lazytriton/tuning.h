// Autotuning on the caller's real buffers: event timing on the caller's
// stream, and snapshots that make every trial start from the original data.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "lazytriton/driver.h"

namespace lt {

struct BenchOptions {
  int warmup = 2;           // untimed launches first (module load, caches)
  double target_ms = 25.0;  // timed budget per candidate; sets the repetitions
  int min_reps = 5;
  int max_reps = 100;
  bool flush_l2 = false;  // overwrite the L2 cache before every timed launch
};

struct BenchResult {
  float median_ms = 0, min_ms = 0;
  int reps = 0;
};

// Times `launch` with CUDA events on `stream` (median of adaptive
// repetitions). `prepare` is enqueued, untimed, before every launch.
BenchResult bench(cu::CUstream stream, const std::function<void()>& launch,
                  const std::function<void()>& prepare, const BenchOptions& opt);

// Times several launches against each other: their timed launches alternate
// one by one (forward, then backward), so that clock and power drift (a GPU
// at its power cap moves its clocks by 10-20%) hit them alike. Every launch
// gets the same number of repetitions: the budget over their mean estimate.
std::vector<BenchResult> bench_interleaved(cu::CUstream stream, const std::vector<std::function<void()>>& launches,
                                           const std::function<void()>& prepare, const BenchOptions& opt);

// One launch timed with two CUDA events on its own stream: online tuning times a candidate on a
// call of the program itself (lazytriton/runtime/online.py). The caller arms it on its thread and
// makes the launch; Kernel::launch takes it and records the events right around cuLaunchKernelEx,
// after a write of the L2-flush buffer (as the tuner's trials), which also keeps the GPU busy while
// the launch is enqueued: the events time the kernel, not the host's launch latency. Nothing waits
// for it: elapsed_ms() answers once the GPU has passed the second event, and before that says so.
class LaunchTimer {
 public:
  LaunchTimer();  // its events, in the current context
  ~LaunchTimer();
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;

  // True for the first caller only: the launch that records this timer's events. A second
  // launch of the same one-call entry (a thread that waited for its resolution) goes untimed.
  bool take() noexcept { return !taken_.exchange(true); }
  // The next launch of this thread is timed by it (until disarm(): the call is over).
  void arm() noexcept;
  void disarm() noexcept;
  // Milliseconds from start to stop; -1 while the GPU has not reached stop, or if the launch
  // between them never happened (failed, or the timer was not used). Never blocks.
  float elapsed_ms() const;
  bool launched() const { return stopped_; }  // a launch was timed by it
  bool done() const { return done_; }         // the call that armed it is over (launched or not)
  // A launch between start and stop that failed: its error (the candidate is dropped).
  void fail(std::string why);
  const std::string& failure() const { return failure_; }

  // Kernel::launch: the timer armed on this thread, taken (none: one relaxed load).
  static LaunchTimer* take_armed() noexcept {
    return armed_.load(std::memory_order_relaxed) ? take_armed_slow() : nullptr;
  }
  void start(cu::CUstream stream);  // flush L2, record the first event
  void stop(cu::CUstream stream);   // record the second

 private:
  static LaunchTimer* take_armed_slow() noexcept;
  static std::atomic<int> armed_;  // timers armed on any thread
  cu::CUevent start_ = nullptr, stop_ = nullptr;
  std::atomic<bool> taken_{false};
  bool stopped_ = false, done_ = false;
  std::string failure_;
};

struct DeviceBuffer {
  cu::CUdeviceptr ptr = 0;
  size_t bytes = 0;  // 0: up to the end of the allocation containing ptr
};

// Bytes from `ptr` to the end of its allocation.
size_t allocation_extent(cu::CUdeviceptr ptr);

// A saved copy of buffers, kept on the device when memory allows, else in
// pinned host memory. Saving and restoring are stream-ordered.
class Snapshot {
 public:
  Snapshot(cu::CUstream stream, std::vector<DeviceBuffer> buffers);
  ~Snapshot();
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  void restore(cu::CUstream stream) const;
  size_t device_bytes() const { return device_bytes_; }
  size_t host_bytes() const { return host_bytes_; }

 private:
  void release();
  struct Copy {
    DeviceBuffer src;
    cu::CUdeviceptr dev = 0;
    void* host = nullptr;
  };
  cu::CUstream stream_;
  std::vector<Copy> copies_;
  size_t device_bytes_ = 0, host_bytes_ = 0;
};

void zero_buffer(cu::CUstream stream, DeviceBuffer buf);

// Overwrites the current device's L2 cache (stream-ordered).
void flush_l2(cu::CUstream stream);

// Allocates the current context's L2-flush buffer if needed; its size in
// bytes (smaller than planned where memory is short), 0 where the device has
// no memory for one (the tuner then times without flushing).
size_t reserve_l2_flush();

}  // namespace lt
