#pragma once
/// What `train` is configured by: its own settings (TrainOptions), every option group together (TrainConfig), their
/// flags, and the JSON that the run folder's config.json and the checkpoints record.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "data/loader.h"
#include "dist/dist.h"
#include "eval/evaluate.h"
#include "eval/verification.h"
#include "options.h"
#include "train/mixup.h"
#include "train/monitor.h"
#include "train/optim.h"
#include "train/spec_augment.h"
#include "views/view_options.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// The settings of `train` that are neither model, optimizer, loader, augmentation nor evaluation settings.
struct TrainOptions {
  /// The run folder to create (must be empty or absent, unless `overwrite`).
  std::filesystem::path out;
  /// A run to continue: its folder, or a checkpoint inside it (normally RUN/checkpoints/last.pt). Its saved
  /// configuration is used; flags given with it are honoured or refused (train/overrides.h).
  std::filesystem::path resume;
  /// Write into a non-empty run folder, replacing the files a run writes (other files are left alone).
  bool overwrite = false;
  /// Epochs to train (the cosine schedule spans all of them), >= 1. With --resume: the total to continue to.
  int64_t epochs = 30;
  /// Mixed precision: `off`, `fp16` (CUDA only, with a GradScaler) or `bf16` (CPU or CUDA).
  std::string amp = "off";
  /// Class the detection head detects. Empty: the class named `leak` when there is one, else the first class
  /// (logged); `none`: no detection head term in the loss and no detection metrics.
  std::string positive_class;
  /// `multiclass` (one class per file: cross-entropy plus the detection head), `multilabel` (the class logits
  /// through sigmoid/BCE against the dataset's targets matrix; no detection head) or `verification` (a speaker
  /// model, `--model resnet-se|ecapa`, trained with the AAM-softmax loss on the training split's classes and
  /// validated by the EER of per-file embeddings; no detection head). `--model auto` (the default) is resnet-se for
  /// verification and cnn for the others.
  std::string task = "multiclass";
  /// --task verification: the additive angular margin of the AAM-softmax loss, radians in [0, pi/2).
  double margin = 0.2;
  /// --task verification: the scale of the AAM-softmax logits, > 0.
  double scale = 30;
  /// --task verification: epochs over which the margin rises linearly from 0 to --margin (counted in optimizer
  /// steps, train/aam.h's warmup_margin); 0: the full margin from the first step.
  double margin_warmup = 0;
  /// Weight of the detection head's BCE in the loss, >= 0.
  double bce_weight = 1.0;
  /// Weight of the positive term of the BCE: `auto` (negatives / positives among the training segments) or a
  /// positive number.
  std::string pos_weight = "auto";
  /// Stop after this many epochs without improvement of best_metric; 0 never stops early.
  int64_t patience = 10;
  /// The metric that picks best.pt and drives early stopping: val_macro_f1, val_accuracy, val_loss (lower is
  /// better) or val_file_accuracy; with --task multilabel val_map (macro mAP of the files), val_map_micro or
  /// val_loss. `auto`: val_macro_f1, or val_map for multilabel (resolved_best_metric).
  std::string best_metric = "auto";
  /// CUDA only: capture forward, backward and optimizer step in a CUDA Graph (implies drop-last; not with fp16).
  bool cuda_graph = false;
  /// CUDA only: channels-last memory format for the convolutions.
  bool channels_last = false;
  /// Profile this many training steps of the first epoch into RUN/trace.json (Chrome trace); 0: off.
  int64_t profile_steps = 0;
  /// --config: an INI options file (read by the command line into the flags) or a run's config.json (its saved
  /// configuration, with the flags given replacing its values: config_from_run_json in train/overrides.h).
  std::filesystem::path config;
  /// Start a new run from these weights: a melforge checkpoint (best.pt, last.pt) or a state dict written by
  /// `export` (or by torch.save of a dict of tensors). Empty: initialise from --seed.
  std::filesystem::path init_from;
  /// With init_from: re-initialise the classification and detection heads (from --seed) instead of loading them, so
  /// that the new dataset may have another class set.
  bool reset_heads = false;
  /// --no-device-check: skip the device check (train/device_check.h: on CUDA, the first batch's forward pass
  /// compared with a CPU copy of the model). Not saved (it changes no result): always from the command line.
  bool no_device_check = false;
  /// --allow-dataset-change: with --resume, continue although the dataset differs from the one the checkpoint
  /// recorded (Run logs each difference and report.json lists them). Not saved: always from the command line.
  bool allow_dataset_change = false;

