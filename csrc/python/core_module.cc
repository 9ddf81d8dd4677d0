// lazytriton._core: the Python face of the C++ runtime. Python decides (what
// to compile, which config wins); this module loads and launches, and
// timing_bindings.cc times (core_module.h holds what the two share).
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "core_module.h"
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


// One entry of Triton's tensordesc_meta.
TmaMeta tma_meta_from(const py::dict& d) {
  TmaMeta t;
  t.swizzle = dict_int(d, "swizzle", 0);
  t.elem_size = dict_int(d, "elem_size", 0);
  t.elem_type = dict_int(d, "elem_type", 0);
  auto block = d["block_size"].cast<std::vector<int64_t>>();
  if (block.empty() || block.size() > size_t(kMaxDescRank))
    throw py::value_error("tensordesc_meta: block_size must have 1 to 5 entries");
  t.rank = int(block.size());
  for (int i = 0; i < t.rank; ++i) t.block[i] = uint32_t(block[size_t(i)]);
  t.fp4_padded = d.contains("fp4_padded") && d["fp4_padded"].cast<bool>();
  t.im2col = d.contains("is_im2col") && d["is_im2col"].cast<bool>();
  return t;
}


// Triton launch metadata, read by field name so any 3.x layout works.
LaunchMeta meta_from(const py::dict& d) {
  LaunchMeta m;
  m.name = d["name"].cast<std::string>();
  m.num_warps = dict_int(d, "num_warps", 4);
  m.num_ctas = dict_int(d, "num_ctas", 1);
  m.shared = unsigned(dict_u64(d, "shared", 0));
  m.global_scratch_size = dict_u64(d, "global_scratch_size", 0);
  m.global_scratch_align = dict_u64(d, "global_scratch_align", 1);
  m.profile_scratch_size = dict_u64(d, "profile_scratch_size", 0);
  m.profile_scratch_align = dict_u64(d, "profile_scratch_align", 1);
  m.cooperative = dict_int(d, "launch_cooperative_grid", 0) != 0;
  m.pdl = dict_int(d, "launch_pdl", 0) != 0;
  // CUDA: Triton's "arch" is a string ("sm90"), the target's arch the number (90).
  // HIP: both are the name ("gfx942"), kept as the binary's target.
  if (d.contains("target") && py::isinstance<py::dict>(d["target"]) && d["target"].cast<py::dict>().contains("arch")) {
    auto t = d["target"].cast<py::dict>();
    if (t.contains("backend") && t["backend"].cast<std::string>() == "hip")
      m.gfx = t["arch"].cast<std::string>();
    else
      m.arch = py::int_(t["arch"]);
    if (t.contains("warp_size") && !t["warp_size"].is_none()) m.warp_size = t["warp_size"].cast<int>();
  } else if (d.contains("arch") && py::isinstance<py::int_>(d["arch"])) {
    m.arch = d["arch"].cast<int>();
  }
  if (d.contains("gfx") && py::isinstance<py::str>(d["gfx"])) m.gfx = d["gfx"].cast<std::string>();
  m.warp_size = dict_int(d, "warp_size", m.warp_size);
  m.cluster[0] = unsigned(m.num_ctas);
  if (d.contains("cluster_dims") && !d["cluster_dims"].is_none()) {
    auto c = d["cluster_dims"].cast<std::vector<unsigned>>();
    for (size_t i = 0; i < c.size() && i < 3; ++i) m.cluster[i] = std::max(1u, c[i]);
  }
  if (d.contains("tensordesc_meta") && !d["tensordesc_meta"].is_none())
    for (py::handle t : d["tensordesc_meta"]) m.tensordesc.push_back(tma_meta_from(py::reinterpret_borrow<py::dict>(t)));
  if (d.contains("lt_tensordesc_abi"))
    m.tensordesc_abi = d["lt_tensordesc_abi"].cast<int>();
  else if (d.contains("triton_version") && py::isinstance<py::str>(d["triton_version"]))
    m.tensordesc_abi = tensor_desc_abi_of(d["triton_version"].cast<std::string>());
  return m;
}

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
  d["num_warps"] = m.num_warps;
  d["num_ctas"] = m.num_ctas;
  d["shared"] = m.shared;
  d["global_scratch_size"] = m.global_scratch_size;
  d["global_scratch_align"] = m.global_scratch_align;
  d["profile_scratch_size"] = m.profile_scratch_size;
  d["profile_scratch_align"] = m.profile_scratch_align;
  d["cluster_dims"] = py::make_tuple(m.cluster[0], m.cluster[1], m.cluster[2]);
  d["launch_cooperative_grid"] = m.cooperative;
  d["launch_pdl"] = m.pdl;
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
  // scalars (ParamSource.bits) packed by the stubs' rule.
  m.def(
      "scalar_bits",
      [](py::handle value, const std::string& type, const std::string& what) {
        uint64_t slot = 0;
        ArgPack::pack(type, value, &slot, what.empty() ? what : what + ": ");
        return slot;
      },
      py::arg("value"), py::arg("type"), py::arg("what") = "",
      "The parameter bytes of `value` as a kernel parameter of Triton type `type` (little-endian, in a u64); "
      "`what` names the argument in errors.");
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
             img->meta = meta_from(meta);
             return std::make_shared<Kernel>(std::move(img));
           }),
           py::arg("cubin"), py::arg("metadata"))
      .def_property_readonly("name", [](const Kernel& k) { return k.meta().name; })
      .def_property_readonly("metadata", [](const Kernel& k) { return meta_to_dict(k.meta()); })
      .def_property_readonly("cubin", [](const Kernel& k) { return py::bytes(k.image().cubin); })
      .def("load", [](Kernel& k) { k.function(current_context()); }, "Load the module in the current context.")
      .def("launch",
           [](Kernel& k, py::handle grid, uint64_t stream, const std::vector<std::string>& types, py::sequence args) {
             ArgPack pack(types, args, &k.meta());
             Dim3 g = dim3_from(grid);
             k.launch(as_stream(stream), g, pack.ptrs.data(), pack.ptrs.size());
           },
           py::arg("grid"), py::arg("stream"), py::arg("types"), py::arg("args"));

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

  py::class_<Entry, std::shared_ptr<Entry>>(m, "Entry")
      .def(py::init([](std::shared_ptr<Kernel> k, std::vector<bool> is_param, py::object meta, py::object grid,
                       const py::list& sources, const std::vector<std::pair<int32_t, uint64_t>>& zero) {
             auto e = std::make_shared<Entry>();
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
           "sources/zero: for fixed-layout callers, per kernel parameter (buffer index or -1, scalar bits), or "
           "(buffer index, descriptor tuple) for a tensor descriptor on that buffer; and (buffer index, bytes) "
           "to zero before every launch.")
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
      .def_property_readonly("is_param", [](const Entry& e) { return e.is_param; });

  py::class_<Claim>(m, "Claim", "A key's resolution handed to this caller by ResolveTable.claim.")
      .def("publish",
           [](Claim& c, std::shared_ptr<Entry> e) {
             if (!c.open) throw std::logic_error("lazytriton: this claim was already ended");
             c.open = false;
             c.table->publish(c.key, std::move(e));
           })
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
}
