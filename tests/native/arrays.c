// Array types written in C, as the array libraries' are (CuPy's Cython classes,
// torch's tensor): their attributes are C getters, C slots and C methods, which
// the launch stubs read by calling the type's descriptors directly
// (array_reads.h read_attr). Built by the `native_arrays` fixture (conftest.py).
//   GetSetArray(ptr, dtype): dtype and data through C getters (getset), data.ptr
//     a getter making a new int on every read (CuPy's MemoryPointer.ptr);
//   MemberArray(ptr, dtype): dtype and data in C slots (members);
//   MethodArray(ptr, dtype): dtype a getter, data_ptr() a C method (METH_NOARGS);
//   CythonArray(ptr, dtype): GetSetArray whose tp_getattro is an equivalent of the
//     generic lookup installed after PyType_Ready, as Cython does (CuPy's classes);
//   OverridingArray(ptr, dtype): GetSetArray with a C tp_getattro of its own that
//     answers "float16" for dtype, whatever its getter says.
// Each counts the reads of its attributes (reads()), so that a test can tell a
// read happened. All are subclassable: a Python subclass can override them.
#include <Python.h>
#include <structmember.h>

static long g_reads = 0;

typedef struct {
  PyObject_HEAD
  unsigned long long ptr;
} Mem;

static PyObject* mem_ptr(PyObject* o, void* c) {
  (void)c;
  ++g_reads;
  return PyLong_FromUnsignedLongLong(((Mem*)o)->ptr);
}

static PyGetSetDef mem_getset[] = {{"ptr", mem_ptr, NULL, NULL, NULL}, {NULL}};
static PyTypeObject MemType = {PyVarObject_HEAD_INIT(NULL, 0) "native_arrays.Mem", sizeof(Mem)};

typedef struct {
  PyObject_HEAD
  PyObject* dtype;
  PyObject* data;  // a Mem
  unsigned long long ptr;
} Array;

static PyObject* array_new(PyTypeObject* t, PyObject* args, PyObject* kw) {
  (void)kw;
  unsigned long long ptr;
  PyObject* dtype;
  if (!PyArg_ParseTuple(args, "KO", &ptr, &dtype)) return NULL;
  Array* a = (Array*)t->tp_alloc(t, 0);
  Mem* m = a ? (Mem*)MemType.tp_alloc(&MemType, 0) : NULL;
  if (!m) {
    Py_XDECREF(a);
    return NULL;
  }
  m->ptr = ptr;
  a->ptr = ptr;
  a->dtype = Py_NewRef(dtype);
  a->data = (PyObject*)m;
  return (PyObject*)a;
}

static void array_dealloc(PyObject* o) {
  Py_XDECREF(((Array*)o)->dtype);
  Py_XDECREF(((Array*)o)->data);
  Py_TYPE(o)->tp_free(o);
}

static PyObject* array_dtype(PyObject* o, void* c) {
  (void)c;
  ++g_reads;
  return Py_NewRef(((Array*)o)->dtype);
}

static PyObject* array_data(PyObject* o, void* c) {
  (void)c;
  ++g_reads;
  return Py_NewRef(((Array*)o)->data);
}

static PyObject* array_cai(PyObject* o, void* c) {
  (void)o, (void)c;
  return PyDict_New();  // marks a CUDA array (arrays.pointer_strategy); never read for .data.ptr types
}

static PyObject* array_data_ptr(PyObject* o, PyObject* unused) {
  (void)unused;
  ++g_reads;
  return PyLong_FromUnsignedLongLong(((Array*)o)->ptr);
}

static PyGetSetDef getset_getset[] = {{"dtype", array_dtype, NULL, NULL, NULL},
                                      {"data", array_data, NULL, NULL, NULL},
                                      {"__cuda_array_interface__", array_cai, NULL, NULL, NULL},
                                      {NULL}};
