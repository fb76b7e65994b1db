/// melforge._core: the extension module behind the `melforge` package. Registers each area (bindings.h) and turns
/// melforge's typed errors (common/errors.h) into Python exceptions:
///   melforge.Error (RuntimeError)            every error melforge raises on purpose;
///   melforge.InvalidArgument (Error, ValueError)  a bad parameter, raised before any work;
///   melforge.IoError (Error, OSError)        a file or folder that cannot be read or written;
///   melforge.AudioError (IoError)            an audio file that cannot be used (the message names it);
///   melforge.FormatError (Error, ValueError) a dataset or checkpoint of the wrong layout or schema;
///   melforge.CudaError (Error)               a CUDA call failed (not raised by a CPU-only build);
///   melforge.StrictError (Error)             melforge.build(strict=True) met a file it would skip (named).
#include <Python.h>
#include <nanobind/nanobind.h>

#include <melforge/common/errors.h>

#include "bindings.h"

namespace nb = nanobind;

namespace {

PyObject* new_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("melforge.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::borrow(type);
  return type;
}

PyObject* bases_of(std::initializer_list<PyObject*> types) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(types.size()));
  Py_ssize_t i = 0;
  for (PyObject* t : types) {
    Py_INCREF(t);
    PyTuple_SetItem(tuple, i++, t);  // steals t; PyTuple_SET_ITEM is not in the stable ABI (cp312-abi3 wheel)
  }
  return tuple;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "melforge's C++ core (kernels/, common/, data/, builder/); use the `melforge` package, not this module.";
  m.attr("__version__") = MELFORGE_VERSION;

  static PyObject* error = new_exception(m, "Error", PyExc_RuntimeError, "Base of every error melforge raises.");
  static PyObject* invalid = new_exception(m, "InvalidArgument", bases_of({error, PyExc_ValueError}),
                                           "A parameter is invalid; raised before any work starts.");
  static PyObject* io = new_exception(m, "IoError", bases_of({error, PyExc_OSError}),
                                      "A file or folder cannot be read or written.");
  static PyObject* audio = new_exception(m, "AudioError", io, "An audio file cannot be used; the message names it.");
  static PyObject* format = new_exception(m, "FormatError", bases_of({error, PyExc_ValueError}),
                                          "A dataset or checkpoint does not have the expected layout or schema.");
  static PyObject* cuda = new_exception(m, "CudaError", error, "A CUDA call failed.");
  static PyObject* strict = new_exception(m, "StrictError", error,
                                          "A build with strict=True met a file it would skip; the message names it.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const melforge::InvalidArgument& e) {
      PyErr_SetString(invalid, e.what());
    } catch (const melforge::AudioError& e) {
      PyErr_SetString(audio, e.what());
    } catch (const melforge::IoError& e) {
      PyErr_SetString(io, e.what());
    } catch (const melforge::FormatError& e) {
      PyErr_SetString(format, e.what());
    } catch (const melforge::CudaError& e) {
      PyErr_SetString(cuda, e.what());
    } catch (const melforge::StrictError& e) {
      PyErr_SetString(strict, e.what());
    } catch (const melforge::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  melforge::python::bind_mel(m);
  melforge::python::bind_audio(m);
  melforge::python::bind_build(m);
  melforge::python::bind_data(m);
  melforge::python::bind_eval(m);
}
