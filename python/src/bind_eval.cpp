/// The file-level vote and metrics of `melforge-train eval` (kernels/vote, kernels/metrics) for
/// melforge.evaluate_files, and the input listing and featurization of `melforge-train predict` for melforge.predict.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <tuple>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings.h"
#include "featurize/featurize.h"
#include "inputs/inputs.h"
#include "melforge/common/errors.h"
#include "metrics/metrics.h"
#include "vote/vote.h"

namespace nb = nanobind;

namespace melforge::python {

namespace {

/// `v` as a NumPy array of `shape` that owns the vector (no copy).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v, std::initializer_list<std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.begin(), owner);
}

using FloatIn = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using LongIn = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::tuple vote_files(FloatIn probs, FloatIn det_probs, LongIn num_valid_long, const std::string& vote_name,
                     double threshold) {
  const vote::Vote v = vote::parse_vote(vote_name);
  if (probs.ndim() != 4 || det_probs.ndim() != 3)
    throw InvalidArgument("vote_files: expected probs [F, L, S, C] and det_probs [F, L, S]");
  const vote::VoteShape shape{static_cast<int64_t>(probs.shape(0)), static_cast<int64_t>(probs.shape(1)),
                              static_cast<int64_t>(probs.shape(2)), static_cast<int64_t>(probs.shape(3))};
  for (std::size_t i = 0; i < 3; ++i)
    if (det_probs.shape(i) != probs.shape(i))
      throw InvalidArgument("vote_files: det_probs must be [F, L, S] of probs [F, L, S, C]");
  vote::FileVotes out;
  {
    nb::gil_scoped_release release;
    out = vote::aggregate_files({probs.data(), probs.size()}, {det_probs.data(), det_probs.size()},
                                {num_valid_long.data(), num_valid_long.size()}, shape, v, threshold);
  }
  const auto F = static_cast<std::size_t>(shape.files), C = static_cast<std::size_t>(shape.num_classes);
  return nb::make_tuple(to_numpy(std::move(out.class_probs), {F, C}), to_numpy(std::move(out.predicted), {F}),
                        to_numpy(std::move(out.detection_score), {F}), to_numpy(std::move(out.detected), {F}));
}

std::string file_metrics_json(LongIn labels, LongIn predicted,
                              nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> detected,
                              int64_t num_classes, int64_t positive_class,
                              const std::vector<std::string>& class_names) {
  const metrics::Metrics m = metrics::file_metrics(
      std::vector<int64_t>(labels.data(), labels.data() + labels.size()),
      std::vector<int64_t>(predicted.data(), predicted.data() + predicted.size()),
      std::vector<uint8_t>(detected.data(), detected.data() + detected.size()), num_classes, positive_class);
  return m.to_json(class_names).dump();
}

/// `j[key]` as T; FormatError naming the field when it is missing or of another type.
template <typename T>
T field(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) throw FormatError(std::string("mel parameters: missing field '") + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("mel parameters: field '") + key + "': " + e.what());
  }
}

/// An enum field parsed with the kernels' own parser; FormatError on an unknown spelling.
template <typename Parse>
auto enum_field(const nlohmann::json& j, const char* key, Parse parse) {
  try {
    return parse(field<std::string>(j, key));
  } catch (const InvalidArgument& e) {
    throw FormatError(std::string("mel parameters: field '") + key + "': " + e.what());
  }
}

/// The dataset parameters of a checkpoint's / export's "mel" object (the trainer's MelInfo::to_json(), the root
/// attributes of docs/FORMAT.md). TODO(h16 merge): replace by data::MelInfo::from_json(j) with its mel_args() and
/// segment_args() once melforge_data (h16-data) is on main; this mapping exists only until then.
featurize::DatasetParams dataset_params(const nlohmann::json& j) {
  featurize::DatasetParams p;
  mel::MelArgs& a = p.mel;
  a.sample_rate = field<int>(j, "sample_rate");
  a.n_fft = field<int>(j, "n_fft");
  a.win_length = field<int>(j, "win_length");
  a.hop_length = field<int>(j, "hop_length");
  a.window = enum_field(j, "window", mel::parse_window);
  a.center = field<int64_t>(j, "center") != 0;
  a.pad_mode = enum_field(j, "pad_mode", mel::parse_pad_mode);
  a.power = static_cast<float>(field<double>(j, "power"));
  a.n_mels = field<int>(j, "n_mels");
  a.f_min = static_cast<float>(field<double>(j, "f_min"));
  a.f_max = static_cast<float>(field<double>(j, "f_max"));
  a.mel_scale = enum_field(j, "mel_scale", mel::parse_mel_scale);
  a.mel_norm = enum_field(j, "mel_norm", mel::parse_mel_norm);
  a.log = enum_field(j, "log", mel::parse_log_mode);
  a.amin = static_cast<float>(field<double>(j, "amin"));
  a.log_eps = static_cast<float>(field<double>(j, "log_eps"));
  p.dtype = enum_field(j, "dtype", mel::parse_dtype);
  p.segment.long_seconds = field<double>(j, "long_seconds");
  p.segment.short_seconds = field<double>(j, "short_seconds");
  p.segment.short_files = enum_field(j, "short_files", segment::parse_short_file_policy);
  p.channel = static_cast<int>(field<int64_t>(j, "channel"));
  p.num_long = field<int64_t>(j, "num_long");
  p.num_short = field<int64_t>(j, "num_short");
  p.n_mels = field<int64_t>(j, "n_mels");
  p.n_frames = field<int64_t>(j, "n_frames");
  p.long_samples = field<int64_t>(j, "long_samples");
  p.short_samples = field<int64_t>(j, "short_samples");
  return p;
}

