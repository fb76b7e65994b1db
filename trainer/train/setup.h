#pragma once
/// What `train`, `eval` and `bench` set up the same way: the device (CUDA library flags, autocast dtype,
/// channels-last parameters, synchronisation), the positive class of the detection head, the training split's
/// input statistics, and whether a checkpoint fits a dataset.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "reader/mel_info.h"
#include "views/view_options.h"

namespace torch::nn {
class Module;
}

namespace melforge::trainer {

class Logger;
struct Checkpoint;
struct ModelSize;
struct Dataset;
using data::MelInfo;
struct Split;
struct TrainConfig;

/// Everything the model's training step needs on the device.
struct StepSetup {
  /// Where the model, the batches and the loss live.
  at::Device device = at::kCPU;
  /// Autocast dtype: at::kFloat (off), at::kBFloat16 or at::kHalf (amp_dtype()).
  at::ScalarType autocast = at::kFloat;
  /// Label index and name of the detection head's positive class; -1 and "none" without a detection head.
  int64_t positive_index = 0;
  std::string positive_name;
  /// Weight of the BCE's positive term, and the same as a float32 tensor [1] on `device`.
  double pos_weight = 1.0;
  at::Tensor pos_weight_tensor;
};

/// The autocast dtype of --amp: at::kBFloat16 for `bf16`, at::kHalf for `fp16`, at::kFloat otherwise.
at::ScalarType amp_dtype(const std::string& amp);

/// Waits for the work queued on `device` (nothing on the CPU).
void sync_device(const at::Device& device);

/// On CUDA (`cuda`): cuDNN benchmark mode, TF32 convolutions and "high" float32 matmul precision; else nothing.
void configure_cuda(bool cuda);

/// Gives the 4-d parameters of `module` (the convolution weights) the channels-last memory format.
void to_channels_last(torch::nn::Module& module);

/// The `--positive-class` value that switches the detection head off.
inline constexpr const char* kNoPositiveClass = "none";

/// The positive class {index, name}: {-1, "none"} for `none` (no detection head; said on `log`), the one named
/// (`name`; InvalidArgument naming --positive-class when the dataset has no such class), else `leak` when present,
/// else the first class (said on `log`, with how to change it).
std::pair<int64_t, std::string> pick_positive_class(const Dataset& dataset, const std::string& name,
                                                    const Logger& log);

/// {mean, standard deviation} of every value of every frame of `split` (the real frames only: schema 3 stores real
/// frames alone, and a schema-1/2 split's clips are its valid segments), summed in double; standard deviation 1 for
/// an empty or constant split. Reads a streamed split a block of clips at a time.
std::pair<double, double> input_statistics(const Split& split);

/// What a training run reads its training split through.
struct TrainingView {
  /// The --view options, resolved for the split and the model (resolve_view_options) unless the configuration was
  /// already resolved (TrainConfig::view_resolved).
  data::views::ViewOptions options;
  /// The split's parameters with n_frames the view's example length (example_frames): what the model is built for.
  MelInfo model_info;
};

/// The training view of `config` for the training split `train` (metadata suffices), checked before any frame is
/// read (split_view refuses a view the split's schema cannot give). Throws InvalidArgument naming the flag.
TrainingView training_view(const TrainConfig& config, const Split& train);

/// Padded frames of one evaluation pass of `train`'s validation and final evaluation when it embeds whole clips (a
/// speaker model on a schema-3 dataset, evaluation_view_options): the larger of --clip-batch-seconds of frames and
/// the longest clip of the val and test splits (a longer clip is alone in its batch). 0 when the evaluation reads
/// examples of the model's input length in batches of --eval-batch-size (tiles). `config`'s model and view resolved.
int64_t evaluation_clip_frames(const TrainConfig& config, const Dataset& meta);

/// Bytes of host memory training the model of `config` needs at the least: on the CPU 16 bytes a parameter (weights,
/// gradients and AdamW's two moments) plus the larger of a training batch's activations (kept for backward and again
/// as gradients) and an evaluation batch's inputs, charged as inference: evaluation runs without autograd, so its
/// layers' outputs are freed as it goes and only its input is sure to be held whole (--eval-batch-size examples of
/// info.n_frames, or `eval_clip_frames` padded frames of whole clips when it is > 0: evaluation_clip_frames); on
/// CUDA 12 bytes a parameter (the checkpoints' host copies of the weights and moments). Computed from the shapes
/// alone (model_size), before anything is allocated. `config`'s model resolved (ModelOptions::resolved).
double training_memory_bytes(const TrainConfig& config, const MelInfo& info, int64_t num_classes, bool cuda,
                             int64_t eval_clip_frames = 0);

/// Throws InvalidArgument when training_memory_bytes exceeds `available_bytes` (MemAvailable; nothing is checked
/// when it is negative), naming the parameters, the bytes needed and available, and only the flags that change
/// them for this model and run: the model's widths (cnn --hidden; crnn --hidden, --rnn-hidden; resnet-se --width,
/// --embedding-dim; ecapa --channels, --embedding-dim), then on the CPU those of the larger term: --batch-size and
/// the example length (--crop-seconds or --tile-seconds, as the training view) for the training batch,
/// --clip-batch-seconds (whole clips) or --eval-batch-size (tiles) for the evaluation batch.
void check_training_memory(const TrainConfig& config, const MelInfo& info, int64_t num_classes, bool cuda,
                           int64_t available_bytes, int64_t eval_clip_frames = 0);

/// The dataset's identity, recorded in every checkpoint (state "dataset") and compared on --resume: per split
/// {"clips", "frames", "classes", "class_names_fnv1a" (a digest of the class names), "build_id" (the split file's
/// root attribute, when it has one)}.
nlohmann::json dataset_identity(const Dataset& meta);

/// What differs between a recorded dataset identity `then` and `now` (dataset_identity), one line each, e.g.
/// "train split: 24 clips then, 300 now"; empty when nothing differs.
std::vector<std::string> dataset_changes(const nlohmann::json& then, const nlohmann::json& now);

/// Bytes the C x C confusion counts of an evaluation take at the most: the accumulator (segments and files), its
/// copy read back and the metrics' rows, 4 x C^2 int64.
double confusion_memory_bytes(int64_t num_classes);

/// Throws InvalidArgument naming `what` (the dataset or checkpoint), the class count and the bytes when
/// confusion_memory_bytes exceeds half of `available_bytes` (MemAvailable; negative: not checked). Checked before
/// any work by train and eval.
void check_confusion_memory(int64_t num_classes, int64_t available_bytes, const std::string& what);

/// Bytes of host memory running the model of `size` (described by `model_config`) without autograd needs at the
/// least: 8 bytes a parameter (the model's float32 weights and the checkpoint's copy of them) plus a batch of `batch`
/// float inputs of the config's n_mels x n_frames (no activations are kept: evaluation frees each layer's output).
double inference_memory_bytes(const ModelSize& size, const nlohmann::json& model_config, int64_t batch);

/// The checks a command (`command`: "eval", "predict", "embed", "export") makes on a loaded checkpoint before it
/// builds the model: its model_config is bounded (model_size_from_json; FormatError naming `path` and the field),
/// every 'model' tensor is float32 (int64 for a batch norm's num_batches_tracked),
/// describes no more parameters than its 'model' entry stores (FormatError), and the model and a batch of `batch`
/// inputs (inference_memory_bytes) fit in `available_bytes` (MemAvailable; negative: not checked). Otherwise throws
/// InvalidArgument naming the bytes needed and available and, as the only flag to change, `batch_flag` (empty for a
/// command that has none). Returns the model's size.
ModelSize check_checkpoint_model(const Checkpoint& c, const std::string& path, const std::string& command,
                                 int64_t batch, const std::string& batch_flag, int64_t available_bytes);

/// Throws FormatError, naming `what` (the checkpoint) and the dataset folder, unless the checkpoint's mel
/// parameters and (when `same_classes`) class names equal the dataset's. A verification checkpoint's embeddings do
/// not depend on the class set, so its evaluation on another corpus passes `same_classes` false.
void check_checkpoint_fits(const Checkpoint& checkpoint, const MelInfo& info,
                           const std::vector<std::string>& class_names, const std::string& what,
                           const std::string& dataset, bool same_classes = true);

}  // namespace melforge::trainer
