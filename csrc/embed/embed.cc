// Lazy mode: the bundle's Resolver, answered by lazytriton.cpp.embed in an
// embedded Python. Python decides (compiles, tunes, persists); the winner comes
// back as a bundle variant and is launched by the C++ core like any other (tuning
// online: each call's candidate, with the timer its launch records, until the winner).
#include "lazytriton/embed.h"

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "../python/seam.h"
#include "lazytriton/tuning.h"

namespace py = pybind11;

namespace lt {
namespace {

std::atomic<bool> g_started{false};
std::atomic<uint64_t> g_describes{0}, g_resolutions{0};
std::mutex g_start_mu;

std::string python_executable(const LazyOptions& o) {
  if (!o.python_executable.empty()) return o.python_executable;
  const char* env = std::getenv("LAZYTRITON_PYTHON");
  return env && *env ? env : LT_PYTHON_EXECUTABLE;
}

// Starts the interpreter once, as `exe` would start (so its venv's
// site-packages are on sys.path), then releases the GIL for any thread to take.
void start_python(const std::string& exe) {
  std::lock_guard<std::mutex> lock(g_start_mu);
  if (Py_IsInitialized()) return;  // already running (e.g. the host is Python)
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;  // the host program keeps its signal handlers
  config.parse_argv = 0;
  PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, exe.c_str());
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st))
    throw Error("lazy mode: Python (" + exe + ") failed to start: " + (st.err_msg ? st.err_msg : "unknown error"));
  g_started = true;
  PyEval_SaveThread();  // the interpreter lives until exit; it is never finalized
}

std::string python_error(py::error_already_set& e) {
  std::string type = py::str(e.type().attr("__name__"));
  std::string msg = py::str(e.value());
  return type + ": " + msg;
}

// Errors from Python mostly name the kernel already; add it where they do not.
[[noreturn]] void rethrow(py::error_already_set& e, const std::string& source) {
  std::string msg = python_error(e);
  std::string name = source.substr(source.find(':') + 1);
  if (msg.find("kernel " + name) == std::string::npos) msg = "kernel " + name + " (lazy mode): " + msg;
  throw Error(msg);
}

py::object constant_to_python(const Constant& c) {
  switch (c.type()) {
    case Constant::kNone: return py::none();
    case Constant::kBool: return py::bool_(c.as_int() != 0);
    case Constant::kInt: return py::int_(c.as_int());
    case Constant::kFloat: return py::float_(c.as_float());
    case Constant::kString: return py::str(c.as_string());
  }
  return py::none();
}

// A runtime argument as lazytriton.cpp.embed.resolve reads it.
py::object value_to_python(const CallValue& v) {
  if (v.is_constexpr) return constant_to_python(v.constant);
  if (v.is_desc) {  // ("desc", base, dtype, nbytes or 0, shape, strides, block, padding, round_f32_to_tf32)
    const HostTensorDesc& d = v.desc;
    auto ints = [&](const int64_t* p) { return std::vector<int64_t>(p, p + d.rank); };
    return py::make_tuple("desc", d.base, dtype_name(d.dtype), v.ptr.nbytes, ints(d.shape), ints(d.strides),
                          ints(d.block), d.nan_padding ? "nan" : "zero", d.tf32);
  }
  if (v.is_pointer) return py::make_tuple("ptr", v.ptr.addr, v.type.substr(1), v.ptr.nbytes);
  const Arg& a = v.value;
  switch (a.kind()) {
    case Arg::kInteger: return a.big() ? py::int_(a.bits()) : py::int_(a.integer());
    case Arg::kFloat: return py::float_(a.real());
    case Arg::kBool: return py::bool_(a.bits() != 0);
    default: return py::none();
  }
}