  /// Throws InvalidArgument naming the flag for a value out of range (device-independent checks only).
  void validate() const;
  /// The AAM-softmax part of validate(): --margin, --scale and --margin-warmup in range, and left at their defaults
  /// unless --task verification.
  void validate_aam() const;
  /// best_metric with `auto` resolved for the task.
  std::string resolved_best_metric() const;
  /// True for --task multilabel.
  bool multilabel() const { return task == "multilabel"; }
  /// True for --task verification.
  bool verification() const { return task == "verification"; }
  /// The fields that define the run (not out/resume/overwrite/profile_steps).
  nlohmann::json to_json() const;
  /// Reads to_json()'s fields (missing ones keep their defaults); FormatError on a mistyped one.
  static TrainOptions from_json(const nlohmann::json& j);
};

/// Registers --out --resume --overwrite --epochs --amp --positive-class --task --bce-weight --pos-weight --patience
/// --best-metric --cuda-graph --channels-last --profile-steps --config --init-from --reset-heads --margin --scale
/// --margin-warmup --no-device-check.
void add_options(boost::program_options::options_description& desc, TrainOptions& opts);

/// Everything `train` is configured by.
struct TrainConfig {
  /// The dataset folder and how its spectrograms are held.
  DataOptions data;
  /// The architecture and its seed.
  ModelOptions model;
  /// AdamW, the learning-rate schedule, clipping and accumulation.
  OptimOptions optim;
  /// Batches of the training split.
  LoaderOptions loader;
  /// The view the training split is read through (--view tiles|crops and their lengths; clips is refused: a model
  /// trains on examples of one length). Left unset, resolve_view_options (data/dataset.h) fills it from the dataset
  /// and the model when the run starts: tiles of the file's short_seconds, or crops of 2 s for the speaker models.
  data::views::ViewOptions view;
  /// Whether `view` was resolved for the dataset (a saved configuration's is; a fresh command line's is not).
  bool view_resolved = false;
  /// SpecAugment masks of the training batches.
  SpecAugmentOptions augment;
  /// mixup of the training batches (after SpecAugment); recorded in the "augment" group as "mixup".
  MixupOptions mixup;
  /// Validation after each epoch and the final evaluation.
  EvalOptions eval;
  /// --task verification: trials and scoring of the validation and the final evaluation.
  VerifyOptions verify;
  /// The settings of `train` itself.
  TrainOptions train;
  /// Device, threads and logging (not saved: they do not change the result on the CPU).
  RuntimeOptions runtime;
  /// Data-parallel job (not saved in config.json; a checkpoint records the world size).
  DistOptions dist;
  /// Step lines and TensorBoard (not saved: logging only; a resumed run takes them from its command line).
  MonitorOptions monitor;
  /// The flags given on the command line or in an INI --config file (canonical names without dashes, e.g.
  /// "epochs"). With --resume they decide what replaces the saved configuration (train/overrides.h); a library call
  /// that leaves it empty resumes with the saved configuration and its own runtime and dist groups.
  std::set<std::string> given;

  /// Validates every group (before any data is read). --data and --out are required unless --resume is given.
  /// Also the device check's test hook: MELFORGE_DEVICE_CHECK_FAULT must be a number >= 0 (device_check_fault), and
  /// is refused with --no-device-check, which would ignore it.
  void validate() const;
  /// {"data", "model", "optim", "loader", "view" (with "resolved"), "augment" (with "mixup"), "eval", "train"}: what
  /// the run folder's config.json and the
  /// checkpoints record (the runtime group is not part of it: it does not change the result on the CPU).
  nlohmann::json to_json() const;
  /// The inverse of to_json() (runtime left at its defaults). Throws FormatError on a malformed document.
  static TrainConfig from_json(const nlohmann::json& j);
};

/// Registers every group of TrainConfig.
void add_options(boost::program_options::options_description& desc, TrainConfig& config);

/// Throws InvalidArgument, before any work, when `model` (a ModelOptions::model name, `auto` resolved:
/// ModelOptions::resolved) cannot be trained for `task`: the speaker-embedding models (`resnet-se`, `ecapa`) train
/// for `--task verification` only, and that task needs one of them.
void check_model_task(const std::string& model, const std::string& task);

/// The value of `metric` (one of TrainOptions::best_metric's names) in a validation result (val_eer in percent,
/// val_min_dcf the minDCF at p_target 0.01).
double metric_value(const EvalResult& result, const std::string& metric);

/// Whether `value` improves on `best` for `metric` (lower is better for val_loss, val_eer and val_min_dcf, higher
/// for the others; NaN never
/// improves; anything does when `have_best` is false).
bool improves(double value, double best, bool have_best, const std::string& metric);

}  // namespace melforge::trainer
