#pragma once
/// What the evaluations (evaluate, evaluate_multilabel, embed_split) share: the model's training mode restored on
/// scope exit, the evaluation view of a split (every frame of every clip in an example), its examples cut into
/// forward passes, and the pass over them (the next batch gathered while the model runs on this one).
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "views/clips.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::trainer {

struct Split;
struct ExampleBatch;
class Classifier;
struct ModelOutput;

/// Restores the module's training mode on scope exit.
class ModeGuard {
 public:
  /// Remembers `m`'s training mode.
  explicit ModeGuard(torch::nn::Module& m) : module_(m), training_(m.is_training()) {}
  ~ModeGuard() { module_.train(training_); }
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool training_;
};

/// How much of a split an evaluation scored (report.json's "coverage"): every clip, and the frames of each clip that
/// are a real frame of at least one example.
struct Coverage {
  /// The evaluation view's name (`tiles` or `clips`) and its example length in frames (tiles; 0 for whole clips).
  std::string view;
  int64_t example_frames = 0;
  /// Clips of the split, and clips with at least one example (scored).
  int64_t clips = 0;
  int64_t clips_scored = 0;
  /// Examples (forward-pass rows), and the padded frames among their positions (masked: never a vote).
  int64_t examples = 0;
  int64_t padded_frames = 0;
  /// Frames of every clip, and frames that are a real frame of some example.
  int64_t frames = 0;
  int64_t frames_covered = 0;
  /// Seconds of audio of every clip (num_samples / sample_rate), and of the scored clips.
  double seconds = 0;
  double seconds_scored = 0;
  /// Forward passes (batches) the examples take.
  int64_t batches = 0;

  /// frames_covered / frames (1 when every frame of every clip is in an example).
  double fraction() const { return frames > 0 ? static_cast<double>(frames_covered) / static_cast<double>(frames) : 1; }
  /// {"view", "example_frames", "clips", "clips_scored", "examples", "padded_frames", "frames", "frames_covered",
  /// "fraction", "seconds", "seconds_scored", "batches"}.
  nlohmann::json to_json() const;
};

/// The examples an evaluation runs and how they are cut into forward passes.
struct EvalPlan {
  /// The evaluation view's examples, clip by clip (every clip has at least one).
  std::vector<data::views::Example> examples;
  /// Forward passes: indices into `examples` and the length every row is padded to. Tiles: consecutive runs of at
  /// most batch_size examples (length: the tile); whole clips: views::batch_by_length under the view's frame budget.
  std::vector<data::views::ClipBatch> batches;
  /// What the examples cover.
  Coverage coverage;
};

/// The view options an evaluation of a model of kind `model_kind` (Classifier::kind) trained through `trained`
/// (resolved view options, resolve_view_options) reads `split` with: whole clips for the speaker models of a
/// schema-3 split (masked pooling over each whole utterance), else tiles (crops become tiles of the crop length,
/// tiles keep their length and hop); split_view(..., evaluation = true) then sets min_real 0.
data::views::ViewOptions evaluation_view_options(const data::views::ViewOptions& trained, const Split& split,
                                                 const std::string& model_kind);

/// Plans the evaluation of `split` through `options` (evaluation_view_options; min_real forced to 0 by split_view):
/// every clip's examples, cut into passes of at most `batch_size` examples (tiles) or of at most the view's
/// clip_batch_seconds of padded frames (whole clips), and their coverage. Throws InvalidArgument for a batch size
/// below 1, FormatError when a clip has no example (every clip must be scored).
EvalPlan plan_evaluation(const Split& split, const data::views::ViewOptions& options, int64_t batch_size);

/// First frames of `count` (>= 1) evenly spaced crops of `crop` frames (>= 1) in a clip of `clip_frames` frames:
/// floor(i (clip_frames - crop) / (count - 1)) for i in [0, count) (0 for one crop), so the first starts at 0 and
/// the last ends at the clip's end (numpy.linspace(0, clip_frames - crop, count) truncated, as the VoxCeleb trainer);
/// starts may repeat in a clip barely longer than a crop. A clip no longer than a crop: {0} (one crop, the clip).
std::vector<int64_t> crop_starts(int64_t clip_frames, int64_t crop, int64_t count);

/// Plans `--embed-crops`: for every clip of `split`, crop_starts' crops of `crop_frames` frames (a clip no longer
/// than a crop: one example, the whole clip), batched by length under `clip_batch_seconds` of padded frames
/// (views::batch_by_length), with their coverage (view "embed-crops"). Throws InvalidArgument when count or
/// crop_frames is below 1.
EvalPlan plan_crops(const Split& split, int64_t crop_frames, int64_t count, double clip_batch_seconds);

/// Gathers the plan's batches on the CPU (gather_examples, the split's pad value) and calls `fn` on each in order,
/// the next one gathered on another thread while `fn` runs.
void for_each_batch(const Split& split, const EvalPlan& plan, const std::function<void(const ExampleBatch&)>& fn);

/// The model's forward over a batch's rows with their real lengths (`x` and `lengths` moved to `device`). A model of
/// one fixed input width (Classifier::fixed_frames: a flatten CNN, a checkpoint from before inputs of any length)
/// cannot mask: it gets no lengths and reads a padded tile's padding as the silence it holds, as it was trained.
ModelOutput forward_batch(Classifier& model, const ExampleBatch& batch, at::Device device);

/// The model input width a classifier was built for (its config_json()'s "n_frames"), or 0 when it records none.
int64_t model_frames(const Classifier& model);

/// Throws InvalidArgument when the plan's tiles are not the model's input width (model_frames): a model is evaluated
/// through the view it was trained through. Whole clips pass (any length).
void check_model_frames(const Classifier& model, const EvalPlan& plan);

}  // namespace melforge::trainer
