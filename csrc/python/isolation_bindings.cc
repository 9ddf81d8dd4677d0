// lazytriton._core's part of a candidate's isolated first launch (lazytriton/runtime/isolation.py,
// csrc/core/isolation.cc): the caller's IPC export and host staging, the helper's copies and its
// one launch.
#include <cstring>
#include <memory>

#include "core_module.h"
#include "lazytriton/isolation.h"

namespace lt::bindings {

void bind_isolation(py::module_& m) {
  m.def(
      "ipc_export",
      [](uint64_t ptr) -> py::tuple {
        IpcExport x = ipc_export(ptr);
        if (!x.ok) return py::make_tuple(py::none(), 0, x.why);
        return py::make_tuple(py::bytes(x.handle.reserved, sizeof(x.handle.reserved)), x.offset, std::string());
      },
      py::arg("ptr"),
      "(handle: 64 bytes, offset, '') of the allocation holding `ptr` (cuIpcGetMemHandle on its base), or "
      "(None, 0, why) where it cannot be exported.");
  m.def(
      "copy_to_host",
      [](uint64_t stream, uint64_t ptr, size_t nbytes, py::buffer out) {
        py::buffer_info info = out.request(true);
        if (size_t(info.size * info.itemsize) < nbytes) throw py::value_error("copy_to_host: the buffer is too small");
        void* dst = info.ptr;
        without_gil([&] {
          const Driver& d = driver();
          check(d.cuMemcpyDtoHAsync(dst, ptr, nbytes, as_stream(stream)), "staging cuMemcpyDtoHAsync");
          check(d.cuStreamSynchronize(as_stream(stream)), "staging cuStreamSynchronize");
        });
      },
      py::arg("stream"), py::arg("ptr"), py::arg("nbytes"), py::arg("out"),
      "Copies nbytes at device address ptr into the writable buffer `out` (stream-ordered, then waited for).");
  py::class_<DeviceCopies>(m, "DeviceCopies",
                           "Exportable device copies of buffers that cannot be exported (lazytriton/isolation.h).")
      .def(py::init([](uint64_t stream, const std::vector<std::pair<uint64_t, uint64_t>>& buffers) {
             return without_gil([&] { return std::make_unique<DeviceCopies>(as_stream(stream), buffers); });
           }),
           py::arg("stream"), py::arg("buffers"))
      .def_property_readonly("addresses", &DeviceCopies::addresses);
  m.def(
      "use_device",
      [](int device) { check(driver().cuCtxSetCurrent(primary_context(device)), "cuCtxSetCurrent"); },
      py::arg("device"), "Makes the device's primary context current on this thread.");

  py::class_<TrialBuffers>(m, "TrialBuffers",
                           "The isolation helper's copies of a call's buffers (lazytriton/isolation.h).")
      .def(py::init([](uint64_t stream, const py::list& sources) {
             // ("ipc", handle, offset, nbytes, address) or ("host", buffer, nbytes, address)
             std::vector<TrialBuffers::Source> srcs;
             std::vector<py::buffer_info> held;  // staged bytes stay readable until the copies are made
             held.reserve(sources.size());
             for (py::handle h : sources) {
               auto t = h.cast<py::tuple>();
               if (t.size() != 5 && t.size() != 4) throw py::value_error("a trial buffer source has 4 or 5 fields");
               TrialBuffers::Source s;
               const std::string kind = t[0].cast<std::string>();
               if (kind == "ipc") {
                 std::string handle = t[1].cast<std::string>();
                 if (handle.size() != sizeof(s.handle.reserved)) throw py::value_error("an IPC handle has 64 bytes");
                 s.ipc = true;
                 std::memcpy(s.handle.reserved, handle.data(), sizeof(s.handle.reserved));
                 s.offset = t[2].cast<uint64_t>();
                 s.bytes = t[3].cast<uint64_t>();
                 s.address = t[4].cast<uint64_t>();
               } else if (kind == "host") {
                 held.push_back(t[1].cast<py::buffer>().request());
                 s.host = held.back().ptr;
                 s.bytes = t[2].cast<uint64_t>();
                 if (uint64_t(held.back().size * held.back().itemsize) < s.bytes)
                   throw py::value_error("a staged buffer holds fewer bytes than it says");
                 s.address = t[3].cast<uint64_t>();
               } else {
                 throw py::value_error("a trial buffer source is 'ipc' or 'host', not '" + kind + "'");
               }
               srcs.push_back(s);
             }
             return without_gil([&] { return std::make_unique<TrialBuffers>(as_stream(stream), srcs); });
           }),
           py::arg("stream"), py::arg("sources"))
      .def_property_readonly("addresses", &TrialBuffers::addresses)
      .def_property_readonly("device_bytes", &TrialBuffers::device_bytes);

  m.def(
      "launch_and_wait",
      [](const Entry& e, uint64_t stream, const std::vector<uint64_t>& buffers) {
        cu::CUcontext ctx = current_context();
        return without_gil([&] { return launch_and_wait(e, ctx, as_stream(stream), buffers.data(), buffers.size()); });
      },
      py::arg("entry"), py::arg("stream"), py::arg("buffers"),
      "Launches the entry once on these buffers and waits: '' when it ran clean, else the driver's error name.");
}

}  // namespace lt::bindings
