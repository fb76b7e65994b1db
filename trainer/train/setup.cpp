#include "train/setup.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "data/dataset.h"
#include "eval/batching.h"
#include "eval/multilabel.h"
#include "melforge/common/h5.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
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
  log.info("no --positive-class and no class named 'leak': the detection head detects '" +
           utf8::for_terminal(d.class_names[0], 80) +
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

int64_t evaluation_clip_frames(const TrainConfig& config, const Dataset& meta) {
  if (evaluation_view_options(config.view, meta.val, config.model.model).view != "clips") return 0;
  int64_t longest = 0;
  for (const Split* split : {&meta.val, &meta.test})
    for (const int64_t frames : split->clip_frame_counts()) longest = std::max(longest, frames);
  return std::max(frame_rate(meta.info).frames(config.view.clip_batch_seconds), longest);
}

namespace {

/// Input floats of one evaluation pass (training_memory_bytes).
double evaluation_floats(const TrainConfig& config, const MelInfo& info, int64_t eval_clip_frames) {
  const double frames = eval_clip_frames > 0
                            ? static_cast<double>(eval_clip_frames)
                            : static_cast<double>(config.eval.batch_size) * static_cast<double>(info.n_frames);
  return frames * static_cast<double>(info.n_mels);
}

/// Floats of one training batch's activations, kept for backward and again as gradients.
double training_floats(const TrainConfig& config, const ModelSize& size) {
  return 2 * static_cast<double>(config.loader.batch_size) * size.activation_floats;
}

/// The width flags of `m`'s model with their values ("--width half, --embedding-dim 192").
std::string width_values(const ModelOptions& m) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (m.model == "resnet-se") return "--width " + m.width + ", --embedding-dim " + n(m.embedding_dim);
  if (m.model == "ecapa") return "--channels " + n(m.channels) + ", --embedding-dim " + n(m.embedding_dim);
  if (m.model == "crnn") return "--hidden " + n(m.hidden) + ", --rnn-hidden " + n(m.rnn_hidden);
  return "--hidden " + n(m.hidden);
}

/// The numeric width flags of `m`'s model that lower its size.
std::vector<std::string> width_flags(const ModelOptions& m) {
  if (m.model == "resnet-se") return {"--embedding-dim"};
  if (m.model == "ecapa") return {"--channels", "--embedding-dim"};
  if (m.model == "crnn") return {"--hidden", "--rnn-hidden"};
  return {"--hidden"};
}

/// "a", "a or b", "a, b or c".
std::string either(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

}  // namespace

double training_memory_bytes(const TrainConfig& config, const MelInfo& info, int64_t num_classes, bool cuda,
                             int64_t eval_clip_frames) {
  const ModelSize size = model_size(config.model, info, num_classes);
  if (cuda) return size.parameters * 12;
  const double floats = std::max(training_floats(config, size), evaluation_floats(config, info, eval_clip_frames));
  return size.parameters * 16 + floats * sizeof(float);
}

nlohmann::json dataset_identity(const Dataset& meta) {
  std::string names;
  for (const auto& n : meta.class_names) names += n + '\n';
  uint64_t digest = 1469598103934665603ull;
  for (const char ch : names) digest = (digest ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  nlohmann::json out = nlohmann::json::object();
  for (const auto& name : kSplitNames) {
    const Split& s = meta.split(name);
    nlohmann::json j = {{"clips", s.files()}, {"frames", s.total_frames()}, {"classes", meta.num_classes()},
                        {"class_names_fnv1a", hex}};
    if (!s.meta.build_id.empty()) j["build_id"] = s.meta.build_id;
    out[name] = j;
  }
  return out;
}

std::vector<std::string> dataset_changes(const nlohmann::json& then, const nlohmann::json& now) {
  std::vector<std::string> out;
  const auto text = [](const nlohmann::json& v) {
    return v.is_string() ? "'" + utf8::for_terminal(v.get<std::string>(), 80) + "'" : utf8::for_terminal(v.dump(), 80);
  };
  for (const auto& [split, fields] : now.items()) {
    if (!then.contains(split) || !then[split].is_object()) {
      out.push_back(split + " split: not recorded then");
      continue;
    }
    for (const char* key : {"build_id", "clips", "frames", "classes", "class_names_fnv1a"}) {
      const nlohmann::json a = then[split].value(key, nlohmann::json()), b = fields.value(key, nlohmann::json());
      if (a == b) continue;
      const std::string what = std::string(key) == "class_names_fnv1a" ? "class names (digest)" : key;
      out.push_back(split + " split: " + (a.is_null() ? "no " + what : text(a) + " " + what) + " then, " +
                    (b.is_null() ? "none" : text(b)) + " now");
    }
  }
  return out;
}

double confusion_memory_bytes(int64_t num_classes) {
  return 4.0 * static_cast<double>(num_classes) * static_cast<double>(num_classes) * 8;
}

void check_confusion_memory(int64_t num_classes, int64_t available_bytes, const std::string& what) {
  const double need = confusion_memory_bytes(num_classes);
  if (available_bytes < 0 || need <= static_cast<double>(available_bytes) / 2) return;
  throw InvalidArgument(fmt("%s has %lld classes: evaluation counts a %lld x %lld confusion matrix, and its copies "
                            "take about %.1f GiB, more than half of the %.1f GiB available (MemAvailable); merge "
                            "classes or free memory",
                            what.c_str(), static_cast<long long>(num_classes), static_cast<long long>(num_classes),
                            static_cast<long long>(num_classes), need / (1 << 30),
                            static_cast<double>(available_bytes) / (1 << 30)));
}

void check_training_memory(const TrainConfig& config, const MelInfo& info, int64_t num_classes, bool cuda,
                           int64_t available_bytes, int64_t eval_clip_frames) {
  if (config.train.task == kTaskMulticlass)
    check_confusion_memory(num_classes, available_bytes, "the dataset " + config.data.data.string());
  const double need = training_memory_bytes(config, info, num_classes, cuda, eval_clip_frames);
  if (available_bytes < 0 || need <= static_cast<double>(available_bytes)) return;
  const ModelSize size = model_size(config.model, info, num_classes);
  const double gib = 1 << 30;
  std::vector<std::string> lower = width_flags(config.model);
  std::string what = "12 bytes a parameter for the checkpoints' host copies of the weights and AdamW's moments";
  if (!cuda) {
    const double train = training_floats(config, size) * sizeof(float);
    const double eval = evaluation_floats(config, info, eval_clip_frames) * sizeof(float);
    const std::string example = config.view.view == "crops" ? "--crop-seconds" : "--tile-seconds";
    const std::string eval_flag = eval_clip_frames > 0 ? "--clip-batch-seconds" : "--eval-batch-size";
    what = fmt("16 bytes a parameter for the weights, gradients and AdamW's two moments, plus the larger of a "
               "training batch's activations, %.1f GiB (--batch-size %lld, %s), and an evaluation batch's inputs, "
               "%.1f GiB (inference, no stored activations: %s)",
               train / gib, static_cast<long long>(config.loader.batch_size), example.c_str(), eval / gib,
               eval_flag.c_str());
    if (train >= eval) lower.insert(lower.end(), {"--batch-size", example});
    else lower.push_back(eval_flag);
  }
  const bool half = config.model.model == "resnet-se" && config.model.width == "half";
  throw InvalidArgument(fmt(
      "the model (--model %s, %s) has %.3g parameters: training it needs about %.1f GiB of memory (%s), more than "
      "the %.1f GiB available (MemAvailable); lower %s%s",
      config.model.model.c_str(), width_values(config.model).c_str(), size.parameters, need / gib, what.c_str(),
      static_cast<double>(available_bytes) / gib, either(lower).c_str(), half ? " (or give --width quarter)" : ""));
}

double inference_memory_bytes(const ModelSize& size, const nlohmann::json& model_config, int64_t batch) {
  const auto dim = [&](const char* field) {
    return model_config.contains(field) && model_config[field].is_number_integer()
               ? static_cast<double>(model_config[field].get<int64_t>())
               : 0.0;
  };
  return size.parameters * 8 + static_cast<double>(std::max<int64_t>(batch, 0)) * dim("n_mels") * dim("n_frames") * 4;
}

ModelSize check_checkpoint_model(const Checkpoint& c, const std::string& path, const std::string& command,
                                 int64_t batch, const std::string& batch_flag, int64_t available_bytes) {
  const std::string what = "checkpoint '" + utf8::for_terminal(path) + "'";
  ModelSize size;
  try {
    size = model_size_from_json(c.model_config);
  } catch (const FormatError& e) {
    throw FormatError(what + ": entry 'model_config': " + e.what());
  }
  double stored = 0;
  for (const auto& [name, t] : c.model) {
    stored += static_cast<double>(t.numel());
    const bool counter = name.size() >= 19 && name.compare(name.size() - 19, 19, "num_batches_tracked") == 0;
    if (t.scalar_type() != (counter ? at::kLong : at::kFloat))
      throw FormatError(what + ": entry 'model." + utf8::for_terminal(name, 80) + "' has dtype " +
                        c10::toString(t.scalar_type()) + ", not " + (counter ? "Long" : "Float") +
                        " as every melforge model's");
  }
  if (size.parameters > 1.5 * stored + 65536)
    throw FormatError(fmt("%s: entry 'model_config' describes a model of %.3g parameters, but entry 'model' stores "
                          "%.3g values: the file is corrupt or crafted",
                          what.c_str(), size.parameters, stored));
  if (command == "eval" && model_task(c.model_config) == kTaskMulticlass && c.model_config.contains("num_classes") &&
      c.model_config["num_classes"].is_number_integer())
    check_confusion_memory(c.model_config["num_classes"].get<int64_t>(), available_bytes, what);
  const double need = inference_memory_bytes(size, c.model_config, batch);
  if (available_bytes < 0 || need <= static_cast<double>(available_bytes)) return size;
  const double gib = 1 << 30;
  throw InvalidArgument(fmt(
      "%s: %s needs about %.1f GiB of memory for its model of %.3g parameters (4 bytes a parameter for the model "
      "and again for the checkpoint's copy%s), more than the %.1f GiB available (MemAvailable); %s",
      what.c_str(), command.c_str(), need / gib, size.parameters, batch > 0 ? ", plus a batch of inputs" : "",
      static_cast<double>(available_bytes) / gib,
      batch_flag.empty() ? "free memory or use a smaller model"
                         : ("lower " + batch_flag + " or free memory").c_str()));
}

void check_checkpoint_fits(const Checkpoint& c, const MelInfo& info, const std::vector<std::string>& class_names,
                           const std::string& what, const std::string& dataset, bool same_classes) {
  const MelInfo saved = MelInfo::from_json(c.mel);
  const std::string diff = saved.first_difference(info, "the checkpoint " + what, "the dataset " + dataset);
  if (!diff.empty()) throw FormatError("checkpoint does not fit the dataset: " + diff);
  if (same_classes && c.class_names != class_names)
    throw FormatError("checkpoint does not fit the dataset: the checkpoint " + what + " has classes [" +
                      utf8::for_terminal(join(c.class_names), 400) + "] but the dataset " + utf8::for_terminal(dataset) +
                      " has [" + utf8::for_terminal(join(class_names), 400) + "]");
}

}  // namespace melforge::trainer
