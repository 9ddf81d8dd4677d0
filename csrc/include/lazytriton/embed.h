// Lazy mode for C++ programs (link lazytriton::embed). A kernel, or a
// specialization of one, that the bundle lacks is compiled and tuned on its
// first call, on that call's own device buffers, through an embedded Python
// interpreter running lazytriton exactly as the Python path does; the winner
// is persisted into the bundle (and lazytriton's cache), so the next run
// launches it with no Python at all. Python starts only on the first miss.
//
//   lt::Bundle bundle = lt::Bundle::open(dir);
//   lt::enable_lazy(bundle, {{"/path/to/kernel/modules"}});
//   auto k = bundle.kernel("my_kernels:add_kernel", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 1024}});
//
// Errors (a Python exception while compiling or tuning, a missing module)
// arrive as lt::Error naming the kernel.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lazytriton/bundle.h"

namespace lt {

struct LazyOptions {
  // Prepended to sys.path: where the kernels' Python modules live.
  std::vector<std::string> python_path;
  // The Python to run as (its venv and site-packages are used). Default:
  // $LAZYTRITON_PYTHON, else the Python lazytriton was built for.
  std::string python_executable;
  // Log what is compiled, tuned and won (Python's "lazytriton" logger, stderr).
  bool verbose = false;
};

// Turns lazy mode on for `bundle` (and every kernel handle of it).
void enable_lazy(const Bundle& bundle, LazyOptions options = {});

struct LazyStats {
  bool python_started = false;  // this library started the interpreter
  uint64_t describes = 0;  // kernels described through Python (not in the bundle)
  uint64_t resolutions = 0;  // winners compiled/tuned (or found in the cache) through Python
};
LazyStats lazy_stats();

}  // namespace lt