// The caller's grid as a Python callable of Triton's meta dict (the tuner
// calls it per candidate config). Runtime arguments are left out of the Meta,
// as on the C++ path.
py::object grid_to_python(const ResolveRequest& r) {
  if (!r.grid) return py::none();
  const GridFn* fn = &r.grid;
  std::vector<std::string> runtime;
  for (const auto& v : r.values)
    if (!v.is_constexpr) runtime.push_back(v.name);
  std::string kernel = r.source.substr(r.source.find(':') + 1);
  return py::cpp_function([fn, runtime, kernel](py::dict meta) {
    Constants items;
    for (auto [k, v] : meta) {
      std::string name = py::str(k);
      if (std::find(runtime.begin(), runtime.end(), name) != runtime.end()) continue;
      if (v.is_none()) items.emplace_back(name, Constant());
      else if (py::isinstance<py::bool_>(v)) items.emplace_back(name, Constant(v.cast<bool>()));
      else if (py::isinstance<py::int_>(v)) items.emplace_back(name, Constant(v.cast<int64_t>()));
      else if (py::isinstance<py::float_>(v)) items.emplace_back(name, Constant(v.cast<double>()));
      else if (py::isinstance<py::str>(v)) items.emplace_back(name, Constant(v.cast<std::string>()));
    }
    Dim3 g = (*fn)(Meta(kernel, std::move(items)));
    return py::make_tuple(g.x, g.y, g.z);
  });
}

class PythonResolver : public Resolver {
 public:
  explicit PythonResolver(LazyOptions o) : opts_(std::move(o)) {}

  std::string describe(const std::string& source) override {
    return in_python(source, [&] {
      auto out = module().attr(seam::kEmbedDescribe)(source).cast<std::string>();
      ++g_describes;
      return out;
    });
  }

  std::string slot_table(const std::string& source, const std::vector<std::string>& types,
                         const std::vector<std::string>& layouts) override {
    return in_python(source, [&] {
      bool tuples = std::any_of(layouts.begin(), layouts.end(), [](const auto& l) { return !l.empty(); });
      return module()
          .attr(seam::kEmbedSlotTable)(source, py::cast(types), tuples ? py::cast(layouts) : py::none())
          .cast<std::string>();
    });
  }

  ResolvedVariant resolve(const ResolveRequest& r) override {
    return in_python(r.source, [&] {
      py::list values;
      for (const auto& v : r.values) values.append(value_to_python(v));
      py::dict options;
      for (const auto& [k, c] : r.options) options[py::str(k)] = constant_to_python(c);
      auto stream = reinterpret_cast<uint64_t>(r.stream);
      py::object layouts = py::none();  // tuple arguments: how their elements in `values` nest
      if (!r.layouts.empty()) layouts = py::cast(r.layouts);
      py::tuple out =
          module().attr(seam::kEmbedResolve)(r.bundle_dir, r.source, values, options, grid_to_python(r), stream, layouts);
      ++g_resolutions;
      ResolvedVariant got{out[0].cast<std::string>(), out[1].cast<std::string>(), out[3].cast<bool>(), nullptr};
      // _core's LaunchTimer: one pybind11 type across _core and this library (the same build).
      if (!out[2].is_none()) got.timer = out[2].cast<std::shared_ptr<LaunchTimer>>();
      return got;
    });
  }

 private:
  // f() in the started interpreter, the GIL held: Python's exceptions and pybind11's conversion
  // failures become lt::Error naming the kernel (`source`).
  template <class F>
  auto in_python(const std::string& source, F&& f) -> decltype(f()) {
    start_python(python_executable(opts_));
    py::gil_scoped_acquire gil;
    try {
      return f();
    } catch (py::error_already_set& e) {
      rethrow(e, source);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // a pybind11 conversion failure
      throw Error("kernel " + source + " (lazy mode): " + e.what());
    }
  }

  // lazytriton.cpp.embed, set up once (sys.path, logging); the reference is kept
  // for the life of the process, like the interpreter.
  py::object module() {
    PyObject* m = mod_.load();
    if (!m) {
      py::module_ mod = py::module_::import(seam::kEmbedModule);
      mod.attr(seam::kEmbedStart)(opts_.python_path, opts_.verbose);
      PyObject* expected = nullptr;
      m = mod.release().ptr();
      if (!mod_.compare_exchange_strong(expected, m)) {  // another thread won
        Py_DECREF(m);
        m = expected;
      }
    }
    return py::reinterpret_borrow<py::object>(m);
  }

  LazyOptions opts_;
  std::atomic<PyObject*> mod_{nullptr};
};

}  // namespace

void enable_lazy(const Bundle& bundle, LazyOptions options) {
  bundle.set_resolver(std::make_shared<PythonResolver>(std::move(options)));
}

LazyStats lazy_stats() {
  LazyStats s;
  s.python_started = g_started.load();
  s.describes = g_describes.load();
  s.resolutions = g_resolutions.load();
  return s;
}

}  // namespace lt