/// featurize::Featurizer for Python: built from the "mel" JSON text, returns NumPy arrays.
class PyFeaturizer {
 public:
  PyFeaturizer(const std::string& mel_json, int threads) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(mel_json);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(std::string("mel parameters: not valid JSON: ") + e.what());
    }
    const featurize::DatasetParams p = dataset_params(j);
    nb::gil_scoped_release release;
    featurizer_ = std::make_unique<featurize::Featurizer>(p, threads);
  }
  nb::tuple call(const std::string& path) {
    featurize::FloatFeatures f;
    {
      nb::gil_scoped_release release;
      f = (*featurizer_)(path);
    }
    const featurize::DatasetParams& p = featurizer_->params();
    const int nvl = f.num_valid_long;
    return nb::make_tuple(to_numpy(std::move(f.values), {static_cast<std::size_t>(p.num_long),
                                                          static_cast<std::size_t>(p.num_short),
                                                          static_cast<std::size_t>(p.n_mels),
                                                          static_cast<std::size_t>(p.n_frames)}),
                          nvl);
  }

 private:
  std::unique_ptr<featurize::Featurizer> featurizer_;
};

std::vector<std::tuple<std::string, std::string>> collect_inputs(const std::vector<std::string>& paths,
                                                                 bool include_hidden) {
  std::vector<std::filesystem::path> in(paths.begin(), paths.end());
  std::vector<inputs::PredictInput> found;
  {
    nb::gil_scoped_release release;
    found = inputs::collect_inputs(in, include_hidden);
  }
  std::vector<std::tuple<std::string, std::string>> out;
  for (const auto& f : found) out.emplace_back(f.path.string(), f.error);
  return out;
}

}  // namespace

void bind_eval(nb::module_& m) {
  m.def("vote_files", &vote_files, nb::arg("probs"), nb::arg("det_probs"), nb::arg("num_valid_long"),
        nb::arg("vote"), nb::arg("threshold"),
        "File-level vote of melforge-train eval (kernels/vote): probs float32 [F, L, S, C], det_probs float32 "
        "[F, L, S], num_valid_long int64 [F] -> (class_probs float32 [F, C], predicted int64 [F], "
        "detection_score float32 [F], detected uint8 [F]).");
  m.def("file_metrics_json", &file_metrics_json, nb::arg("labels"), nb::arg("predicted"), nb::arg("detected"),
        nb::arg("num_classes"), nb::arg("positive_class"), nb::arg("class_names"),
        "File-level metrics (kernels/metrics) of labels / predicted int64 [F] and detected uint8 [F], as the JSON "
        "text of the \"file\" part of melforge-train eval's report.");
  m.def("collect_inputs", &collect_inputs, nb::arg("paths"), nb::arg("include_hidden") = false,
        "The (path, error) inputs melforge-train predict reads for files and folders (kernels/inputs): folders "
        "walked recursively for audio extensions, sorted per input, unreadable entries with their error.");
  nb::class_<PyFeaturizer>(m, "Featurizer",
                           "The features of audio files as a dataset with the given \"mel\" parameters stores them "
                           "(kernels/featurize, as melforge-train predict).")
      .def(nb::init<const std::string&, int>(), nb::arg("mel_json"), nb::arg("threads") = 0)
      .def("__call__", &PyFeaturizer::call, nb::arg("path"),
           "(float32 [num_long, num_short, n_mels, n_frames], num_valid_long) of one file; raises AudioError "
           "naming the file when it cannot be used.");
}

}  // namespace melforge::python
