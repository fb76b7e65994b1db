#pragma once
/// The training run behind train() (trainer.h): one object holding the model, optimizer, schedule, scaler, loader
/// and bookkeeping of a run, from set-up through the epochs to the final evaluation. Internal to the trainer; its
/// methods are defined by stage in run.cpp (set-up), run_epoch.cpp (epochs and final evaluation), run_state.cpp
/// (resume and checkpoint contents), run_dist.cpp (the data-parallel job), run_task.cpp (multiclass vs multilabel),
/// run_verification.cpp (the verification task) and run_device_check.cpp (the device check, train/device_check.h).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "eval/metrics.h"
#include "eval/verification.h"
#include "melforge/common/timing.h"
#include "models/model.h"
#include "options.h"
#include "train/checkpoint.h"
#include "train/device_check.h"
#include "train/init_weights.h"
#include "train/run_folder.h"
#include "train/setup.h"
#include "train/trainer.h"

namespace melforge::trainer {

class GraphStep;
struct MixupDraw;
class RunMonitor;
class StepProfiler;

/// The training state of one run: model, optimizer, schedule, scaler and bookkeeping.
class Run {
 public:
  /// Nothing is read or validated before run().
  Run(TrainConfig config, std::ostream& log_stream, const TrainHooks& hooks);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// Trains as train() says. When a fresh run fails before its first checkpoint, what it created in the run folder is
  /// removed (discard_run_dir), so that the same command can run again.
  TrainResult run();

 private:
  /// The stages of run(), from set-up through the epochs to the final evaluation.
  TrainResult run_stages();
  /// What one epoch's training pass measured.
  struct EpochTraining {
    /// Loss and accuracy over the epoch's training batches (all ranks together).
    Metrics metrics;
    /// Learning rate of the epoch's last optimizer step.
    double lr = 0;
    /// Seconds the loop waited for batches, and seconds of the whole pass.
    double wait_s = 0, seconds = 0;
  };

  // Set-up (run.cpp), in the order run() calls them.
  /// Validates the configuration, joins the data-parallel job when there is one, resolves --resume and picks the
  /// device, autocast dtype and threads.
  void set_up_job();
  /// Picks the positive class from the dataset's metadata, resolves and checks the training view (resolve_view) and
  /// checks that a resumed checkpoint fits the dataset.
  void check_dataset();
  /// On --resume: compares dataset_identity_ with the checkpoint's; a difference is refused (FormatError naming
  /// each change) unless --allow-dataset-change, which logs it and records it for report.json.
  void check_dataset_identity();
  /// Resolves the --view options left unset for the dataset and the model (resolve_view_options) and checks them
  /// against the training split (split_view, example_frames) before any frame is read; sets model_info_.
  void resolve_view(const Dataset& meta);
  /// Rank 0: truncates metrics.jsonl to the resumed epoch, or clears the run files with --overwrite; creates
  /// RUN/checkpoints.
  void prepare_run_dir();
  /// Reads the dataset (RAM or streamed) and logs what it holds.
  void load_data();
  /// The training split's view and loader (drop-last with --cuda-graph on CUDA); InvalidArgument when it gives no
  /// batch.
  void make_loader();
  /// --pos-weight: the number given, or negatives / positives among the training examples of the first epoch.
  void resolve_pos_weight();
  /// Builds model, optimizer, schedule, scaler (and the CUDA Graph step), seeds the ranks > 0, restores a resumed
  /// checkpoint and broadcasts rank 0's model to the job.
  void set_up_model();
  /// RUN/config.json (rank 0): the configuration, dataset parameters, classes, what was resolved at set-up and the
  /// device check as it stands (kept in config_json_ for record_device_check).
  void write_config();

  // Epochs and the final evaluation (run_epoch.cpp).
  /// Trains, validates and checkpoints epoch epoch_ + 1. Returns false when TrainHooks::on_epoch_end stops the run.
  bool run_epoch();
  /// One pass over the training split (0-based `epoch`).
  EpochTraining train_epoch(int64_t epoch);
  /// Augments `batch` and runs forward and backward (eagerly, or the whole step through the CUDA Graph, which
  /// counts the step); sets `loss` and `lr` (the graph step's learning rate) and returns the model's output.
  ModelOutput forward_backward(const Batch& batch, bool last_micro, double& lr, at::Tensor& loss);
  /// The eager optimizer step after the last micro-batch: gradient all-reduce, unscaling and clipping, AdamW at
  /// the schedule's rate (returned), zeroed gradients.
  double optimizer_step();
  /// Throws Error when the training loss of 0-based `epoch` is NaN or infinite (the previous checkpoints stay).
  void check_finite(double loss, int64_t epoch) const;
  /// Throws Error when the validation loss or the best metric of 0-based `epoch` is NaN or infinite, naming the
  /// split file and the first file whose output is not finite.
  void check_finite_validation(const EvalResult& val, int64_t epoch) const;
  /// What stays of the run after an error in an epoch: "the checkpoints of epoch N are kept in DIR", or that none
  /// was written.
  std::string kept_checkpoints() const;
  /// Counts the epoch done and updates the best epoch, the epochs without improvement and early stopping from the
  /// validation result (rank 0's value on every rank). Returns whether the epoch improved on the best.
  bool record_validation(const EvalResult& val);
  /// Appends `line` to metrics.jsonl and writes last.pt (and best.pt when `improved`); rank 0 writes, every rank
  /// contributes its generator states.
  void save_epoch(const nlohmann::json& line, bool improved);
  /// The epoch's log line (and the early-stop line).
  void log_epoch(const nlohmann::json& line, const EpochTraining& train, const EvalResult& val, double val_s,
                 bool improved) const;
  /// One line of metrics.jsonl for 0-based `epoch`.
  nlohmann::json epoch_line(int64_t epoch, const EpochTraining& train, const EvalResult& val, double val_s) const;
  /// Evaluates best.pt on val and test into `result` and writes report.json and the confusion CSVs.
  void finish(TrainResult& result);
  /// Writes timings.json: the stage times, the total since `total_s` was measured and the peak RSS.
  void write_timings(double total_s);

