#include "models/model.h"

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>

#include <ATen/ops/where.h>

#include <cmath>
#include <limits>
#include <vector>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "models/cnn.h"
#include "models/crnn.h"
#include "models/ecapa.h"
#include "models/resnet_se.h"
#include "models/time_mask.h"
#include "options.h"
#include "util.h"

namespace melforge::trainer {

Classifier::Classifier() {
  input_mean_ = register_buffer("input_mean", at::zeros({}, at::kFloat));
  input_std_ = register_buffer("input_std", at::ones({}, at::kFloat));
}

void Classifier::set_input_normalization(double mean, double std) {
  if (!std::isfinite(mean) || !std::isfinite(std) || !(std > 0))
    throw InvalidArgument("input normalisation needs a finite mean and a finite std > 0, got mean " +
                          std::to_string(mean) + ", std " + std::to_string(std));
  at::NoGradGuard no_grad;
  input_mean_.fill_(mean);
  input_std_.fill_(std);
}

nlohmann::json Classifier::config_json() const {
  nlohmann::json j = architecture_json();
  j["cmn"] = cmn_;
  return j;
}

at::Tensor Classifier::normalize_input(const at::Tensor& x, const at::Tensor& lengths) const {
  if (cmn_) return cepstral_mean_normalize(x, lengths);
  return (x - input_mean_.to(x.scalar_type())) / input_std_.to(x.scalar_type());
}

at::Tensor cepstral_mean_normalize(const at::Tensor& x, const at::Tensor& lengths) {
  if (!lengths.defined()) return x - x.mean(-1, /*keepdim=*/true);
  std::vector<int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape.front() = x.size(0);
  shape.back() = x.size(-1);
  const at::Tensor mask = time_mask(lengths, x.size(-1)).view(shape);
  shape.back() = 1;
  const at::Tensor n = lengths.view(shape).to(x.scalar_type());
  const at::Tensor mean = at::where(mask, x, 0).sum(-1, /*keepdim=*/true) / n;
  return at::where(mask, x - mean, 0);
}

at::Tensor spectrogram_input(const at::Tensor& x, int64_t n_mels, int64_t min_frames, int64_t max_frames,
                             const std::string& model) {
  const bool ok = (x.dim() == 3 || (x.dim() == 4 && x.size(1) == 1)) && x.size(-2) == n_mels &&
                  x.size(-1) >= min_frames && x.size(-1) <= max_frames;
  if (!ok) {
    const std::string t = min_frames == max_frames ? std::to_string(min_frames) : "T";
    const std::string where = min_frames == max_frames ? ""
                              : max_frames == std::numeric_limits<int64_t>::max()
                                  ? " with T >= " + std::to_string(min_frames)
                                  : " with " + std::to_string(min_frames) + " <= T <= " + std::to_string(max_frames);
    throw InvalidArgument(model + ": input of shape " + shape_text(x.sizes()) + ", expected [B, " +
                          std::to_string(n_mels) + ", " + t + "] or [B, 1, " + std::to_string(n_mels) + ", " + t +
                          "]" + where);
  }
  return x.dim() == 3 ? x.unsqueeze(1) : x;
}

namespace {

CnnConfig cnn_config(const ModelOptions& opts, const MelInfo& info, int64_t num_classes) {
  CnnConfig c = CnnConfig::from_info(info, num_classes);
  c.hidden = opts.hidden;
  c.dropout = opts.dropout;
  return c;
}

CrnnConfig crnn_config(const ModelOptions& opts, const MelInfo& info, int64_t num_classes) {
  CrnnConfig c = CrnnConfig::from_info(info, num_classes);
  c.rnn = opts.rnn;
  c.rnn_hidden = opts.rnn_hidden;
  c.hidden = opts.hidden;
  c.dropout = opts.dropout;
  return c;
}

ResNetSEConfig resnet_se_config(const ModelOptions& opts, const MelInfo& info, int64_t num_classes) {
  ResNetSEConfig c = ResNetSEConfig::from_info(info, num_classes);
  c.width = opts.width;
  c.embedding_dim = opts.embedding_dim;
  return c;
}

EcapaConfig ecapa_config(const ModelOptions& opts, const MelInfo& info, int64_t num_classes) {
  EcapaConfig c = EcapaConfig::from_info(info, num_classes);
  c.channels = opts.channels;
  c.embedding_dim = opts.embedding_dim;
  return c;
}

}  // namespace

bool is_speaker_model(const std::string& model) { return model == "resnet-se" || model == "ecapa"; }

ModelSize model_size(const ModelOptions& given, const MelInfo& info, int64_t num_classes) {
  const ModelOptions opts = given.resolved("multiclass");
  opts.validate();
  if (opts.model == "cnn") return cnn_config(opts, info, num_classes).size();
  if (opts.model == "crnn") return crnn_config(opts, info, num_classes).size();
  if (opts.model == "resnet-se") {
    const ResNetSEConfig c = resnet_se_config(opts, info, num_classes);
    c.validate();
    return c.size();
  }
  if (opts.model == "ecapa") {
    const EcapaConfig c = ecapa_config(opts, info, num_classes);
    c.validate();
    return c.size();
  }
  throw InvalidArgument("--model: unknown model '" + opts.model + "'");
}

namespace {

std::shared_ptr<Classifier> make_architecture(const ModelOptions& opts, const MelInfo& info, int64_t num_classes) {
  if (opts.model == "cnn") return std::make_shared<CnnNetImpl>(cnn_config(opts, info, num_classes));
  if (opts.model == "crnn") return std::make_shared<CrnnNetImpl>(crnn_config(opts, info, num_classes));
  if (opts.model == "resnet-se")
    return std::make_shared<ResNetSEImpl>(resnet_se_config(opts, info, num_classes));
  if (opts.model == "ecapa") return std::make_shared<EcapaImpl>(ecapa_config(opts, info, num_classes));
  throw InvalidArgument("--model: unknown model '" + opts.model + "'");
}

}  // namespace

std::shared_ptr<Classifier> make_model(const ModelOptions& given, const MelInfo& info, int64_t num_classes) {
  const ModelOptions opts = given.resolved("multiclass");
  opts.validate();
  at::manual_seed(opts.seed);
  std::shared_ptr<Classifier> model = make_architecture(opts, info, num_classes);
  model->set_cmn(opts.cmn == "on");
  return model;
}

std::shared_ptr<Classifier> make_model_from_json(const nlohmann::json& config, bool any_task) {
  if (config.contains("task") && config["task"] != "multiclass" && !any_task)
    throw FormatError("the checkpoint was trained with --task " +
                      utf8::for_terminal(config["task"].is_string() ? config["task"].get<std::string>()
                                                                    : config["task"].dump(),
                                         60) +
                      ": this command supports --task multiclass checkpoints only (melforge-train eval evaluates "
                      "a multilabel or verification checkpoint, embed gives a verification model's embeddings)");
  const bool cmn = model_cmn(config);
  const std::string kind = config.contains("model") && config["model"].is_string() ? config["model"].get<std::string>() : "";
  std::shared_ptr<Classifier> model;
  if (kind == "cnn") model = std::make_shared<CnnNetImpl>(CnnConfig::from_json(config));
  else if (kind == "crnn") model = std::make_shared<CrnnNetImpl>(CrnnConfig::from_json(config));
  else if (kind == "resnet-se") model = std::make_shared<ResNetSEImpl>(ResNetSEConfig::from_json(config));
  else if (kind == "ecapa") model = std::make_shared<EcapaImpl>(EcapaConfig::from_json(config));
  else throw FormatError("model configuration names an unknown model '" + kind + "'");
  model->set_cmn(cmn);
  return model;
}

bool model_cmn(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("cmn")) return false;
  if (!config["cmn"].is_boolean())
    throw FormatError("model configuration: 'cmn' is " + utf8::for_terminal(config["cmn"].dump(), 60) +
                      ", not true or false");
  return config["cmn"].get<bool>();
}

