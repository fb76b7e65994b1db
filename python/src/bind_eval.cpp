/// The clip vote and metrics of `melforge-train eval` (kernels/vote, kernels/metrics) for melforge.evaluate_files,
/// and the input listing, whole-clip features and tiles of `melforge-train predict` for melforge.predict.
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
#include "featurize/clip_features.h"
#include "featurize/featurize.h"
#include "inputs/inputs.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "metrics/metrics.h"
#include "views/view.h"
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

nb::tuple vote_clips(nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> probs,
                     nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> det_probs, LongIn clip,
                     int64_t clips, const std::string& vote_name, double threshold) {
  const vote::Vote v = vote::parse_vote(vote_name);
  const auto C = static_cast<int64_t>(probs.shape(1));
  vote::FileVotes out;
  {
    nb::gil_scoped_release release;
    out = vote::vote_clips({probs.data(), probs.size()}, {det_probs.data(), det_probs.size()},
                           {clip.data(), clip.size()}, clips, C, v, threshold);
  }
  const auto F = static_cast<std::size_t>(clips), Cs = static_cast<std::size_t>(C);
  return nb::make_tuple(to_numpy(std::move(out.class_probs), {F, Cs}), to_numpy(std::move(out.predicted), {F}),
                        to_numpy(std::move(out.detection_score), {F}), to_numpy(std::move(out.detected), {F}));
}

/// vote::multilabel_clips: (scores float32 [clips, C], labels uint8 [clips, C]).
nb::tuple multilabel_clips(nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> probs, LongIn clip,
                           int64_t clips, const std::string& aggregate, double threshold) {
  const vote::Aggregate how = vote::parse_aggregate(aggregate);
  const auto C = static_cast<int64_t>(probs.shape(1));
  vote::ClipLabels out;
  {
    nb::gil_scoped_release release;
    out = vote::multilabel_clips({probs.data(), probs.size()}, {clip.data(), clip.size()}, clips, C, how, threshold);
  }
  const auto F = static_cast<std::size_t>(clips), Cs = static_cast<std::size_t>(C);
  return nb::make_tuple(to_numpy(std::move(out.scores), {F, Cs}), to_numpy(std::move(out.labels), {F, Cs}));
}

/// featurize::ClipFeaturizer for Python: built from the "mel" JSON text (a checkpoint's or an export's), returns
/// NumPy arrays.
class PyClipFeaturizer {
 public:
  PyClipFeaturizer(const std::string& mel_json, int threads) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(mel_json);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(std::string("mel parameters: not valid JSON: ") + e.what());
    }
    const data::MelInfo info = data::MelInfo::from_json(j);
    pad_value_ = mel::silence_value(info.mel_args());
    nb::gil_scoped_release release;
    featurizer_ = std::make_unique<featurize::ClipFeaturizer>(info.mel_args(), mel::parse_dtype(info.dtype),
                                                              static_cast<int>(info.channel), threads);
  }
  /// (float32 [frames, n_mels], samples) of one file.
  nb::tuple call(const std::string& path) {
    featurize::ClipFeatures f;
    {
      nb::gil_scoped_release release;
      f = (*featurizer_)(path);
    }
    const auto T = static_cast<std::size_t>(f.n_frames), M = static_cast<std::size_t>(f.n_mels);
    return nb::make_tuple(to_numpy(std::move(f.frames), {T, M}), f.num_samples);
  }
  float pad_value() const { return pad_value_; }

 private:
  std::unique_ptr<featurize::ClipFeaturizer> featurizer_;
  float pad_value_ = 0;
};

/// (start, real) int64 [W] each: the tiles of `tile` frames every `hop` frames, min_real 0, over a clip of
/// `clip_frames` frames (data::views::make_tiles_view_frames, the view predict and eval read).
nb::tuple tile_examples(int64_t clip_frames, int64_t tile, int64_t hop) {
  const std::vector<data::views::Example> ex =
      data::views::make_tiles_view_frames(tile, hop, 0.0)->examples(std::vector<int64_t>{clip_frames}, 0, 0);
  std::vector<int64_t> start, real;
  for (const auto& e : ex) {
    start.push_back(e.start);
    real.push_back(e.real);
  }
  const auto n = ex.size();
  return nb::make_tuple(to_numpy(std::move(start), {n}), to_numpy(std::move(real), {n}));
}

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
  m.def("vote_clips", &vote_clips, nb::arg("probs"), nb::arg("det_probs"), nb::arg("clip"), nb::arg("clips"),
        nb::arg("vote"), nb::arg("threshold"),
        "Clip vote of melforge-train eval over any number of examples per clip (kernels/vote vote_clips): probs "
        "float32 [E, C], det_probs float32 [E] (or empty), clip int64 [E] in [0, clips) -> (class_probs float32 "
        "[clips, C], predicted int64, detection_score float32, detected uint8 [clips]); every clip needs an example.");
  m.def("multilabel_clips", &multilabel_clips, nb::arg("probs"), nb::arg("clip"), nb::arg("clips"),
        nb::arg("aggregate"), nb::arg("threshold"),
        "Multi-label clip scores of melforge-train predict (kernels/vote multilabel_clips): probs float32 [E, C] "
        "(sigmoid), clip int64 [E] in [0, clips), aggregate mean|max -> (scores float32 [clips, C], labels uint8 "
        "[clips, C]: score >= threshold); every clip needs an example.");
  m.def("tile_examples", &tile_examples, nb::arg("clip_frames"), nb::arg("tile"), nb::arg("hop"),
        "(start, real) int64 [W] of the tiles (tile frames every hop, min_real 0: every frame) over one clip.");
  nb::class_<PyClipFeaturizer>(m, "ClipFeaturizer",
                               "The log-mel frames of whole audio files as a schema-3 dataset with the given \"mel\" "
                               "parameters stores them (kernels/featurize ClipFeaturizer, as melforge-train predict).")
      .def(nb::init<const std::string&, int>(), nb::arg("mel_json"), nb::arg("threads") = 0)
      .def("__call__", &PyClipFeaturizer::call, nb::arg("path"),
           "(float32 [frames, n_mels], samples) of one file; raises AudioError naming the file when it cannot be "
           "decoded.")
      .def_prop_ro("pad_value", &PyClipFeaturizer::pad_value, "The value of a padded frame position (silence).");
}

}  // namespace melforge::python
