// lazytriton's XLA FFI handler: the JAX face of the C++ core.
//
// instantiate: once per call site, reads the attributes (no buffers, no
//   stream) into a CallSite shared by every executable with the same site.
// execute: a resolved site launches straight from C++ (capturable: no Python,
//   no allocation, no host sync). An unresolved one calls back into Python,
//   which tunes on these very buffers, in stream order after their producers;
//   under graph capture Python is told so and never benchmarks.
//
// Built on first use against the installed jaxlib's FFI headers (see
// lazytriton/jax/ffi.py); the launch path is liblazytriton's.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lazytriton/call_site.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct SiteState {
  static ffi::TypeId id;
  std::shared_ptr<lt::CallSite> site;
  std::string payload;
  std::vector<int64_t> aliases;  // input, output, input, output, ...
  // Scratch of this instruction's launches (kernels with global scratch, e.g.
  // device-side TMA descriptors). Per instruction, not per site: two
  // instructions of one command buffer may run concurrently. Freed with the
  // executable, which also frees any graph recorded from it.
  lt::ScratchArena scratch;
};
ffi::TypeId SiteState::id = {};

// Python's resolver: (payload, buffers, stream, device, capturing) ->
// address of a new std::shared_ptr<const lt::Entry> (lazytriton.jax.ffi).
PyObject* g_resolver = nullptr;

// Sites with the same payload share their resolved launches: a second
// executable (re-jit, a new process section) never needs Python again.
std::mutex g_sites_mu;
std::map<std::string, std::shared_ptr<lt::CallSite>> g_sites;
std::atomic<uint64_t> g_executes{0};  // replayed command buffers do not call execute
std::atomic<uint64_t> g_alias_copies{0};

struct CallContext {
  const SiteState* state;
  const uint64_t* buffers;
  const uint64_t* sizes;
  size_t n;
  lt::cu::CUstream stream;
  int device;
};

std::string python_error() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string msg = "Python error";
  if (value) {
    PyObject* s = PyObject_Str(value);
    const char* c = s ? PyUnicode_AsUTF8(s) : nullptr;
    if (c) msg = std::string(Py_TYPE(value)->tp_name) + ": " + c;
    Py_XDECREF(s);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return msg;
}

std::shared_ptr<const lt::Entry> resolve_in_python(const CallContext& c) {
  if (!Py_IsInitialized() || !g_resolver) throw lt::Error("lazytriton's JAX resolver is not registered");
  bool capturing = lt::stream_is_capturing(c.stream);
  lt::ContextGuard guard(lt::primary_context(c.device));  // Python's work runs on this device
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* bufs = PyTuple_New(Py_ssize_t(c.n));
  for (size_t i = 0; bufs && i < c.n; ++i)
    PyTuple_SET_ITEM(bufs, i, Py_BuildValue("(KK)", (unsigned long long)c.buffers[i], (unsigned long long)c.sizes[i]));
  PyObject* r = bufs ? PyObject_CallFunction(g_resolver, "s#OKiO", c.state->payload.data(),
                                             Py_ssize_t(c.state->payload.size()), bufs,
                                             (unsigned long long)(uintptr_t)c.stream, c.device,
                                             capturing ? Py_True : Py_False)
                     : nullptr;
  Py_XDECREF(bufs);
  void* addr = r ? PyLong_AsVoidPtr(r) : nullptr;
  Py_XDECREF(r);
  if (!addr || PyErr_Occurred()) {
    std::string msg = python_error();
    PyGILState_Release(gil);
    throw lt::Error(msg);
  }
  PyGILState_Release(gil);
  auto* owned = static_cast<std::shared_ptr<const lt::Entry>*>(addr);
  std::shared_ptr<const lt::Entry> entry = std::move(*owned);
  delete owned;
  return entry;
}

// cost_estimate_json is for XLA and profilers (jax-triton's attribute), not read here.
ffi::ErrorOr<std::unique_ptr<SiteState>> Instantiate(std::string_view payload, ffi::Span<const int64_t> aliases,
                                                     int64_t n_buffers, std::string_view /*cost_estimate_json*/) {
  auto state = std::make_unique<SiteState>();
  state->payload = std::string(payload);
  // aliases: [count, input, output, input, output, ...] (never empty: an
  // empty array attribute has no element type).
  if (aliases.size() < 1 || aliases.size() != size_t(1 + 2 * aliases[0]))
    return ffi::Unexpected<ffi::Error>(ffi::Error::InvalidArgument("lazytriton: malformed aliases attribute"));
  state->aliases.assign(aliases.begin() + 1, aliases.end());
  std::lock_guard<std::mutex> lock(g_sites_mu);
  auto& site = g_sites[state->payload];
  if (!site) {
    site = std::make_shared<lt::CallSite>("lazytriton site", size_t(n_buffers), [](const lt::CallKey&, void* ctx) {
      return resolve_in_python(*static_cast<const CallContext*>(ctx));
    });
  }
  state->site = site;
  return state;
}

