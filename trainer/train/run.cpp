#include "train/run.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/full.h>

#include <cmath>
#include <utility>

#include "data/loader.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"
#include "train/graph_step.h"
#include "train/monitor.h"
#include "train/profiling.h"
#include "train/rng_state.h"
#include "train/run_folder.h"
#include "util.h"
#include "views/crops.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

TrainResult train(TrainConfig config, std::ostream& log, const TrainHooks& hooks) {
  Run run(std::move(config), log, hooks);
  return run.run();
}

Run::Run(TrainConfig config, std::ostream& log_stream, const TrainHooks& hooks)
    : cfg_(std::move(config)), log_(Logger::from(log_stream, cfg_.runtime)), rank_log_(log_), hooks_(hooks) {}

Run::~Run() = default;

TrainResult Run::run() {
  try {
    return run_stages();
  } catch (...) {
    if (writer() && !checkpointed_) discard_run_dir(run_dir_, lock_, cleared_);
    throw;
  }
}

TrainResult Run::run_stages() {
  Stopwatch total;
  set_up_job();
  check_dataset();
  prepare_run_dir();
  load_data();
  make_loader();
  resolve_pos_weight();
  set_up_model();
  write_config();
  if (writer()) monitor_ = std::make_unique<RunMonitor>(run_dir_, cfg_.monitor, step_, resume_from_.has_value());
  TrainResult result;
  result.run_dir = run_dir_;
  result.rank = rank_;
  if (cfg_.train.profile_steps > 0 && writer())
    profiler_ = std::make_unique<StepProfiler>(cfg_.train.profile_steps, run_dir_ / "trace.json", s_.device.is_cuda());
  while (epoch_ < cfg_.train.epochs && !early_stopped_) {
    if (!run_epoch()) {
      result.interrupted = true;
      break;
    }
  }
  loader_->stop();
  if (device_check_.result == "pending")
    record_device_check(DeviceCheckResult::not_run("not_run", "this process trained no batch"));
  profiler_.reset();
  if (monitor_) monitor_->close();
  result.epochs_done = epoch_;
  result.best_epoch = best_epoch_;
  result.best_value = best_value_;
  result.early_stopped = early_stopped_;
  if (result.interrupted || !writer()) return result;
  finish(result);
  write_timings(total.seconds());
  return result;
}

void Run::set_up_job() {
  cfg_.validate();
  cfg_.model = cfg_.model.resolved(cfg_.train.task);
  const DistOptions dist = cfg_.dist.resolve();
  rank_ = dist.rank;
  world_ = dist.world_size;
  if (rank_ > 0 && log_.level() < LogLevel::warn) log_ = Logger(log_.stream(), LogLevel::warn);
  resolve_resume();
  cfg_.model = cfg_.model.resolved(cfg_.train.task);
  cfg_.train.best_metric = cfg_.train.resolved_best_metric();
  multilabel_ = cfg_.train.multilabel();
  verification_ = cfg_.train.verification();
  s_.device = cfg_.runtime.resolve_device();
  if (cfg_.train.amp == "fp16" && !s_.device.is_cuda())
    throw InvalidArgument("--amp fp16 needs a CUDA device (use bf16 on the CPU)");
  if (!s_.device.is_cuda() && (cfg_.train.cuda_graph || cfg_.train.channels_last))
    log_.warn("--cuda-graph and --channels-last apply to CUDA only; ignored on the CPU");
  s_.autocast = amp_dtype(cfg_.train.amp);
  cfg_.runtime.apply_threads();
  if (world_ > 1 || cfg_.dist.forces_process_group()) join_job(dist);
  configure_cuda(s_.device.is_cuda());
  plan_device_check();
}

void Run::check_dataset() {
  const Dataset meta = hooks_.dataset ? hooks_.dataset() : load_dataset(cfg_.data.data, /*load_mel=*/false);
  for (const auto& name : kSplitNames) meta.require_files(name);
  check_task(meta);
  resolve_view(meta);
  if (multilabel_ || verification_)
    std::tie(s_.positive_index, s_.positive_name) = std::pair<int64_t, std::string>{-1, "none"};
  else std::tie(s_.positive_index, s_.positive_name) = pick_positive_class(meta, cfg_.train.positive_class, log_);
  check_training_memory(cfg_, model_info_, meta.num_classes(), s_.device.is_cuda(), available_memory_bytes(),
                        evaluation_clip_frames(cfg_, meta));
  dataset_identity_ = dataset_identity(meta);
  if (!resume_from_ && !cfg_.train.init_from.empty()) check_init_weights(meta);
  if (!resume_from_) return;
  check_dataset_identity();
  check_checkpoint_fits(*resume_from_, meta.info, meta.class_names, resume_checkpoint(cfg_.train.resume).string(),
                        cfg_.data.data.string());
  if (resume_from_->positive_index != s_.positive_index)
    throw FormatError("--resume: the checkpoint's positive class is '" +
                      utf8::for_terminal(resume_from_->positive_class, 80) + "'");
}

