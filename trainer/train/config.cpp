#include "train/config.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <vector>

#include "melforge/common/errors.h"
#include "models/model.h"
#include "train/device_check.h"
#include "util.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

const std::vector<std::string> kBestMetrics = {"val_macro_f1", "val_accuracy", "val_loss", "val_file_accuracy"};
const std::vector<std::string> kMultilabelBestMetrics = {"val_map", "val_map_micro", "val_loss"};
const std::vector<std::string> kVerificationBestMetrics = {"val_eer", "val_min_dcf"};

template <typename T>
void read_field(const nlohmann::json& j, const char* name, T& value, const char* group) {
  if (!j.contains(name)) return;
  try {
    j.at(name).get_to(value);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string(group) + " options: field '" + name + "': " + e.what());
  }
}

nlohmann::json optim_to_json(const OptimOptions& o) {
  return {{"lr", o.lr},
          {"weight_decay", o.weight_decay},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"warmup", o.warmup},
          {"min_lr_ratio", o.min_lr_ratio},
          {"clip_norm", o.clip_norm},
          {"accumulate", o.accumulate},
          {"adamw_impl", o.adamw_impl}};
}

OptimOptions optim_from_json(const nlohmann::json& j) {
  OptimOptions o;
  read_field(j, "lr", o.lr, "optim");
  read_field(j, "weight_decay", o.weight_decay, "optim");
  read_field(j, "beta1", o.beta1, "optim");
  read_field(j, "beta2", o.beta2, "optim");
  read_field(j, "eps", o.eps, "optim");
  read_field(j, "warmup", o.warmup, "optim");
  read_field(j, "min_lr_ratio", o.min_lr_ratio, "optim");
  read_field(j, "clip_norm", o.clip_norm, "optim");
  read_field(j, "accumulate", o.accumulate, "optim");
  read_field(j, "adamw_impl", o.adamw_impl, "optim");
  return o;
}

nlohmann::json eval_to_json(const EvalOptions& o) {
  return {{"split", o.split}, {"batch_size", o.batch_size}, {"vote", o.vote}, {"threshold", o.threshold},
          {"aggregate", o.aggregate}};
}

EvalOptions eval_from_json(const nlohmann::json& j) {
  EvalOptions o;
  read_field(j, "split", o.split, "eval");
  read_field(j, "batch_size", o.batch_size, "eval");
  read_field(j, "vote", o.vote, "eval");
  read_field(j, "threshold", o.threshold, "eval");
  read_field(j, "aggregate", o.aggregate, "eval");
  return o;
}

nlohmann::json augment_to_json(const SpecAugmentOptions& o, const MixupOptions& mixup) {
  return {{"freq_masks", o.freq_masks}, {"freq_width", o.freq_width}, {"time_masks", o.time_masks},
          {"time_width", o.time_width}, {"mixup", mixup.alpha}};
}

SpecAugmentOptions augment_from_json(const nlohmann::json& j) {
  SpecAugmentOptions o;
  read_field(j, "freq_masks", o.freq_masks, "augment");
  read_field(j, "freq_width", o.freq_width, "augment");
  read_field(j, "time_masks", o.time_masks, "augment");
  read_field(j, "time_width", o.time_width, "augment");
  return o;
}

nlohmann::json view_to_json(const data::views::ViewOptions& o, bool resolved) {
  return {{"view", o.view},
          {"tile_seconds", o.tile_seconds},
          {"tile_hop", o.tile_hop},
          {"min_real", o.min_real},
          {"crop_seconds", o.crop_seconds},
          {"short_clips", data::views::to_string(o.short_clips)},
          {"aug_prob", o.aug_prob},
          {"clip_batch_seconds", o.clip_batch_seconds},
          {"resolved", resolved}};
}

