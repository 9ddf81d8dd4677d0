// Floors for the harness's JAX chain (lazytriton/bench/jax_group.py): what an XLA FFI custom call costs with
// nothing of lazytriton in it.
//   lt_bench_noop: decodes its stream and buffers, launches nothing.
//   lt_bench_raw:  the same, then one plain cuLaunchKernel of a cubin set by
//                  set_cubin() (parameters: input, n, output, two scratch).
// Built by jax_group.py through lazytriton.runtime.stubgen, against jaxlib's headers.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>

#include "lazytriton/driver.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {
lt::cu::CUfunction g_fn = nullptr;
unsigned g_block = 0;
int32_t g_n = 0;
uint64_t g_runs = 0;  // how often XLA ran a handler (launch or capture); replays do not

ffi::Error Noop(lt::cu::CUstream, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  ++g_runs;
  return ffi::Error::Success();
}

ffi::Error Raw(lt::cu::CUstream stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  ++g_runs;
  uint64_t in = reinterpret_cast<uint64_t>(x.untyped_data());
  uint64_t o = reinterpret_cast<uint64_t>(out->untyped_data()), none = 0;
  void* params[] = {&in, &g_n, &o, &none, &none};
  lt::cu::CUresult r = lt::driver().cuLaunchKernel(g_fn, 1, 1, 1, g_block, 1, 1, 0, stream, params, nullptr);
  return r == lt::cu::CUDA_SUCCESS ? ffi::Error::Success() : ffi::Error::Internal("cuLaunchKernel failed");
}
}  // namespace

XLA_FFI_DEFINE_HANDLER(lt_bench_noop, Noop,
                       ffi::Ffi::Bind().Ctx<ffi::PlatformStream<lt::cu::CUstream>>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>(),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(lt_bench_raw, Raw,
                       ffi::Ffi::Bind().Ctx<ffi::PlatformStream<lt::cu::CUstream>>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>(),
                       {ffi::Traits::kCmdBufferCompatible});

namespace {
PyObject* handlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsN}", "noop", PyCapsule_New(reinterpret_cast<void*>(lt_bench_noop), nullptr, nullptr),
                       "raw", PyCapsule_New(reinterpret_cast<void*>(lt_bench_raw), nullptr, nullptr));
}

// set_cubin(cubin: bytes, name: str, block_threads: int, n: int): loads it in
// device 0's primary context, which XLA's stream belongs to.
PyObject* set_cubin(PyObject*, PyObject* args) {
  const char *cubin, *name;
  Py_ssize_t len;
  unsigned block;
  int n;
  if (!PyArg_ParseTuple(args, "y#sIi", &cubin, &len, &name, &block, &n)) return nullptr;
  try {
    lt::ContextGuard guard(lt::primary_context(0));
    lt::cu::CUmodule mod;
    lt::check(lt::driver().cuModuleLoadData(&mod, cubin), "cuModuleLoadData");
    lt::check(lt::driver().cuModuleGetFunction(&g_fn, mod, name), "cuModuleGetFunction");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  g_block = block;
  g_n = n;
  Py_RETURN_NONE;
}

PyObject* runs(PyObject*, PyObject*) { return PyLong_FromUnsignedLongLong(g_runs); }

PyMethodDef kMethods[] = {{"handlers", handlers, METH_NOARGS, "noop and raw handlers, as PyCapsules."},
                          {"runs", runs, METH_NOARGS, "Handler runs so far."},
                          {"set_cubin", set_cubin, METH_VARARGS, "The kernel lt_bench_raw launches."},
                          {nullptr, nullptr, 0, nullptr}};
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "lt_bench_ffi", "FFI floors for the benchmark harness", -1, kMethods};
}  // namespace

PyMODINIT_FUNC PyInit_lt_bench_ffi() { return PyModule_Create(&kModule); }