void Run::check_dataset_identity() {
  const std::string ckpt = utf8::for_terminal(resume_checkpoint(cfg_.train.resume).string());
  if (resume_from_->state.contains("dataset_changes") && resume_from_->state["dataset_changes"].is_array())
    for (const auto& line : resume_from_->state["dataset_changes"])
      if (line.is_string()) dataset_changes_.push_back(line.get<std::string>());
  if (!resume_from_->state.contains("dataset")) {
    log_.info("--resume: " + ckpt + " records no dataset identity (written before melforge recorded it): the "
              "dataset is not compared with the one the run started on");
    return;
  }
  const std::vector<std::string> changes = dataset_changes(resume_from_->state["dataset"], dataset_identity_);
  if (changes.empty()) return;
  std::string listed;
  for (const auto& c : changes) listed += (listed.empty() ? "" : "; ") + c;
  if (!cfg_.train.allow_dataset_change)
    throw FormatError("--resume: the dataset " + utf8::for_terminal(cfg_.data.data.string()) +
                      " differs from the one " + ckpt + " was trained on (" + listed +
                      "); resume on the same dataset, start a new run, or pass --allow-dataset-change to continue "
                      "on this one");
  log_.warn("--allow-dataset-change: resuming on a changed dataset (" + listed + ")");
  for (const auto& c : changes) dataset_changes_.push_back("epoch " + std::to_string(resume_from_->epoch) + ": " + c);
}

void Run::resolve_view(const Dataset& meta) {
  TrainingView view = training_view(cfg_, meta.train);
  cfg_.view = view.options;
  cfg_.view_resolved = true;
  cfg_.eval.view = view.options;
  model_info_ = view.model_info;
  if (meta.train.meta.schema_version < 3)
    log_.info(fmt("%s is a schema-%lld dataset: read as tiles of its stored short segments (%lld frames)",
                  cfg_.data.data.string().c_str(), static_cast<long long>(meta.train.meta.schema_version),
                  static_cast<long long>(model_info_.n_frames)));
  else
    log_.info(fmt("training view: %s of %lld frames", cfg_.view.view.c_str(),
                  static_cast<long long>(model_info_.n_frames)));
}

void Run::prepare_run_dir() {
  if (!writer()) return;
  if (resume_from_) {
    truncate_metrics(run_dir_ / "metrics.jsonl", resume_from_->epoch);
  } else {
    cleared_ = true;
    if (cfg_.train.overwrite) clear_run_files(run_dir_);
  }
  fs::create_directories(run_dir_ / "checkpoints");
}

void Run::load_data() {
  {
    ScopedStage stage(times_, "load data");
    data_ = hooks_.dataset ? hooks_.dataset() : load_dataset(cfg_.data.data, cfg_.data.stream, -1, hooks_.on_load);
  }
  stream_requested_ = cfg_.data.stream.stream;
  cfg_.data.stream.stream = data_.train.streamed() ? "on" : "off";
  if (data_.train.streamed())
    log_.info(fmt("streaming the spectrograms from the HDF5 files (chunk cache %lld MiB per split, shuffle windows "
                  "of %g MiB)", static_cast<long long>(cfg_.data.stream.h5_cache), cfg_.loader.stream_window));
  log_.info(fmt("data %s: %lld/%lld/%lld clips, %lld train frames, %lld classes; device %s",
                cfg_.data.data.string().c_str(), static_cast<long long>(data_.train.files()),
                static_cast<long long>(data_.val.files()), static_cast<long long>(data_.test.files()),
                static_cast<long long>(data_.train.total_frames()), static_cast<long long>(data_.num_classes()),
                s_.device.str().c_str()));
}

void Run::make_loader() {
  LoaderOptions loader_opts = cfg_.loader;
  if (cfg_.train.cuda_graph && s_.device.is_cuda()) loader_opts.drop_last = true;
  view_ = split_view(data_.train, cfg_.view, /*evaluation=*/false);
  loader_ = std::make_unique<BatchLoader>(loader_split(), *view_, model_info_.n_frames, loader_opts, cfg_.model.seed,
                                          s_.device, rank_, world_);
  if (loader_->batches_per_epoch() == 0)
    throw InvalidArgument(fmt("--batch-size %lld with --drop-last leaves no batch: train has %lld examples",
                              static_cast<long long>(cfg_.loader.batch_size),
                              static_cast<long long>(loader_->examples())));
  log_.info(fmt("train: %lld examples an epoch (%s view)", static_cast<long long>(loader_->examples()),
                std::string(view_->name()).c_str()));
  const std::vector<int64_t> groups = data_.train.meta.group_offsets();
  if (view_->name() == "crops" && static_cast<int64_t>(groups.size()) - 1 < data_.train.files())
    log_.info(data::views::crops_summary(groups, cfg_.view.aug_prob));
  if (loader_->device_resident())
    log_.info(fmt("train split resident on %s (%.1f MiB)", s_.device.str().c_str(),
                  static_cast<double>(loader_->resident_bytes()) / (1 << 20)));
}

