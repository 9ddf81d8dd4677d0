// lazytriton._core: the Python face of the C++ runtime. Python decides (what
// to compile, which config wins); this module loads and launches, and
// timing_bindings.cc times (core_module.h holds what the two share).
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "core_module.h"
#include "slot_table.h"
#include "lazytriton/bundle.h"
#include "lazytriton/call_site.h"

using namespace lt;
using namespace lt::bindings;
void bind_launcher(py::module_& m);  // launch_base.cc: _core.LaunchBase, _core.Launch (the k[grid](...) hot path)

namespace {

// A key's resolution handed to Python by ResolveTable.claim: Python compiles
// and tunes, then publish(entry); `with claim:` ends it with the exception
// that leaves the block (or, should the block end without publishing, with an
// error saying so), so that no caller waiting for the key is left waiting.
struct Claim {
  std::shared_ptr<ResolveTable> table;
  CallKey key;
  bool open = true;

  Claim(std::shared_ptr<ResolveTable> t, CallKey k) : table(std::move(t)), key(std::move(k)) {}
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;
  ~Claim() { end(std::make_exception_ptr(Error("kernel " + table->name() + ": a resolution was abandoned"))); }

  void end(std::exception_ptr error) {
    if (std::exchange(open, false)) table->fail(key, std::move(error));
  }
};


// Launch metadata from Python (Triton's, or a Kernel's .metadata) as JSON, decoded by the
// one reader bundles use too (kernel.h launch_meta_from_json).
std::string meta_json(const py::dict& d) {
  return py::module_::import("json").attr("dumps")(d, py::arg("default") = py::module_::import("builtins").attr("str"))
      .cast<std::string>();
}

LaunchMeta meta_from(const py::dict& d) { return launch_meta_from_json(meta_json(d)); }

py::dict tma_meta_to_dict(const TmaMeta& t) {
  py::dict d;
  d["swizzle"] = t.swizzle;
  d["elem_size"] = t.elem_size;
  d["elem_type"] = t.elem_type;
  d["block_size"] = std::vector<uint32_t>(t.block, t.block + t.rank);
  d["fp4_padded"] = t.fp4_padded;
  d["is_im2col"] = t.im2col;
  return d;
}

py::dict meta_to_dict(const LaunchMeta& m) {
  py::dict d;
  d["name"] = m.name;
  LaunchMeta::each_field(m, [&](const char* name, const auto& v) { d[name] = v; });
  d["cluster_dims"] = py::make_tuple(m.cluster[0], m.cluster[1], m.cluster[2]);
  d["arch"] = m.arch;
  if (!m.gfx.empty()) d["gfx"] = m.gfx;
  d["warp_size"] = m.warp_size;
  py::list descs;
  for (const TmaMeta& t : m.tensordesc) descs.append(tma_meta_to_dict(t));
  d["tensordesc_meta"] = descs;
  d["lt_tensordesc_abi"] = m.tensordesc_abi;
  return d;
}

std::shared_ptr<void> hold(py::object obj) {
  if (obj.is_none()) return nullptr;
  return std::shared_ptr<void>(obj.release().ptr(), [](void* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: nothing to release
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  });
}

}  // namespace

// A descriptor argument as Python hands it over (lazytriton.model.tensor_desc.DescInfo.as_tuple):
// (base, dtype id, shape, strides, block_shape, nan padding, round_f32_to_tf32[, argument name]).
HostTensorDesc lt::bindings::host_desc_from(py::handle h, std::string* name) {
  auto t = h.cast<py::tuple>();
  if (t.size() != 7 && t.size() != 8)
    throw py::value_error("a tensor descriptor argument is (base, dtype, shape, strides, block, nan, tf32[, name])");
  if (name && t.size() == 8) *name = t[7].cast<std::string>();
  HostTensorDesc d;
  d.base = t[0].cast<uint64_t>();
  d.dtype = t[1].cast<int>();
  auto shape = t[2].cast<std::vector<int64_t>>(), strides = t[3].cast<std::vector<int64_t>>(),
       block = t[4].cast<std::vector<int64_t>>();
  if (shape.empty() || shape.size() > size_t(kMaxDescRank) || strides.size() != shape.size() ||
      block.size() != shape.size())
    throw py::value_error("a tensor descriptor has 1 to 5 dimensions, with as many strides and block dimensions");
  d.rank = int(shape.size());
  for (int i = 0; i < d.rank; ++i) d.shape[i] = shape[size_t(i)], d.strides[i] = strides[size_t(i)], d.block[i] = block[size_t(i)];
  d.nan_padding = t[5].cast<bool>();
  d.tf32 = t[6].cast<bool>();
  return d;
}