  // The task (run_task.cpp): what differs between --task multiclass, multilabel and verification.
  /// Throws before any work when --task multilabel meets a dataset without a targets matrix (or --cuda-graph), and
  /// when --task verification meets a val or test split that cannot give trials or a --trials list that does not
  /// fit the test split; warns when a single-label task meets a multi-label dataset (only each file's first label is
  /// used).
  void check_task(const Dataset& meta) const;
  /// --task verification: the val and test splits give trials (--trials read against the test split's paths).
  void check_verification_splits(const Dataset& meta) const;
  /// The split the loader batches (it keeps a reference): the training split, or for multilabel the copy
  /// rows_split_ whose `label` is the file row (Batch::y then indexes train_targets_).
  const Split& loader_split();
  /// The training loss of a batch: combined_loss, or multilabel_loss against the batch's target rows; with `mix`
  /// (--mixup) the lambda-weighted sum of the losses against the own and the partners' labels (multiclass) or the
  /// loss against the mixed target rows (multilabel). Computed on out's device (the device check's CPU side too).
  at::Tensor training_loss(const ModelOutput& out, const Batch& batch, const MixupDraw* mix = nullptr) const;
  /// The single-label loss against `labels` [B] (on out's device): combined_loss, or for verification the AAM-softmax
  /// loss at the step's margin (aam_margin). What the CUDA Graph step captures.
  at::Tensor labels_loss(const ModelOutput& out, const at::Tensor& labels) const;
  /// --task verification: the AAM margin of the current optimizer step (--margin, warmed up over --margin-warmup
  /// epochs).
  double aam_margin() const;
  /// evaluate or evaluate_multilabel (F1 also at `tuned` when >= 0) of `split` with the run's settings; for
  /// verification evaluate_verification of the split's generated trials.
  EvalResult evaluate_split(const Split& split, double tuned = -1) const;
  /// --task verification: the EER and minDCF of `split`'s file embeddings on its trials (--trials when `use_list`,
  /// else generated, cached per split name), scored against `cohort` (AS-norm) when it is defined. A non-finite
  /// embedding gives a NaN EER (check_finite_validation names the file).
  EvalResult evaluate_verification(const Split& split, bool use_list, const at::Tensor& cohort = {}) const;
  /// finish() for verification: best.pt on val and test (--trials, AS-norm against the training files' embeddings
  /// with --as-norm), report.json and the test split's DET curve as RUN/det_test.png.
  void finish_verification(TrainResult& result);
  /// The model's config_json() with the task recorded ("task": "multilabel"; nothing added for multiclass).
  nlohmann::json model_config() const;
  /// Adapts an epoch_line to the task: multilabel replaces the multi-class fields by val_map, val_map_micro,
  /// val_auc, val_f1_micro and val_f1_macro; without a detection head the detection fields are removed.
  void task_fields(nlohmann::json& line, const EvalResult& val) const;
  /// What report.json holds for either task: run folder, best.pt, classes, epochs, best metric and the `val` and
  /// `test` results.
  nlohmann::json report_json(const EvalResult& val, const EvalResult& test) const;
  /// finish() for multilabel: best.pt on val (threshold tuned there) and test; report.json and
  /// scores_{val,test}.csv (per-file class scores).
  void finish_multilabel(TrainResult& result);

  // The device check (run_device_check.cpp).
  /// What the device check will do: skipped (--no-device-check), not_applicable (the CPU, unless the test hook
  /// MELFORGE_DEVICE_CHECK_FAULT is set) or pending until the first training batch.
  void plan_device_check();
  /// The check on the first training batch of this process (every rank checks its own): the result is logged and
  /// recorded in config.json (rank 0); throws Error with the figures when it failed.
  void check_device(const Batch& batch);
  /// Makes `result` the run's device check and rewrites config.json's `device_check` (rank 0).
  void record_device_check(DeviceCheckResult result);

