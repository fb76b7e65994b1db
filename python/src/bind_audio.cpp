/// melforge._core.load and melforge._core.info: audio decode (libsndfile), channel mix-down or selection and
/// resampling (libsoxr) through kernels/audio/decode.h, the code the builder decodes with.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "audio/decode.h"
#include "bindings.h"
#include "melforge/common/errors.h"

namespace nb = nanobind;

namespace melforge::python {
namespace {

/// A float32 [frames] NumPy array.
using Samples = nb::ndarray<nb::numpy, float, nb::ndim<1>>;

/// Decodes `path` as the builder does: to `sample_rate` Hz (0: the file's own rate), channel `channel` (-1: the mean
/// of all channels). Returns the samples and their rate.
std::pair<Samples, int> load(const std::filesystem::path& path, int sample_rate, int channel) {
  if (sample_rate < 0) throw InvalidArgument("sample_rate must be > 0 (or None: the file's rate), got " +
                                             std::to_string(sample_rate));
  if (channel < -1) throw InvalidArgument("channel must be >= 0 (or None: mix down), got " + std::to_string(channel));
  auto* samples = new std::vector<float>();
  nb::capsule owner(samples, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  audio::DecodeOptions opts;
  opts.channel = channel;
  {
    nb::gil_scoped_release release;
    opts.sample_rate = sample_rate > 0 ? sample_rate : audio::probe(path).sample_rate;
    *samples = audio::decode(path, opts).samples;
  }
  return {Samples(samples->data(), {samples->size()}, owner), opts.sample_rate};
}

/// The header of `path`: frames, sample_rate, channels, format, seconds.
nb::dict info(const std::filesystem::path& path) {
  audio::AudioInfo header;
  {
    nb::gil_scoped_release release;
    header = audio::probe(path);
  }
  nb::dict d;
  d["frames"] = header.frames;
  d["sample_rate"] = header.sample_rate;
  d["channels"] = header.channels;
  d["format"] = header.format;
  d["seconds"] = header.seconds();
  return d;
}

}  // namespace

void bind_audio(nb::module_& m) {
  m.def("load", &load, nb::arg("path"), nb::arg("sample_rate"), nb::arg("channel"),
        "Decodes an audio file as melforge-build does (use melforge.load). sample_rate 0: the file's rate; channel "
        "-1: mix down. Returns (float32 [frames] samples, sample rate in Hz).");
  m.def("info", &info, nb::arg("path"),
        "The header of an audio file (use melforge.info): dict of frames, sample_rate, channels, format, seconds.");
}

}  // namespace melforge::python
