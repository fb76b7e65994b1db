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
#include "reader/mel_info.h"
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
    const featurize::DatasetParams p = data::MelInfo::from_json(j).dataset_params();
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
