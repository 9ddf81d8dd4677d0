// Reads a torch tensor argument through torch's C++ API: its dtype, whether it
// is on the GPU, its data pointer and its device index. Torch's Python getters (`t.dtype`,
// `t.is_cuda`, `t.data_ptr()`) cost about 50-300 ns each on a launch; these
// reads cost a few ns. Built at run time against the installed torch's own
// headers (lazytriton.runtime.torch_reader) and handed to the stubs through
// lazytriton._core (array_reads.h `Readers`); the stubs fall back to the
// Python getters whenever this reader declines.
//
// The same answers as the Python getters, by torch's own rule
// (check_has_torch_function): they are plain C++ reads only for an exact
// torch.Tensor or nn.Parameter while no torch function mode is active.
// Anything else (a subclass, which may override them; an active mode, which
// sees the getters) is declined, and so is a tensor whose data_ptr() throws
// (no storage): the Python getters then raise what they raise.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

#include "array_reads.h"

namespace {

int read_tensor(PyObject* obj, PyObject** dtype, uint64_t* ptr, int* device) noexcept {
  if (!THPVariable_CheckExact(obj) || at::impl::torch_function_mode_enabled()) return lt::pyargs::kDeclined;
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    *dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));  // borrowed: torch keeps it
    if (!t.is_cuda()) return lt::pyargs::kHostTensor;
    *ptr = reinterpret_cast<uint64_t>(t.data_ptr());  // what t.data_ptr() answers (a lazy copy is materialized)
    *device = t.device().index();                      // what t.get_device() answers
    return lt::pyargs::kDeviceTensor;
  } catch (...) {
    return lt::pyargs::kDeclined;
  }
}

// read(t) -> None (declined) or (dtype, on the GPU, data pointer or None, device index or None): for tests.
PyObject* py_read(PyObject*, PyObject* obj) {
  PyObject* dtype = nullptr;
  uint64_t ptr = 0;
  int device = -1;
  int r = read_tensor(obj, &dtype, &ptr, &device);
  if (r == lt::pyargs::kDeclined) Py_RETURN_NONE;
  if (r == lt::pyargs::kHostTensor) return Py_BuildValue("(OOOO)", dtype, Py_False, Py_None, Py_None);
  return Py_BuildValue("(OOKi)", dtype, Py_True, static_cast<unsigned long long>(ptr), device);
}

PyMethodDef methods[] = {
    {"read", py_read, METH_O,
     "read(t): None if declined, else (dtype, on the GPU, data pointer or None, device index or None)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, LT_MODULE_NAME, "lazytriton's torch tensor reader.", -1, methods};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* LT_INIT_FN() {
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  PyObject* cap = PyCapsule_New(reinterpret_cast<void*>(&read_tensor), lt::pyargs::kTorchReaderCapsule, nullptr);
  if (!cap || PyModule_AddObject(m, "reader", cap) < 0) {
    Py_XDECREF(cap);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