  // Resume and checkpoint contents (run_state.cpp).
  /// Fresh run: checks --out. --resume: loads the checkpoint and replaces the configuration by the saved one with
  /// the given flags honoured or refused (resume_config, train/overrides.h).
  void resolve_resume();
  /// --resume: throws InvalidArgument when `merged` asks for fewer epochs than the checkpoint completed, or for
  /// more when the run stopped early and the (new) --patience does not let it go on.
  void check_extension(const TrainConfig& merged) const;
  /// Loads a checkpoint's model, optimizer, scaler, generators and bookkeeping.
  void restore(const Checkpoint& c);
  /// --init-from: reads the weights and checks (before any data is loaded) that their architecture matches the run's
  /// model and, without --reset-heads, that their class set and positive class are the dataset's (`meta`).
  void check_init_weights(const Dataset& meta);
  /// --init-from: copies the weights (the heads aside with --reset-heads) into the new model, strictly by name and
  /// shape; the input normalisation comes from them too.
  void apply_init_weights();
  /// Everything of the run as it stands, as a checkpoint.
  Checkpoint make_checkpoint() const;
  /// Every rank's generator states, gathered on rank 0: [{"cpu": hex, "cuda": hex}] by rank (empty elsewhere).
  nlohmann::json gather_rank_rng();
  /// A rank > 0 takes its own generator states from the checkpoint (rank 0's are the checkpoint's own).
  void restore_rank_rng(const Checkpoint& c);

  // The data-parallel job (run_dist.cpp).
  /// Joins the job through c10d: on CUDA the device of the local rank, then the process group.
  void join_job(const DistOptions& dist);
  /// Makes the CUDA device of `local_rank` this process's device; returns the choice's description.
  std::string take_rank_device(int local_rank);
  /// Rank 0's parameters and buffers on every rank; then the gradient all-reduce over the parameters.
  void sync_model();
  /// --sync-bn: gives the model's batch norms the process group in a job of more than one process (else says that
  /// it is a no-op); returns whether they synchronise.
  bool install_sync_bn();

  /// Whether this process writes the run folder (rank 0).
  bool writer() const { return rank_ == 0; }

  TrainConfig cfg_;
  /// The log; ranks > 0 of a job log warnings and errors only, except on rank_log_ (what each rank says about
  /// itself).
  Logger log_;
  Logger rank_log_;
  const TrainHooks& hooks_;
  std::filesystem::path run_dir_;
  /// Rank 0: the lock on run_dir_ (taken by resolve_resume).
  RunFolderLock lock_;
  /// A fresh run has cleared (--overwrite) or taken over the run folder (prepare_run_dir); a checkpoint was written.
  bool cleared_ = false, checkpointed_ = false;
  std::optional<Checkpoint> resume_from_;
  /// The dataset's identity (dataset_identity), recorded in every checkpoint.
  nlohmann::json dataset_identity_;
  /// Dataset changes accepted with --allow-dataset-change on this and earlier resumes (report.json).
  std::vector<std::string> dataset_changes_;
  /// --init-from's weights, from check_init_weights until apply_init_weights.
  std::optional<InitWeights> init_;
  Dataset data_;
  /// The dataset's parameters with n_frames the training view's example length: what the model is built for.
  MelInfo model_info_;
  /// The view the training split is read through (made by make_loader; the loader keeps a reference).
  std::unique_ptr<data::views::View> view_;
  StepSetup s_;
  std::shared_ptr<Classifier> model_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<CosineSchedule> schedule_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<StepProfiler> profiler_;
  /// Rank 0: step lines and TensorBoard (null elsewhere).
  std::unique_ptr<RunMonitor> monitor_;
  /// --cuda-graph on CUDA: the captured step (null otherwise).
  std::unique_ptr<GraphStep> graph_;
  StageTimes times_;
  /// Completed epochs, and optimizer steps taken.
  int64_t epoch_ = 0;
  int64_t step_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t best_epoch_ = 0;
  double best_value_ = 0;
  int64_t bad_epochs_ = 0;
  bool early_stopped_ = false;
  double input_mean_ = 0, input_std_ = 1;
  /// --stream as requested (auto, on or off) before load_data resolved it; config.json's "requested".
  std::string stream_requested_;
  /// --task verification; the generated trials of each evaluated split, by split name (filled on first use).
  bool verification_ = false;
  mutable std::map<std::string, std::vector<verification::Trial>> trials_;
  /// The device check's state (pending until the first batch); the test hook's fault (MELFORGE_DEVICE_CHECK_FAULT);
  /// the config.json document write_config wrote, which record_device_check rewrites.
  DeviceCheckResult device_check_;
  std::optional<double> check_fault_;
  nlohmann::json config_json_;
  /// --task multilabel; and then the training split's targets, float32 [files, C] on the device.
  bool multilabel_ = false;
  at::Tensor train_targets_;
  Split rows_split_;
  /// Data-parallel job: this rank, the world size, the process group and the gradient all-reduce (world > 1 only).
  int rank_ = 0, world_ = 1;
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<GradientSync> grad_sync_;
  /// Whether the model's batch norms synchronise through group_ (--sync-bn in a job of several processes).
  bool sync_bn_ = false;
};

}  // namespace melforge::trainer
