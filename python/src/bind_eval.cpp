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
#include "windows/windows.h"

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

  /// The kernels' featurizer (PyFileWindows reads with it).
  featurize::Featurizer& kernel() { return *featurizer_; }

 private:
  std::unique_ptr<featurize::Featurizer> featurizer_;
};

/// windows::FileWindows for Python: a file's whole-file windows, a batch at a time (the featurizer it reads with is
/// kept alive by the binding).
class PyFileWindows {
 public:
  PyFileWindows(PyFeaturizer& f, const std::string& path, double hop_seconds, int64_t batch_windows)
      : params_(f.kernel().params()) {
    const int64_t hop = windows::hop_samples(hop_seconds, params_.segment, params_.mel.sample_rate);
    nb::gil_scoped_release release;
    windows_ = std::make_unique<windows::FileWindows>(f.kernel(), path, hop, batch_windows);
  }
  /// Window start and end times, seconds, float64 [count] each (a padded last window ends where the audio ends).
  nb::tuple times() const {
    const windows::WindowPlan& p = windows_->plan();
    const auto rate = static_cast<double>(params_.mel.sample_rate);
    std::vector<double> start, end;
    for (int64_t k = 0; k < p.count; ++k) {
      start.push_back(static_cast<double>(p.start(k)) / rate);
      end.push_back(static_cast<double>(p.start(k) + p.audio_samples(k)) / rate);
    }
    const auto n = static_cast<std::size_t>(p.count);
    return nb::make_tuple(to_numpy(std::move(start), {n}), to_numpy(std::move(end), {n}));
  }
  /// (float32 [n, num_short, n_mels, n_frames], index of the first window) of the next batch, or None at the end.
  nb::object next() {
    windows::WindowBatch b;
    bool more = false;
    {
      nb::gil_scoped_release release;
      more = windows_->next(b);
    }
    if (!more) return nb::none();
    return nb::make_tuple(to_numpy(std::move(b.values),
                                   {static_cast<std::size_t>(b.count), static_cast<std::size_t>(params_.num_short),
                                    static_cast<std::size_t>(params_.n_mels),
                                    static_cast<std::size_t>(params_.n_frames)}),
                          b.first);
  }
  /// Windows of the file.
  int64_t count() const { return windows_->plan().count; }

 private:
  featurize::DatasetParams params_;
  std::unique_ptr<windows::FileWindows> windows_;
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
           "naming the file when it cannot be used.")
      .def(
          "windows",
          [](PyFeaturizer& f, const std::string& path, double hop_seconds, int64_t batch_windows) {
            return new PyFileWindows(f, path, hop_seconds, batch_windows);
          },
          nb::arg("path"), nb::arg("hop_seconds") = 0.0, nb::arg("batch_windows") = 128, nb::keep_alive<0, 1>(),
          "The whole-file windows of `path` (kernels/windows, as melforge-train predict): one long segment every "
          "hop_seconds (0: long_seconds), read as a stream a batch at a time; raises AudioError naming the file "
          "when it cannot be opened or is too short, InvalidArgument for a bad hop.");
  nb::class_<PyFileWindows>(m, "FileWindows", "The windows of one file, from Featurizer.windows().")
      .def("times", &PyFileWindows::times, "(start, end) seconds, float64 [count] each.")
      .def("next", &PyFileWindows::next,
           "(float32 [n, num_short, n_mels, n_frames], first window index) of the next batch, or None at the end; "
           "raises AudioError when the file turns out unreadable.")
      .def_prop_ro("count", &PyFileWindows::count, "Number of windows.");
}

}  // namespace melforge::python