data::views::ViewOptions view_from_json(const nlohmann::json& j) {
  data::views::ViewOptions o;
  read_field(j, "view", o.view, "view");
  read_field(j, "tile_seconds", o.tile_seconds, "view");
  read_field(j, "tile_hop", o.tile_hop, "view");
  read_field(j, "min_real", o.min_real, "view");
  read_field(j, "crop_seconds", o.crop_seconds, "view");
  std::string short_clips = data::views::to_string(o.short_clips);
  read_field(j, "short_clips", short_clips, "view");
  try {
    o.short_clips = data::views::parse_short_clips(short_clips);
  } catch (const InvalidArgument& e) {
    throw FormatError(std::string("view options: field 'short_clips': ") + e.what());
  }
  read_field(j, "clip_batch_seconds", o.clip_batch_seconds, "view");
  read_field(j, "aug_prob", o.aug_prob, "view");
  return o;
}

MixupOptions mixup_from_json(const nlohmann::json& j) {
  MixupOptions o;
  read_field(j, "mixup", o.alpha, "augment");
  return o;
}

}  // namespace

void TrainOptions::validate() const {
  if (epochs < 1) throw InvalidArgument("--epochs must be >= 1, got " + std::to_string(epochs));
  if (amp != "off" && amp != "fp16" && amp != "bf16")
    throw InvalidArgument("--amp must be off, fp16 or bf16, got '" + amp + "'");
  if (!(bce_weight >= 0.0) || !std::isfinite(bce_weight))
    throw InvalidArgument("--bce-weight must be a finite number >= 0, got " + std::to_string(bce_weight));
  if (pos_weight != "auto") {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(pos_weight, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != pos_weight.size() || !(v > 0.0) || !std::isfinite(v))
      throw InvalidArgument("--pos-weight must be 'auto' or a positive number, got '" + pos_weight + "'");
  }
  if (patience < 0) throw InvalidArgument("--patience must be >= 0, got " + std::to_string(patience));
  if (task != "multiclass" && task != "multilabel" && task != "verification")
    throw InvalidArgument("--task must be multiclass, multilabel or verification, got '" + task + "'");
  const auto& metrics = multilabel() ? kMultilabelBestMetrics : verification() ? kVerificationBestMetrics : kBestMetrics;
  if (best_metric != "auto" && std::find(metrics.begin(), metrics.end(), best_metric) == metrics.end())
    throw InvalidArgument("--best-metric must be auto or one of " + join(metrics) + " with --task " + task +
                          ", got '" + best_metric + "'");
  if ((multilabel() || verification()) && !positive_class.empty())
    throw InvalidArgument("--positive-class selects the detection head of --task multiclass; --task " + task +
                          " has none (got '" + positive_class + "')");
  if ((multilabel() || verification() || positive_class == "none") && (bce_weight != 1.0 || pos_weight != "auto"))
    throw InvalidArgument("--bce-weight and --pos-weight weigh the detection head, which " +
                          (positive_class == "none" ? std::string("--positive-class none switches off")
                                                    : "--task " + task + " does not have"));
  validate_aam();
  if (profile_steps < 0) throw InvalidArgument("--profile-steps must be >= 0, got " + std::to_string(profile_steps));
  if (reset_heads && init_from.empty()) throw InvalidArgument("--reset-heads needs --init-from");
  if (cuda_graph && amp == "fp16")
    throw InvalidArgument("--cuda-graph cannot be combined with --amp fp16 (the loss scale is host-driven); use bf16");
}

void TrainOptions::validate_aam() const {
  if (!verification() && (margin != 0.2 || scale != 30 || margin_warmup != 0))
    throw InvalidArgument("--margin, --scale and --margin-warmup set the AAM-softmax loss of --task verification");
  if (!(margin >= 0.0 && margin < 1.5707963267948966))
    throw InvalidArgument("--margin must be in [0, pi/2) radians, got " + std::to_string(margin));
  if (!(scale > 0.0) || !std::isfinite(scale))
    throw InvalidArgument("--scale must be a finite number > 0, got " + std::to_string(scale));
  if (!(margin_warmup >= 0.0) || !std::isfinite(margin_warmup))
    throw InvalidArgument("--margin-warmup must be a finite number of epochs >= 0, got " +
                          std::to_string(margin_warmup));
}