// Declared input/output aliases that XLA did not actually share: the output
// must start as a copy of the input (the kernel may write only part of it).
void copy_unshared_aliases(const SiteState& s, const uint64_t* bufs, const uint64_t* sizes, size_t n_in,
                           lt::cu::CUstream stream) {
  for (size_t i = 0; i + 1 < s.aliases.size(); i += 2) {
    size_t in = size_t(s.aliases[i]), out = n_in + size_t(s.aliases[i + 1]);
    if (bufs[in] != bufs[out] && sizes[out]) {
      lt::check(lt::driver().cuMemcpyDtoDAsync(bufs[out], bufs[in], std::min(sizes[in], sizes[out]), stream),
                "lazytriton: copying an unshared alias (cuMemcpyDtoDAsync)");
      g_alias_copies.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

ffi::Error Execute(lt::cu::CUstream stream, int32_t device, SiteState* state, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  constexpr size_t kMax = 512;
  size_t n_in = args.size(), n = n_in + rets.size();
  if (n > kMax) return ffi::Error::InvalidArgument("lazytriton: more than 512 buffers");
  uint64_t bufs[kMax], sizes[kMax];
  for (size_t i = 0; i < n_in; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    bufs[i] = reinterpret_cast<uint64_t>(b->untyped_data());
    sizes[i] = b->size_bytes();
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto b = rets.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    bufs[n_in + i] = reinterpret_cast<uint64_t>((*b)->untyped_data());
    sizes[n_in + i] = (*b)->size_bytes();
  }
  try {
    lt::cu::CUcontext ctx = lt::primary_context(device);
    copy_unshared_aliases(*state, bufs, sizes, n_in, stream);
    g_executes.fetch_add(1, std::memory_order_relaxed);
    CallContext c{state, bufs, sizes, n, stream, device};
    state->site->launch(ctx, stream, bufs, &c, &state->scratch);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(lt_instantiate, Instantiate,
                       ffi::Ffi::BindInstantiate()
                           .Attr<std::string_view>("payload")
                           .Attr<ffi::Span<const int64_t>>("aliases")
                           .Attr<int64_t>("n_buffers")
                           .Attr<std::string_view>("cost_estimate_json"));

XLA_FFI_DEFINE_HANDLER(lt_execute, Execute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<lt::cu::CUstream>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Ctx<ffi::State<SiteState>>()
                           .RemainingArgs()
                           .RemainingRets(),
                       {ffi::Traits::kCmdBufferCompatible});

namespace {
constexpr XLA_FFI_TypeInfo kStateInfo = {XLA_FFI_TypeInfo_STRUCT_SIZE, nullptr,
                                         [](void* p) { delete static_cast<SiteState*>(p); }};

PyObject* capsule(void* p) { return PyCapsule_New(p, nullptr, nullptr); }

// handlers() -> {"instantiate": capsule, "execute": capsule}
PyObject* handlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsN}", "instantiate", capsule(reinterpret_cast<void*>(lt_instantiate)), "execute",
                       capsule(reinterpret_cast<void*>(lt_execute)));
}

// state_type() -> {"type_id": capsule, "type_info": capsule}
PyObject* state_type(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsN}", "type_id", capsule(&SiteState::id), "type_info",
                       capsule(const_cast<XLA_FFI_TypeInfo*>(&kStateInfo)));
}

PyObject* set_resolver(PyObject*, PyObject* fn) {
  Py_XINCREF(fn);
  PyObject* old = g_resolver;
  g_resolver = fn;
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

PyObject* site_count(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> lock(g_sites_mu);
  size_t resolved = 0;
  for (auto& [_, s] : g_sites) resolved += s->table().size();
  return Py_BuildValue("(nnKK)", Py_ssize_t(g_sites.size()), Py_ssize_t(resolved),
                       (unsigned long long)g_executes.load(), (unsigned long long)g_alias_copies.load());
}

PyMethodDef kMethods[] = {
    {"handlers", handlers, METH_NOARGS, "The FFI stage handlers, as PyCapsules."},
    {"state_type", state_type, METH_NOARGS, "The per-site state type, for jax.ffi.register_ffi_type."},
    {"set_resolver", set_resolver, METH_O, "The Python callable that resolves an unresolved site."},
    {"site_count", site_count, METH_NOARGS, "(call sites seen, resolved launches, executions of the handler, unshared aliases copied)."},
    {nullptr, nullptr, 0, nullptr}};
}  // namespace

#ifndef LT_MODULE_NAME
#define LT_MODULE_NAME lt_jax_ffi
#endif
#define LT_CAT(a, b) a##b
#define LT_INIT(name) LT_CAT(PyInit_, name)
#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)

static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, LT_STR(LT_MODULE_NAME), "lazytriton XLA FFI handler", -1,
                              kMethods};

PyMODINIT_FUNC LT_INIT(LT_MODULE_NAME)() { return PyModule_Create(&kModule); }