namespace {

/// Throws FormatError naming `field` unless `v` is an integer in [1, kMaxModelWidth].
void check_width(const nlohmann::json& v, const std::string& field) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxModelWidth)
    throw FormatError("model configuration: '" + field + "' is " + utf8::for_terminal(v.dump(), 60) +
                      ", not an integer from 1 to " + std::to_string(kMaxModelWidth));
}

}  // namespace

ModelSize model_size_from_json(const nlohmann::json& config) {
  if (!config.is_object()) throw FormatError("model configuration is not a JSON object");
  for (const char* field : {"n_mels", "n_frames", "num_classes", "hidden", "rnn_hidden", "embedding_dim", "channels"}) {
    if (!config.contains(field)) continue;
    const nlohmann::json& v = config.at(field);
    if (!v.is_array()) {
      check_width(v, field);
      continue;
    }
    if (v.size() > 8) throw FormatError("model configuration: '" + std::string(field) + "' has " +
                                        std::to_string(v.size()) + " entries");
    for (std::size_t i = 0; i < v.size(); ++i) check_width(v[i], std::string(field) + "[" + std::to_string(i) + "]");
  }
  if (config.contains("dropout") &&
      (!config["dropout"].is_number() || !(config["dropout"].get<double>() >= 0 && config["dropout"].get<double>() < 1)))
    throw FormatError("model configuration: 'dropout' is " + utf8::for_terminal(config["dropout"].dump(), 60) +
                      ", not a number in [0, 1)");
  model_cmn(config);
  const std::string kind = config.contains("model") && config["model"].is_string() ? config["model"].get<std::string>() : "";
  if (kind == "cnn") return CnnConfig::from_json(config).size();
  if (kind == "crnn") return CrnnConfig::from_json(config).size();
  if (kind == "resnet-se") return ResNetSEConfig::from_json(config).size();
  if (kind == "ecapa") return EcapaConfig::from_json(config).size();
  throw FormatError("model configuration names an unknown model '" + utf8::for_terminal(kind, 60) + "'");
}

}  // namespace melforge::trainer

#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/cross_entropy_loss.h>

namespace melforge::trainer {

at::Tensor combined_loss(const ModelOutput& out, const at::Tensor& labels, int64_t positive_class, double bce_weight,
                         const at::Tensor& pos_weight) {
  const at::Tensor ce = at::cross_entropy_loss(out.logits.to(at::kFloat), labels);
  if (bce_weight == 0.0 || positive_class < 0) return ce;
  const at::Tensor target = labels.eq(positive_class).to(at::kFloat);
  const at::Tensor bce = at::binary_cross_entropy_with_logits(out.detection.to(at::kFloat), target, {}, pos_weight);
  return ce + bce * bce_weight;
}

}  // namespace melforge::trainer
