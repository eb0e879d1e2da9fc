// The kvlayer Python extension module, _kvlayer: kvlayer::Error as kvlayer.Error, then the
// core vocabulary, the reference and (when built with nvcc) the CUDA layer.
#include <exception>

#include "bindings.hpp"

namespace kvlayer::python {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::refused:
      return "refused";
    case ErrorKind::device:
      return "device";
    case ErrorKind::io:
      return "io";
  }
  return "unknown";
}

DType dtype_of(int code) {
  return static_cast<DType>(code);
}

}  // namespace kvlayer::python

NB_MODULE(_kvlayer, m) {
  namespace nb = nanobind;
  using namespace kvlayer::python;
  m.doc() = "kvlayer's C++ library (low level; use the kvlayer package)";
  // kvlayer::Error becomes kvlayer.Error (a RuntimeError subclass defined in Python, so that the
  // package's own refusals raise the same type) with the library's message and its kind.
  // NOTE: the class is looked up when an error is raised, not here: kvlayer/__init__.py is
  // still importing this module at this point.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const kvlayer::Error& e) {
      try {
        nb::object cls = nb::module_::import_("kvlayer._errors").attr("Error");
        nb::object exc = cls(e.what(), error_kind_name(e.kind()));
        PyErr_SetObject(cls.ptr(), exc.ptr());
      } catch (const nb::python_error&) {
        // kvlayer._errors cannot be imported (the extension loaded outside its package): the
        // message still reaches Python, as a plain RuntimeError.
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    }
  });
  bind_core(m);
  bind_reference(m);
#ifdef KVLAYER_PYTHON_CUDA
  bind_cuda(m);
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
  m.attr("cuda_head_dims") = nb::tuple();
#endif
}
