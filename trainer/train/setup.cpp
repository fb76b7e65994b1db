#include "train/setup.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "models/input_statistics.h"
#include "models/model.h"
#include "options.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "util.h"

namespace melforge::trainer {

at::ScalarType amp_dtype(const std::string& amp) {
  if (amp == "bf16") return at::kBFloat16;
  if (amp == "fp16") return at::kHalf;
  return at::kFloat;
}

void sync_device(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

void configure_cuda(bool cuda) {
  if (!cuda) return;
  at::globalContext().setBenchmarkCuDNN(true);
  at::globalContext().setFloat32MatmulPrecision("high");
  at::globalContext().setAllowTF32CuDNN(true);
}

void to_channels_last(torch::nn::Module& module) {
  for (auto& p : module.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
}

std::pair<int64_t, std::string> pick_positive_class(const Dataset& d, const std::string& name, const Logger& log) {
  if (name == kNoPositiveClass) {
    for (const auto& c : d.class_names)
      if (c == kNoPositiveClass)
        log.warn("--positive-class none switches the detection head off; the dataset's class named 'none' is not "
                 "made the detection class");
    log.info("--positive-class none: no detection head (no BCE term in the loss, no detection metrics)");
    return {-1, kNoPositiveClass};
  }
  if (!name.empty()) return {d.class_index(name, "--positive-class"), name};
  for (std::size_t i = 0; i < d.class_names.size(); ++i)
    if (d.class_names[i] == "leak") return {static_cast<int64_t>(i), "leak"};
  log.info("no --positive-class and no class named 'leak': the detection head detects '" + d.class_names[0] +
           "' (the first class); name another with --positive-class NAME, or switch the head off with "
           "--positive-class none");
  return {0, d.class_names[0]};
}

std::pair<double, double> input_statistics(const Split& split) {
  InputStatistics stats;
  const int64_t block_frames = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * std::max<int64_t>(split.info.n_mels, 1)));
  const auto& off = split.meta.frame_offset;
  for (int64_t c0 = 0; c0 < split.files();) {
    int64_t c1 = c0 + 1;
    while (c1 < split.files() && off[static_cast<std::size_t>(c1 + 1)] - off[static_cast<std::size_t>(c0)] <= block_frames)
      ++c1;
    stats.add_frames(split.read_clips(c0, c1 - c0));
    c0 = c1;
  }
  return stats.mean_std();
}

TrainingView training_view(const TrainConfig& config, const Split& train) {
  TrainingView v;
  v.options = config.view_resolved ? config.view
                                   : resolve_view_options(config.view, train, config.model.model, config.given);
  split_view(train, v.options, /*evaluation=*/false);
  v.model_info = train.info;
  v.model_info.n_frames = example_frames(v.options, train);
  return v;
}

double training_memory_bytes(const TrainConfig& config, const MelInfo& info, int64_t num_classes, bool cuda) {
  const ModelSize size = model_size(config.model, info, num_classes);
  if (cuda) return size.parameters * 12;
  const double train_floats = 2 * static_cast<double>(config.loader.batch_size) * size.activation_floats;
  const double eval_floats = static_cast<double>(config.eval.batch_size) * static_cast<double>(info.n_mels) *
                             static_cast<double>(info.n_frames);
  return size.parameters * 16 + std::max(train_floats, eval_floats) * sizeof(float);
}

void check_training_memory(const TrainConfig& config, const MelInfo& info, int64_t num_classes, bool cuda,
                           int64_t available_bytes) {
  const double need = training_memory_bytes(config, info, num_classes, cuda);
  if (available_bytes < 0 || need <= static_cast<double>(available_bytes)) return;
  const ModelSize size = model_size(config.model, info, num_classes);
  const double gib = 1 << 30;
  throw InvalidArgument(fmt(
      "the model (--model %s, --hidden %lld) has %.3g parameters: training it needs about %.1f GiB of memory (%s), "
      "more than the %.1f GiB available (MemAvailable); lower --hidden%s",
      config.model.model.c_str(), static_cast<long long>(config.model.hidden), size.parameters, need / gib,
      cuda ? "12 bytes a parameter for the checkpoints' host copies of the weights and AdamW's moments"
           : "16 bytes a parameter for the weights, gradients and AdamW's two moments, plus the activations of a "
             "batch",
      static_cast<double>(available_bytes) / gib,
      config.model.model == "crnn" ? " or --rnn-hidden" : cuda ? "" : " (or --batch-size, --eval-batch-size)"));
}

void check_checkpoint_fits(const Checkpoint& c, const MelInfo& info, const std::vector<std::string>& class_names,
                           const std::string& what, const std::string& dataset, bool same_classes) {
  const MelInfo saved = MelInfo::from_json(c.mel);
  const std::string diff = saved.first_difference(info, "the checkpoint " + what, "the dataset " + dataset);
  if (!diff.empty()) throw FormatError("checkpoint does not fit the dataset: " + diff);
  if (same_classes && c.class_names != class_names)
    throw FormatError("checkpoint does not fit the dataset: the checkpoint " + what + " has classes [" +
                      join(c.class_names) + "] but the dataset " + dataset + " has [" + join(class_names) + "]");
}

}  // namespace melforge::trainer