std::string TrainOptions::resolved_best_metric() const {
  if (best_metric != "auto") return best_metric;
  return multilabel() ? "val_map" : verification() ? "val_eer" : "val_macro_f1";
}

nlohmann::json TrainOptions::to_json() const {
  return {{"epochs", epochs},         {"amp", amp},           {"positive_class", positive_class},
          {"bce_weight", bce_weight}, {"pos_weight", pos_weight}, {"patience", patience},
          {"best_metric", best_metric}, {"cuda_graph", cuda_graph}, {"channels_last", channels_last},
          {"init_from", init_from.empty() ? std::string() : fs::absolute(init_from).lexically_normal().string()},
          {"reset_heads", reset_heads},
          {"task", task},
          {"margin", margin},
          {"scale", scale},
          {"margin_warmup", margin_warmup}};
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  TrainOptions o;
  read_field(j, "epochs", o.epochs, "train");
  read_field(j, "amp", o.amp, "train");
  read_field(j, "positive_class", o.positive_class, "train");
  read_field(j, "bce_weight", o.bce_weight, "train");
  read_field(j, "pos_weight", o.pos_weight, "train");
  read_field(j, "patience", o.patience, "train");
  read_field(j, "best_metric", o.best_metric, "train");
  read_field(j, "cuda_graph", o.cuda_graph, "train");
  read_field(j, "channels_last", o.channels_last, "train");
  std::string init_from;
  read_field(j, "init_from", init_from, "train");
  o.init_from = init_from;
  read_field(j, "reset_heads", o.reset_heads, "train");
  read_field(j, "task", o.task, "train");
  read_field(j, "margin", o.margin, "train");
  read_field(j, "scale", o.scale, "train");
  read_field(j, "margin_warmup", o.margin_warmup, "train");
  return o;
}

void add_options(po::options_description& desc, TrainOptions& o) {
  desc.add_options()("out", po::value(&o.out)->value_name("RUN"), "run folder to create (must be empty or absent)")(
      "resume", po::value(&o.resume)->value_name("RUN|CKPT"),
      "continue a run (to --epochs N): its folder or a checkpoint in it; its saved configuration is used")(
      "overwrite", po::bool_switch(&o.overwrite), "replace the run files in a non-empty --out folder")(
      "epochs", po::value(&o.epochs)->default_value(o.epochs)->value_name("N"), "epochs to train")(
      "amp", po::value(&o.amp)->default_value(o.amp)->value_name("off|fp16|bf16"),
      "mixed precision (fp16: CUDA only, with loss scaling; bf16: CPU or CUDA)")(
      "positive-class", po::value(&o.positive_class)->value_name("NAME"),
      "class of the detection head (default: 'leak' if present, else the first class; none: no detection head)")(
      "task", po::value(&o.task)->default_value(o.task)->value_name("multiclass|multilabel|verification"),
      "multiclass: one class per file (softmax + detection head); multilabel: sigmoid/BCE over the dataset's "
      "targets matrix; verification: speaker embeddings (--model resnet-se, the default, or ecapa; AAM-softmax), "
      "scored by EER")(
      "margin", po::value(&o.margin)->default_value(o.margin)->value_name("RAD"),
      "verification: additive angular margin of the AAM-softmax loss (radians)")(
      "scale", po::value(&o.scale)->default_value(o.scale)->value_name("S"),
      "verification: scale of the AAM-softmax logits")(
      "margin-warmup", po::value(&o.margin_warmup)->default_value(o.margin_warmup)->value_name("EPOCHS"),
      "verification: raise the margin linearly from 0 over this many epochs (0: full margin at once)")(
      "bce-weight", po::value(&o.bce_weight)->default_value(o.bce_weight)->value_name("W"),
      "weight of the detection head's BCE in the loss")(
      "pos-weight", po::value(&o.pos_weight)->default_value(o.pos_weight)->value_name("auto|W"),
      "weight of the BCE's positive term (auto: negatives/positives in train)")(
      "patience", po::value(&o.patience)->default_value(o.patience)->value_name("N"),
      "stop after N epochs without improvement (0: never)")(
      "best-metric", po::value(&o.best_metric)->default_value(o.best_metric)->value_name("NAME"),
      "auto, val_macro_f1, val_accuracy, val_loss or val_file_accuracy (multilabel: val_map, val_map_micro, "
      "val_loss; verification: val_eer, val_min_dcf; auto: val_macro_f1, multilabel val_map, verification val_eer): "
      "picks best.pt, drives early stopping")(
      "cuda-graph", po::bool_switch(&o.cuda_graph),
      "CUDA: capture forward, backward and optimizer step in a CUDA Graph (implies --drop-last)")(
      "channels-last", po::bool_switch(&o.channels_last), "CUDA: channels-last convolutions")(
      "profile-steps", po::value(&o.profile_steps)->default_value(o.profile_steps)->value_name("N"),
      "write a Chrome trace of the first N training steps to RUN/trace.json")(
      "config", po::value(&o.config)->value_name("FILE"),
      "read options from an INI FILE (`lr = 0.01`) or a run's config.json; flags given override it")(
      "init-from", po::value(&o.init_from)->value_name("CKPT|WEIGHTS"),
      "start a new run from trained weights: a checkpoint (best.pt) or an `export`ed state dict")(
      "reset-heads", po::bool_switch(&o.reset_heads),
      "with --init-from: re-initialise the class and detection heads (allows another class set)")(
      "no-device-check", po::bool_switch(&o.no_device_check),
      "CUDA: skip the check of the first batch's forward pass against a CPU copy of the model")(
      "allow-dataset-change", po::bool_switch(&o.allow_dataset_change),
      "with --resume: continue although the dataset changed since the checkpoint (each change is logged)");
}

