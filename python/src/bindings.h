#pragma once
/// The parts of the melforge._core extension module: each bind_* function, in its own file, adds one area's
/// classes and functions to the module. module.cpp calls them all and maps melforge's typed errors to Python
/// exceptions.
#include <nanobind/nanobind.h>

namespace melforge::python {

/// MelSpectrogram's compute (bind_mel.cpp): torchaudio-compatible log-mel spectrograms of NumPy arrays.
void bind_mel(nanobind::module_& m);
/// Audio decode and resample as the builder does (bind_audio.cpp).
void bind_audio(nanobind::module_& m);
/// A build with the builder's own options (bind_build.cpp).
void bind_build(nanobind::module_& m);
/// Dataset reading and the batch loader (bind_data.cpp).
void bind_data(nanobind::module_& m);
/// The file-level vote of `melforge-train eval` and the featurization `predict` uses (bind_eval.cpp).
void bind_eval(nanobind::module_& m);

}  // namespace melforge::python