PYBIND11_MODULE(_core, m) {
  m.doc() = "lazytriton C++ runtime core";
  py::register_exception<Error>(m, "RuntimeFailure", PyExc_RuntimeError);
  bind_launcher(m);

  // The process's readers built at run time (array_reads.h Readers), shared with the stubs.
  static pyargs::Readers readers;
  m.attr("_readers") = py::reinterpret_steal<py::object>(
      PyCapsule_New(&readers, pyargs::kReadersCapsule, nullptr));
  m.def(
      "set_torch_reader",
      [](py::object capsule) {
        if (capsule.is_none()) {
          readers.torch = nullptr;
          return;
        }
        void* fn = PyCapsule_GetPointer(capsule.ptr(), pyargs::kTorchReaderCapsule);
        if (!fn) throw py::error_already_set();
        readers.torch = reinterpret_cast<pyargs::TorchRead>(fn);
      },
      "Install the torch tensor reader (the capsule of lazytriton.runtime.torch_reader's module), or None.");
  m.def("torch_reader_installed", [] { return readers.torch != nullptr; });

  m.def("driver_status", [] {
    std::string why;
    bool ok = driver_available(&why);
    return py::make_tuple(ok, why);
  });
  m.def("device_count", &device_count);
  m.def("current_device", [] { return context_device(current_context()); },
        "Ordinal of the calling thread's current device (making device 0's primary context current if none is).");
  m.def("pointer_device", [](uint64_t ptr) { return pointer_device(ptr); },
        "The device ordinal of the memory at this address, or -1 when the driver does not tell.");
  m.def("pointer_accessible", [](uint64_t ptr) { return ptr == 0 || pointer_accessible(ptr); },
        "Whether a kernel launched on the current device may read this address (Triton's launcher check).");
  m.def("device_info", [](int dev) {
    const DeviceInfo& i = device_info(dev);
    py::dict d;
    d["ordinal"] = i.ordinal;
    d["name"] = i.name;
    d["capability"] = py::make_tuple(i.cc_major, i.cc_minor);
    d["sm_count"] = i.sm_count;
    d["max_threads_per_block"] = i.max_threads_per_block;
    d["max_shared_optin"] = i.max_shared_optin;
    d["l2_bytes"] = i.l2_bytes;
    d["cooperative"] = i.cooperative;
    d["cluster_launch"] = i.cluster_launch;
    d["driver_version"] = i.driver_version;
    d["backend"] = i.hip ? "hip" : "cuda";
    d["arch"] = i.arch;
    d["warp_size"] = i.warp_size;
    return d;
  });
  m.def("synchronize", [](uint64_t stream) {
    without_gil([&] { check(driver().cuStreamSynchronize(as_stream(stream)), "cuStreamSynchronize"); });
  });
  m.def("is_capturing", [](uint64_t stream) { return stream_is_capturing(as_stream(stream)); });
  m.def(
      "exchange_capture_mode",
      [](int mode) {
        check(driver().cuThreadExchangeStreamCaptureMode(&mode), "cuThreadExchangeStreamCaptureMode");
        return mode;
      },
      "Sets this thread's stream capture mode (CUstreamCaptureMode); returns the previous one.");
  m.attr("CAPTURE_MODE_RELAXED") = cu::CU_STREAM_CAPTURE_MODE_RELAXED;
  // A scalar argument as its kernel parameter's bytes (little-endian, in a u64): the JAX handler's
  // scalars (ParamSource.bits), read by the stubs' own reader from the call's slot table row.
  m.def(
      "slot_bits",
      [](py::handle value, const std::vector<int>& row, const std::string& what) {
        const std::string w = what.empty() ? "argument" : what;
        if (row.size() != size_t(kSlotRowFields)) throw py::value_error(w + ": a slot table row has 8 fields");
        if (const char* why = slot_row_error(row[0], row[1], row[2], row[3], row[7]))
          throw py::value_error(w + ": a slot table row: " + why);
        const SlotSpec s = slot_spec(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]);
        // Any kind read into one parameter cell (a new kind's too): not a buffer, not a constexpr.
        if (s.kind == SlotKind::kPtr || s.kind == SlotKind::kDesc || is_constexpr_slot(s))
          throw py::value_error(w + ": not a scalar's row (kind " + std::to_string(row[0]) + ")");
        uint64_t cell = 0, key[2] = {0, 0};
        size_t vw = 1;
        int devices = pyargs::kNoArrays;
        HostTensorDesc desc;
        if (!pyargs::read_slot(s, value.ptr(), 0, &cell, &desc, key, &vw, &devices)) {
          if (PyErr_Occurred()) throw py::error_already_set();
          throw py::value_error(w + ": " + py::repr(value).cast<std::string>() + " is not what its slot reads (" +
                                type_name(s.ty) + (s.annotated ? ", annotated" : "") + ")");
        }
        return cell;
      },
      py::arg("value"), py::arg("row"), py::arg("what") = "",
      "The parameter bytes of `value` as the slot of slot table row `row` (specialize.Shape.table()) reads "
      "it (little-endian, in a u64); `what` names the argument in errors.");
  m.def("counters", [] {
    Counters& c = counters();
    py::dict d;
    d["launches"] = c.launches.load();
    d["module_loads"] = c.module_loads.load();
    d["bench_launches"] = c.bench_launches.load();
    d["resolves"] = c.resolves.load();
    d["scratch_allocs"] = c.scratch_allocs.load();
    return d;
  });
  m.def("launch_meta_from_json", [](const std::string& text) { return meta_to_dict(launch_meta_from_json(text)); },
        "A bundle variant's launch metadata (JSON) as the C++ bundles read it, as a dict (for tests).");
  m.def("check_fits", [](const py::dict& meta, int dev) { return check_fits(meta_from(meta), device_info(dev)); },
        "Empty string if a kernel with this metadata fits the device, else the reason.");

  // Host tensor descriptors (tensor_desc.h), for Python's own checks and tests.
  m.def("check_tensor_desc", [](py::tuple d) { return check_tensor_desc(host_desc_from(d)); },
        "Why (base, dtype, shape, strides, block, nan, tf32) cannot be a tensor descriptor argument, or ''.");
  m.def(
      "pack_tensor_desc",
      [](const py::dict& meta, size_t index, py::tuple d, const std::string& kernel, const std::string& arg) {
        LaunchMeta lm = meta_from(meta);
        DescParams out;
        void* p[kMaxDescParams];
        size_t n = pack_tensor_desc(lm.tensordesc, lm.tensordesc_abi, index, host_desc_from(d), out, p, kernel, arg.c_str());
        // Each parameter's bytes: its size is the gap to the next one's storage, by type.
        py::list params;
        for (size_t i = 0; i < n; ++i) {
          size_t size = p[i] == &out.map ? sizeof(out.map)
                        : (p[i] == &out.padding || p[i] == &out.tf32) ? 1
                        : (p[i] >= static_cast<void*>(out.shape32) && p[i] < static_cast<void*>(out.shape32 + kMaxDescRank)) ? 4
                        : 8;
          params.append(py::bytes(static_cast<const char*>(p[i]), size));
        }
        return params;
      },
      py::arg("metadata"), py::arg("index"), py::arg("desc"), py::arg("kernel"), py::arg("arg"),
      "The kernel parameters (bytes each) a descriptor expands into for a kernel with this metadata: exactly "
      "what every launch path passes. Encoding a CUtensorMap needs the driver; the checks before it do not.");

  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel")
      .def(py::init([](py::bytes cubin, const py::dict& meta) {
             auto img = std::make_shared<KernelImage>();
             img->cubin = std::string(cubin);
             img->metadata_json = meta_json(meta);
             img->meta = launch_meta_from_json(img->metadata_json);
             return std::make_shared<Kernel>(std::move(img));
           }),
           py::arg("cubin"), py::arg("metadata"))
      .def_property_readonly("name", [](const Kernel& k) { return k.meta().name; })
      // Every field it was given (a bundle written from it carries them all, for the one decoder to
      // read back), with the decoded ones as the runtime reads them.
      .def_property_readonly("metadata",
                             [](const Kernel& k) {
                               py::dict d = k.image().metadata_json.empty()
                                                ? py::dict()
                                                : py::module_::import("json").attr("loads")(k.image().metadata_json);
                               for (auto [key, v] : meta_to_dict(k.meta())) d[key] = v;
                               return d;
                             })
      .def_property_readonly("cubin", [](const Kernel& k) { return py::bytes(k.image().cubin); })
      .def("load", [](Kernel& k) { k.function(current_context()); }, "Load the module in the current context.");

  py::class_<ScratchArena, std::shared_ptr<ScratchArena>>(
      m, "ScratchArena", "Scratch memory of one launch site, valid under graph capture (see kernel.h).")
      .def(py::init<>())
      .def_property_readonly("bytes_held", &ScratchArena::bytes_held);
  // The fixed-layout launch the JAX handler makes (call_site.h), for tests and
  // embedders that drive it from Python: buffer addresses in, no Python after.
  m.def(
      "launch_fixed",
      [](const Entry& e, uint64_t stream, const std::vector<uint64_t>& buffers, ScratchArena* arena) {
        launch_fixed(e, current_context(), as_stream(stream), buffers.data(), buffers.size(), arena);
      },
      py::arg("entry"), py::arg("stream"), py::arg("buffers"), py::arg("arena") = nullptr);

  // The call site the JAX handler launches through, its resolver a Python callable (key) -> Entry:
  // for tests that drive the handler's C++ path (online tuning's one-call entries) with no GPU.
  py::class_<CallSite, std::shared_ptr<CallSite>>(m, "CallSite")
      .def(py::init([](std::string name, size_t n_buffers, py::function resolver) {
             auto fn = std::make_shared<py::function>(std::move(resolver));
             return std::make_shared<CallSite>(std::move(name), n_buffers, [fn](const CallKey& key, void*) {
               py::gil_scoped_acquire gil;
               return std::shared_ptr<const Entry>((*fn)(key).cast<std::shared_ptr<Entry>>());
             });
           }),
           py::arg("name"), py::arg("n_buffers"), py::arg("resolver"))
      .def(
          "launch",
          [](CallSite& s, uint64_t stream, const std::vector<uint64_t>& buffers) {
            if (buffers.size() != s.n_buffers()) throw std::invalid_argument("launch: wrong number of buffers");
            cu::CUcontext ctx = current_context();
            py::gil_scoped_release nogil;
            s.launch(ctx, as_stream(stream), buffers.data(), nullptr);
          },
          py::arg("stream"), py::arg("buffers"))
      .def_property_readonly("resolved", [](CallSite& s) { return s.table().size(); });

  py::class_<Entry, std::shared_ptr<Entry>>(m, "Entry")
      .def(py::init([](std::shared_ptr<Kernel> k, std::vector<bool> is_param, py::object meta, py::object grid,
                       const py::list& sources, const std::vector<std::pair<int32_t, uint64_t>>& zero,
                       std::shared_ptr<LaunchTimer> timer, bool once) {
             auto e = std::make_shared<Entry>();
             e->once = once || timer;
             e->timer = std::move(timer);
             e->kernel = std::move(k);
             e->is_param = std::move(is_param);
             if (!grid.is_none()) e->grid = dim3_from(grid);
             e->user = hold(std::move(meta));
             for (py::handle src : sources) {
               auto t = src.cast<py::tuple>();
               ParamSource ps;
               ps.buffer = t[0].cast<int32_t>();
               if (py::isinstance<py::tuple>(t[1])) {  // a descriptor whose base is call buffer ps.buffer
                 DescSource ds;
                 ds.buffer = ps.buffer;
                 ds.desc = host_desc_from(t[1], &ds.name);
                 ps.desc = int32_t(e->descs.size());
                 e->descs.push_back(std::move(ds));
               } else {
                 ps.bits = t[1].cast<uint64_t>();
               }
               e->sources.push_back(ps);
             }
             for (auto& [buffer, bytes] : zero) e->zero.push_back({buffer, bytes});
             return e;
           }),
           py::arg("kernel"), py::arg("is_param"), py::arg("meta") = py::none(), py::arg("grid") = py::none(),
           py::arg("sources") = py::list(), py::arg("zero") = std::vector<std::pair<int32_t, uint64_t>>{},
           py::arg("timer") = nullptr, py::arg("once") = false,
           "sources/zero: for fixed-layout callers, per kernel parameter (buffer index or -1, scalar bits), or "
           "(buffer index, descriptor tuple) for a tensor descriptor on that buffer; and (buffer index, bytes) "
           "to zero before every launch. once: a one-call entry of online tuning (never installed); timer: "
           "a LaunchTimer its launch is timed by (one-call too).")
      .def("share",
           [](std::shared_ptr<Entry> e) {
             return reinterpret_cast<uintptr_t>(new std::shared_ptr<const Entry>(std::move(e)));
           },
           "A new owning reference as the address of a heap std::shared_ptr<const lt::Entry>, for C++ code "
           "in another module (the JAX handler), which takes ownership.")
      .def_property_readonly("grid", [](const Entry& e) { return py::make_tuple(e.grid.x, e.grid.y, e.grid.z); })
      .def_property_readonly("sources",
                             [](const Entry& e) {
                               py::list out;
                               for (auto& s : e.sources) {
                                 if (s.desc < 0) {
                                   out.append(py::make_tuple(s.buffer, s.bits));
                                   continue;
                                 }
                                 const HostTensorDesc& d = e.descs[size_t(s.desc)].desc;
                                 out.append(py::make_tuple(
                                     s.buffer, py::make_tuple(d.base, d.dtype,
                                                              std::vector<int64_t>(d.shape, d.shape + d.rank),
                                                              std::vector<int64_t>(d.strides, d.strides + d.rank),
                                                              std::vector<int64_t>(d.block, d.block + d.rank),
                                                              d.nan_padding, d.tf32, e.descs[size_t(s.desc)].name)));
                               }
                               return out;
                             })
      .def_property_readonly("kernel", [](const Entry& e) { return e.kernel; })
      .def_property_readonly("meta",
                             [](const Entry& e) -> py::object {
                               if (!e.user) return py::none();
                               return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(e.user.get()));
                             })
      .def_property_readonly("is_param", [](const Entry& e) { return e.is_param; })
      .def_property_readonly("timer", [](const Entry& e) { return e.timer; })
      .def_property_readonly("once", [](const Entry& e) { return e.once; });

  py::class_<Claim>(m, "Claim", "A key's resolution handed to this caller by ResolveTable.claim.")
      .def("publish",
           [](Claim& c, std::shared_ptr<Entry> e) {
             if (!c.open) throw std::logic_error("lazytriton: this claim was already ended");
             c.open = false;
             c.table->publish(c.key, std::move(e));
           })
      .def("release",
           [](Claim& c) {
             if (!c.open) throw std::logic_error("lazytriton: this claim was already ended");
             c.open = false;
             c.table->release(c.key);
           },
           "Ends it with no winner and no error (this caller launched its call itself: online tuning); callers "
           "waiting for it claim the key again.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Claim& c, py::object type, py::object value, py::object) {
        if (value.is_none()) {
          c.end(std::make_exception_ptr(Error("kernel " + c.table->name() + ": a resolution ended without a winner")));
        } else {  // waiters raise the resolver's own exception, as the resolver's thread does
          PyErr_SetObject(type.ptr(), value.ptr());
          c.end(std::make_exception_ptr(py::error_already_set()));
        }
        return false;
      });

  py::class_<ResolveTable, std::shared_ptr<ResolveTable>>(m, "ResolveTable")
      .def(py::init([](std::string name) { return std::make_shared<ResolveTable>(std::move(name)); }), py::arg("name"))
      .def_property_readonly("name", &ResolveTable::name)
      .def_property_readonly("handle", [](ResolveTable& k) { return reinterpret_cast<uintptr_t>(&k); },
                             "Address of the C++ object, for generated stubs (valid while this object lives).")
      .def(
          "claim",
          [](std::shared_ptr<ResolveTable> k, std::vector<uint64_t> key) -> py::object {
            const Entry* e;
            {
              py::gil_scoped_release nogil;  // a resolution in flight (another thread's) is waited for
              e = k->claim(key.data(), key.size());
            }
            if (e) return py::none();
            return py::cast(std::make_unique<Claim>(std::move(k), std::move(key)));
          },
          "None if `key` has a winner (waiting for a resolution in flight, whose error is raised here too), "
          "else a Claim: this caller resolves it.")
      .def("install",
           [](ResolveTable& k, std::vector<uint64_t> key, std::shared_ptr<Entry> e) { k.install(key, std::move(e)); })
      .def("find", [](ResolveTable& k, std::vector<uint64_t> key) { return k.find(key.data(), key.size()) != nullptr; })
      .def("__len__", &ResolveTable::size)
      .def("clear", &ResolveTable::clear);

  bind_timing(m);
  bind_isolation(m);
}