void check_model_task(const std::string& model, const std::string& task) {
  if (is_speaker_model(model) && task != kTaskVerification)
    throw InvalidArgument("--model " + model + " is a speaker-embedding model: it trains with --task verification "
                          "(--task " + task + " needs --model cnn or crnn)");
  if (!is_speaker_model(model) && task == kTaskVerification)
    throw InvalidArgument("--task verification trains a speaker-embedding model: --model resnet-se or ecapa "
                          "(resnet-se by default; got --model " + model + ")");
}

void TrainConfig::validate() const {
  check_model_task(model.resolved(train.task).model, train.task);
  if (train.resume.empty()) {
    data.validate();
    if (train.out.empty()) throw InvalidArgument("--out is required: the run folder to create");
  }
  model.validate();
  optim.validate();
  loader.validate();
  view.validate();
  if (view.view == "clips")
    throw InvalidArgument("--view clips gives whole clips of every length; a model trains on examples of one length: "
                          "--view tiles (--tile-seconds) or crops (--crop-seconds)");
  augment.validate();
  mixup.validate();
  eval.validate();
  verify.validate();
  train.validate();
  runtime.validate();
  dist.validate();
  monitor.validate();
  if (train.multilabel() && eval.vote != "mean")
    throw InvalidArgument("--vote applies to --task multiclass; --task multilabel aggregates with --aggregate");
  if (!train.multilabel() && eval.aggregate != "mean")
    throw InvalidArgument("--aggregate applies to --task multilabel; --task " + train.task + " does not use it");
  if (train.verification() && eval.vote != "mean")
    throw InvalidArgument("--vote applies to --task multiclass; --task verification averages each file's embeddings");
  if (train.verification() && mixup.enabled())
    throw InvalidArgument("--mixup mixes class targets; it is not supported with --task verification");
  if (train.cuda_graph && train.margin_warmup > 0)
    throw InvalidArgument("--cuda-graph captures a constant margin: it cannot be combined with --margin-warmup");
  if (!train.verification() && verify.to_json() != VerifyOptions().to_json())
    throw InvalidArgument("--trials, --trial-count, --trial-seed, --as-norm and --cohort-size score --task "
                          "verification");
  if (train.cuda_graph && optim.accumulate != 1)
    throw InvalidArgument("--cuda-graph captures one optimizer step per batch: it needs --accumulate 1");
  if (train.cuda_graph && mixup.enabled())
    throw InvalidArgument("--cuda-graph captures the unmixed loss: it cannot be combined with --mixup (drop one)");
  if (device_check_fault() && train.no_device_check)
    throw InvalidArgument(std::string(kDeviceCheckFaultVariable) + " injects a fault into the device check, which "
                          "--no-device-check skips (unset one)");
}