void Run::resolve_pos_weight() {
  if (s_.positive_index < 0) {
    s_.pos_weight = 1.0;
  } else if (cfg_.train.pos_weight == "auto") {
    const at::Tensor label = data_.train.label.to(at::kLong).contiguous();
    double pos = 0, all = 0;
    for (const auto& e : loader_->epoch_examples(0)) {
      pos += label.data_ptr<int64_t>()[e.clip] == s_.positive_index ? 1 : 0;
      all += 1;
    }
    s_.pos_weight = pos > 0 ? (all - pos) / pos : 1.0;
    if (pos == 0) log_.warn("no training example of the positive class '" + s_.positive_name + "': pos_weight 1");
  } else {
    s_.pos_weight = std::stod(cfg_.train.pos_weight);
  }
  s_.pos_weight_tensor = at::full({1}, s_.pos_weight, at::TensorOptions().dtype(at::kFloat).device(s_.device));
}

void Run::set_up_model() {
  model_ = make_model(cfg_.model, model_info_, data_.num_classes());
  if (model_->cmn()) {
    log_.info("--cmn on: each utterance's mel bins minus their mean over its real frames (in the model's forward); "
              "no global input mean/std computed or applied");
  } else {
    std::tie(input_mean_, input_std_) = input_statistics(data_.train);
    model_->set_input_normalization(input_mean_, input_std_);
  }
  model_->to(s_.device);
  if (init_) apply_init_weights();
  if (multilabel_) train_targets_ = data_.train.targets.to(s_.device);
  if (cfg_.train.channels_last && s_.device.is_cuda()) to_channels_last(*model_);
  params_ = model_->parameters();
  opt_ = std::make_unique<AdamW>(params_, cfg_.optim);
  const int64_t batches = loader_->batches_per_epoch();
  steps_per_epoch_ = (batches + cfg_.optim.accumulate - 1) / cfg_.optim.accumulate;
  const int64_t total = std::max<int64_t>(1, cfg_.train.epochs * steps_per_epoch_);
  const auto warmup = static_cast<int64_t>(std::llround(cfg_.optim.warmup * static_cast<double>(total)));
  schedule_ = std::make_unique<CosineSchedule>(cfg_.optim.lr, total, std::min(warmup, total), cfg_.optim.min_lr_ratio);
  scaler_ = std::make_unique<GradScaler>(cfg_.train.amp == "fp16", s_.device);
  if (cfg_.train.cuda_graph && s_.device.is_cuda())
    graph_ = std::make_unique<GraphStep>(
        *model_, *opt_, params_, *loader_, s_,
        [this](const ModelOutput& out, const at::Tensor& y) { return labels_loss(out, y); }, cfg_.optim.clip_norm,
        log_);
  if (world_ > 1 && rank_ > 0 && !resume_from_)
    at::manual_seed(mix_seed(cfg_.model.seed, static_cast<uint64_t>(rank_)));
  if (resume_from_) restore(*resume_from_);
  if (group_) sync_model();
  if (cfg_.dist.sync_bn) sync_bn_ = install_sync_bn();
}

void Run::write_config() {
  nlohmann::json config = cfg_.to_json();
  config["mel"] = data_.info.to_json();
  config["classes"] = data_.class_names;
  config["positive_class"] = s_.positive_name;
  config["positive_index"] = s_.positive_index;
  config["pos_weight_value"] = s_.pos_weight;
  config["input_mean"] = input_mean_;
  config["input_std"] = input_std_;
  config["model_config"] = model_config();
  config["device"] = s_.device.str();
  config["threads"] = at::get_num_threads();
  config["adamw"] = opt_->implementation();
  config["steps_per_epoch"] = steps_per_epoch_;
  config["melforge_version"] = MELFORGE_VERSION;
  config["world_size"] = world_;
  config["dist_backend"] = group_ ? group_->backend() : "none";
  config["sync_bn"] = sync_bn_;
  config["global_batch_size"] = cfg_.loader.batch_size * world_;
  config["requested"] = {{"device", cfg_.runtime.device},
                         {"threads", cfg_.runtime.threads},
                         {"stream", stream_requested_},
                         {"adamw", cfg_.optim.adamw_impl},
                         {"pos_weight", cfg_.train.pos_weight},
                         {"dist_backend", cfg_.dist.backend},
                         {"world_size", cfg_.dist.world_size},
                         {"sync_bn", cfg_.dist.sync_bn}};
  config["device_check"] = device_check_.to_json();
  config_json_ = config;
  if (writer()) write_json_atomically(run_dir_ / "config.json", config);
}

}  // namespace melforge::trainer
