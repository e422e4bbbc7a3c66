// Makes the operator library importable as the Python module attn_ops._C. Importing it runs the
// static TORCH_LIBRARY registrations; the module itself exposes nothing.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "attn_ops operator library", -1, nullptr};
  return PyModule_Create(&module);
}