nlohmann::json TrainConfig::to_json() const {
  return {{"data", data.data.empty() ? std::string() : fs::absolute(data.data).lexically_normal().string()},
          {"stream", data.stream.to_json()},
          {"model", trainer::to_json(model)},
          {"optim", optim_to_json(optim)},
          {"loader", loader.to_json()},
          {"view", view_to_json(view, view_resolved)},
          {"augment", augment_to_json(augment, mixup)},
          {"eval", eval_to_json(eval)},
          {"verify", verify.to_json()},
          {"train", train.to_json()}};
}

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw FormatError("run configuration: not a JSON object");
  TrainConfig c;
  const auto group = [&](const char* name) { return j.contains(name) ? j.at(name) : nlohmann::json::object(); };
  if (j.contains("data") && j["data"].is_string()) c.data.data = j["data"].get<std::string>();
  c.data.stream = StreamOptions::from_json(group("stream"));
  c.model = model_options_from_json(group("model"));
  c.optim = optim_from_json(group("optim"));
  c.loader = LoaderOptions::from_json(group("loader"));
  c.view = view_from_json(group("view"));
  read_field(group("view"), "resolved", c.view_resolved, "view");
  c.augment = augment_from_json(group("augment"));
  c.mixup = mixup_from_json(group("augment"));
  c.eval = eval_from_json(group("eval"));
  c.verify = VerifyOptions::from_json(group("verify"));
  c.train = TrainOptions::from_json(group("train"));
  return c;
}

void add_options(po::options_description& desc, TrainConfig& c) {
  add_options(desc, c.data);
  add_options(desc, c.train);
  add_options(desc, c.model);
  add_options(desc, c.optim);
  add_options(desc, c.loader);
  data::views::add_options(desc, c.view);
  add_options(desc, c.augment);
  add_options(desc, c.mixup);
  desc.add_options()("eval-batch-size", po::value(&c.eval.batch_size)->default_value(c.eval.batch_size)->value_name("N"),
                     "short segments per validation forward pass")(
      "vote", po::value(&c.eval.vote)->default_value(c.eval.vote)->value_name("mean|majority"),
      "file-level vote over long segments")(
      "threshold", po::value(&c.eval.threshold)->default_value(c.eval.threshold)->value_name("P"),
      "detection probability at or above which a segment or file is positive (multilabel: class probability)")(
      "aggregate", po::value(&c.eval.aggregate)->default_value(c.eval.aggregate)->value_name("mean|max"),
      "multilabel: a file's class score from its segments' probabilities");
  add_options(desc, c.verify);
  add_options(desc, c.runtime);
  add_options(desc, c.dist);
  add_options(desc, c.monitor);
}

double metric_value(const EvalResult& r, const std::string& metric) {
  if (metric == "val_eer") return 100.0 * r.verification.eer;
  if (metric == "val_min_dcf") return r.verification.min_dcf_01;
  if (metric == "val_map") return r.multilabel.map_macro;
  if (metric == "val_map_micro") return r.multilabel.map_micro;
  if (metric == "val_accuracy") return r.segment.accuracy;
  if (metric == "val_loss") return r.segment.loss;
  if (metric == "val_file_accuracy") return r.file.accuracy;
  return r.segment.macro_f1;
}

bool improves(double value, double best, bool have_best, const std::string& metric) {
  if (std::isnan(value)) return false;
  if (!have_best) return true;
  const bool lower = metric == "val_loss" || metric == "val_eer" || metric == "val_min_dcf";
  return lower ? value < best : value > best;
}

}  // namespace melforge::trainer