static PyMemberDef member_members[] = {{"dtype", T_OBJECT_EX, offsetof(Array, dtype), READONLY, NULL},
                                       {"data", T_OBJECT_EX, offsetof(Array, data), READONLY, NULL},
                                       {NULL}};
static PyGetSetDef member_getset[] = {{"__cuda_array_interface__", array_cai, NULL, NULL, NULL}, {NULL}};
static PyGetSetDef method_getset[] = {{"dtype", array_dtype, NULL, NULL, NULL}, {NULL}};
static PyMethodDef method_methods[] = {{"data_ptr", array_data_ptr, METH_NOARGS, NULL}, {NULL}};

static PyTypeObject GetSetArrayType = {PyVarObject_HEAD_INIT(NULL, 0) "native_arrays.GetSetArray", sizeof(Array)};
static PyTypeObject MemberArrayType = {PyVarObject_HEAD_INIT(NULL, 0) "native_arrays.MemberArray", sizeof(Array)};
static PyTypeObject MethodArrayType = {PyVarObject_HEAD_INIT(NULL, 0) "native_arrays.MethodArray", sizeof(Array)};
static PyTypeObject CythonArrayType = {PyVarObject_HEAD_INIT(NULL, 0) "native_arrays.CythonArray", sizeof(Array)};
static PyTypeObject OverridingArrayType = {PyVarObject_HEAD_INIT(NULL, 0) "native_arrays.OverridingArray",
                                           sizeof(Array)};

// What Cython installs for a class without a __dict__: the generic lookup, its own copy.
static PyObject* cython_getattro(PyObject* o, PyObject* name) { return PyObject_GenericGetAttr(o, name); }

static PyObject* overriding_getattro(PyObject* o, PyObject* name) {
  if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "dtype") == 0) {
    ++g_reads;
    return PyUnicode_FromString("float16");
  }
  return PyObject_GenericGetAttr(o, name);
}

static PyObject* reads(PyObject* m, PyObject* unused) {
  (void)m, (void)unused;
  return PyLong_FromLong(g_reads);
}

static PyMethodDef module_methods[] = {{"reads", reads, METH_NOARGS, "Attribute reads so far."}, {NULL}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "native_arrays", NULL, -1, module_methods};

static int ready(PyTypeObject* t, PyGetSetDef* getset, PyMemberDef* members, PyMethodDef* methods) {
  t->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  t->tp_new = array_new;
  t->tp_dealloc = array_dealloc;
  t->tp_getset = getset;
  t->tp_members = members;
  t->tp_methods = methods;
  return PyType_Ready(t);
}

PyMODINIT_FUNC PyInit_native_arrays(void) {
  MemType.tp_flags = Py_TPFLAGS_DEFAULT;
  MemType.tp_getset = mem_getset;
  if (PyType_Ready(&MemType) < 0 || ready(&GetSetArrayType, getset_getset, NULL, NULL) < 0 ||
      ready(&MemberArrayType, member_getset, member_members, NULL) < 0 ||
      ready(&MethodArrayType, method_getset, NULL, method_methods) < 0)
    return NULL;
  OverridingArrayType.tp_getattro = overriding_getattro;  // before PyType_Ready: its own __getattribute__
  if (ready(&OverridingArrayType, getset_getset, NULL, NULL) < 0 || ready(&CythonArrayType, getset_getset, NULL, NULL) < 0)
    return NULL;
  CythonArrayType.tp_getattro = cython_getattro;  // after PyType_Ready, as Cython does
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (PyModule_AddObjectRef(m, "GetSetArray", (PyObject*)&GetSetArrayType) < 0 ||
      PyModule_AddObjectRef(m, "MemberArray", (PyObject*)&MemberArrayType) < 0 ||
      PyModule_AddObjectRef(m, "MethodArray", (PyObject*)&MethodArrayType) < 0 ||
      PyModule_AddObjectRef(m, "CythonArray", (PyObject*)&CythonArrayType) < 0 ||
      PyModule_AddObjectRef(m, "OverridingArray", (PyObject*)&OverridingArrayType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
