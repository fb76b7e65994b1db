#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/progress.h"
#include "melforge/common/splitmix.h"
#include "util.h"
#include "melforge/common/timing.h"
#include "models/model.h"
#include "train/checkpoint.h"

#ifdef MELFORGE_TRAINER_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#if defined(MELFORGE_TRAINER_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define MELFORGE_TRAINER_NVTX 1
#endif

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

/// Files and folders a run writes into its folder; --overwrite removes these and nothing else.
const std::vector<std::string> kRunFiles = {"config.json",        "metrics.jsonl",     "checkpoints",
                                            "report.json",        "confusion_val.csv", "confusion_test.csv",
                                            "confusion_val_files.csv", "confusion_test_files.csv",
                                            "timings.json",       "trace.json"};

const std::vector<std::string> kBestMetrics = {"val_macro_f1", "val_accuracy", "val_loss", "val_file_accuracy"};

template <typename... Args>
std::string fmt(const char* f, Args... args) {
  const int n = std::snprintf(nullptr, 0, f, args...);
  std::string s(static_cast<std::size_t>(n) + 1, '\0');
  std::snprintf(s.data(), s.size(), f, args...);
  s.resize(static_cast<std::size_t>(n));
  return s;
}

/// A profiler range (RecordFunction, seen by --profile-steps) and an NVTX range (seen by Nsight) for its scope.
class TraceRange {
 public:
  explicit TraceRange(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name);
#ifdef MELFORGE_TRAINER_NVTX
    nvtxRangePushA(name);
#endif
  }
  ~TraceRange() {
#ifdef MELFORGE_TRAINER_NVTX
    nvtxRangePop();
#endif
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  at::RecordFunction rf_;
};

/// The LibTorch profiler (Kineto) over a number of steps, saved as a Chrome trace.
class StepProfiler {
 public:
  StepProfiler(int64_t steps, fs::path path, bool cuda) : steps_(steps), path_(std::move(path)) {
    if (steps_ <= 0) return;
    using namespace torch::profiler::impl;
    const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda) activities.insert(ActivityType::CUDA);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    active_ = true;
  }
  /// Counts a step; stops and saves after the last one.
  void step() {
    if (active_ && ++done_ >= steps_) finish();
  }
  /// Stops and saves now (if still running).
  void finish() {
    if (!active_) return;
    active_ = false;
    auto result = torch::autograd::profiler::disableProfiler();
    if (result) result->save(path_.string());
  }
  ~StepProfiler() {
    try {
      finish();
    } catch (...) {
    }
  }
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

 private:
  int64_t steps_, done_ = 0;
  fs::path path_;
  bool active_ = false;
};

at::ScalarType amp_dtype(const std::string& amp) {
  if (amp == "bf16") return at::kBFloat16;
  if (amp == "fp16") return at::kHalf;
  return at::kFloat;
}

void sync_device(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

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
  return {{"split", o.split}, {"batch_size", o.batch_size}, {"vote", o.vote}, {"threshold", o.threshold}};
}

EvalOptions eval_from_json(const nlohmann::json& j) {
  EvalOptions o;
  read_field(j, "split", o.split, "eval");
  read_field(j, "batch_size", o.batch_size, "eval");
  read_field(j, "vote", o.vote, "eval");
  read_field(j, "threshold", o.threshold, "eval");
  return o;
}

nlohmann::json augment_to_json(const SpecAugmentOptions& o) {
  return {{"freq_masks", o.freq_masks}, {"freq_width", o.freq_width}, {"time_masks", o.time_masks},
          {"time_width", o.time_width}};
}

SpecAugmentOptions augment_from_json(const nlohmann::json& j) {
  SpecAugmentOptions o;
  read_field(j, "freq_masks", o.freq_masks, "augment");
  read_field(j, "freq_width", o.freq_width, "augment");
  read_field(j, "time_masks", o.time_masks, "augment");
  read_field(j, "time_width", o.time_width, "augment");
  return o;
}

/// The value of `metric` (one of kBestMetrics) in a validation result.
double metric_value(const EvalResult& r, const std::string& metric) {
  if (metric == "val_accuracy") return r.segment.accuracy;
  if (metric == "val_loss") return r.segment.loss;
  if (metric == "val_file_accuracy") return r.file.accuracy;
  return r.segment.macro_f1;
}

/// Whether `value` improves on `best` for `metric` (NaN never does).
bool improves(double value, double best, bool have_best, const std::string& metric) {
  if (std::isnan(value)) return false;
  if (!have_best) return true;
  return metric == "val_loss" ? value < best : value > best;
}

/// The checkpoint a --resume argument names: a file as given, or RUN/checkpoints/last.pt for a folder.
fs::path resume_checkpoint(const fs::path& resume) {
  if (fs::is_directory(resume)) return resume / "checkpoints" / "last.pt";
  return resume;
}

/// The run folder of a checkpoint: RUN for RUN/checkpoints/X.pt, else the checkpoint's folder.
fs::path run_dir_of(const fs::path& checkpoint) {
  const fs::path parent = fs::absolute(checkpoint).parent_path();
  return parent.filename() == "checkpoints" ? parent.parent_path() : parent;
}

/// Checks a fresh run's folder: absent, empty, or (with overwrite) a folder whose run files are then removed.
void check_run_dir(const fs::path& dir, bool overwrite) {
  if (!fs::exists(dir)) return;
  if (!fs::is_directory(dir)) throw InvalidArgument("--out: '" + dir.string() + "' exists and is not a folder");
  if (fs::is_empty(dir) || overwrite) return;
  throw InvalidArgument("--out: '" + dir.string() +
                        "' is not empty; pass --overwrite to replace the run in it, or --resume to continue it");
}

void clear_run_files(const fs::path& dir) {
  for (const auto& name : kRunFiles) fs::remove_all(dir / name);
}

void append_line(const fs::path& path, const std::string& line) {
  std::ofstream f(path, std::ios::app);
  f << line << "\n";
  f.flush();
  if (!f) throw IoError("cannot append to " + path.string());
}

/// Keeps the lines of metrics.jsonl whose epoch is at most `epochs` (a resumed run rewrites the rest).
void truncate_metrics(const fs::path& path, int64_t epochs) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("epoch") && j["epoch"].is_number_integer() &&
        j["epoch"].get<int64_t>() <= epochs)
      kept += line + "\n";
  }
  in.close();
  write_file_atomically(path, kept);
}

/// The default generator of `device`: the CPU's, or the CUDA device's (dropout and SpecAugment draw from it there).
at::Generator default_generator(at::Device device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device) : at::detail::getDefaultCPUGenerator();
}

at::Tensor rng_state(at::Device device = at::kCPU) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Tensor& state, at::Device device = at::kCPU) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// A uint8 tensor as lowercase hex, and back (a generator state in a checkpoint's JSON).
std::string to_hex(const at::Tensor& bytes) {
  static const char digits[] = "0123456789abcdef";
  const at::Tensor b = bytes.to(at::kCPU).contiguous();
  const auto* p = b.data_ptr<uint8_t>();
  std::string s;
  for (int64_t i = 0; i < b.numel(); ++i) s += {digits[p[i] >> 4], digits[p[i] & 15]};
  return s;
}

at::Tensor from_hex(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size() / 2)}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  for (std::size_t i = 0; i + 1 < s.size(); i += 2)
    p[i / 2] = static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16));
  return t;
}

/// The seed of rank `rank`'s generator (dropout, SpecAugment): `seed` mixed with the rank (splitmix64), so that
/// the ranks of a job do not draw the same masks.
uint64_t mix_seed(uint64_t seed, uint64_t rank) { return splitmix64_mix(seed ^ (rank * kSplitMixGamma)); }

/// Everything the model's step needs on the device.
struct Setup {
  at::Device device = at::kCPU;
  at::ScalarType autocast = at::kFloat;
  int64_t positive_index = 0;
  std::string positive_name;
  double pos_weight = 1.0;
  at::Tensor pos_weight_tensor;
};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// The positive class: the one named, else `leak` when present, else the first class.
std::pair<int64_t, std::string> pick_positive_class(const Dataset& d, const std::string& name, const Logger& log) {
  if (!name.empty()) return {d.class_index(name, "--positive-class"), name};
  for (std::size_t i = 0; i < d.class_names.size(); ++i)
    if (d.class_names[i] == "leak") return {static_cast<int64_t>(i), "leak"};
  log.info("no --positive-class and no class named 'leak': the detection head detects '" + d.class_names[0] +
           "' (the first class)");
  return {0, d.class_names[0]};
}

/// Mean and standard deviation of every value of the valid long segments of `split` (summed in double).
std::pair<double, double> input_statistics(const Split& split) {
  double sum = 0, sum_sq = 0, count = 0;
  const at::Tensor nvl = split.num_valid_long.to(at::kLong).contiguous();
  const int64_t block = std::max<int64_t>(split.files_per_chunk(), split.streamed() ? 1 : split.files());
  for (int64_t f0 = 0; f0 < split.files(); f0 += block) {
    const at::Tensor files = split.read_files(f0, std::min(block, split.files() - f0));
    for (int64_t i = 0; i < files.size(0); ++i) {
      const at::Tensor v = files[i].narrow(0, 0, nvl.data_ptr<int64_t>()[f0 + i]).to(at::kDouble);
      sum += v.sum().item<double>();
      sum_sq += v.square().sum().item<double>();
      count += static_cast<double>(v.numel());
    }
  }
  const double mean = count > 0 ? sum / count : 0.0;
  const double var = count > 0 ? std::max(0.0, sum_sq / count - mean * mean) : 1.0;
  return {mean, var > 0 ? std::sqrt(var) : 1.0};
}

/// Applies channels-last to the 4-d parameters of a module.
void to_channels_last(torch::nn::Module& module) {
  for (auto& p : module.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
}

void configure_cuda(bool cuda) {
  if (!cuda) return;
  at::globalContext().setBenchmarkCuDNN(true);
  at::globalContext().setFloat32MatmulPrecision("high");
  at::globalContext().setAllowTF32CuDNN(true);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Options

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
  if (std::find(kBestMetrics.begin(), kBestMetrics.end(), best_metric) == kBestMetrics.end())
    throw InvalidArgument("--best-metric must be one of " + join(kBestMetrics) + ", got '" + best_metric + "'");
  if (profile_steps < 0) throw InvalidArgument("--profile-steps must be >= 0, got " + std::to_string(profile_steps));
  if (cuda_graph && amp == "fp16")
    throw InvalidArgument("--cuda-graph cannot be combined with --amp fp16 (the loss scale is host-driven); use bf16");
}

nlohmann::json TrainOptions::to_json() const {
  return {{"epochs", epochs},         {"amp", amp},           {"positive_class", positive_class},
          {"bce_weight", bce_weight}, {"pos_weight", pos_weight}, {"patience", patience},
          {"best_metric", best_metric}, {"cuda_graph", cuda_graph}, {"channels_last", channels_last}};
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
  return o;
}

void add_options(po::options_description& desc, TrainOptions& o) {
  desc.add_options()("out", po::value(&o.out)->value_name("RUN"), "run folder to create (must be empty or absent)")(
      "resume", po::value(&o.resume)->value_name("RUN|CKPT"),
      "continue a run: its folder or a checkpoint in it (its saved configuration is used)")(
      "overwrite", po::bool_switch(&o.overwrite), "replace the run files in a non-empty --out folder")(
      "epochs", po::value(&o.epochs)->default_value(o.epochs)->value_name("N"), "epochs to train")(
      "amp", po::value(&o.amp)->default_value(o.amp)->value_name("off|fp16|bf16"),
      "mixed precision (fp16: CUDA only, with loss scaling; bf16: CPU or CUDA)")(
      "positive-class", po::value(&o.positive_class)->value_name("NAME"),
      "class of the detection head (default: 'leak' if present, else the first class)")(
      "bce-weight", po::value(&o.bce_weight)->default_value(o.bce_weight)->value_name("W"),
      "weight of the detection head's BCE in the loss")(
      "pos-weight", po::value(&o.pos_weight)->default_value(o.pos_weight)->value_name("auto|W"),
      "weight of the BCE's positive term (auto: negatives/positives in train)")(
      "patience", po::value(&o.patience)->default_value(o.patience)->value_name("N"),
      "stop after N epochs without improvement (0: never)")(
      "best-metric", po::value(&o.best_metric)->default_value(o.best_metric)->value_name("NAME"),
      "val_macro_f1, val_accuracy, val_loss or val_file_accuracy: picks best.pt, drives early stopping")(
      "cuda-graph", po::bool_switch(&o.cuda_graph),
      "CUDA: capture forward, backward and optimizer step in a CUDA Graph (implies --drop-last)")(
      "channels-last", po::bool_switch(&o.channels_last), "CUDA: channels-last convolutions")(
      "profile-steps", po::value(&o.profile_steps)->default_value(o.profile_steps)->value_name("N"),
      "write a Chrome trace of the first N training steps to RUN/trace.json");
}

void TrainConfig::validate() const {
  if (train.resume.empty()) {
    data.validate();
    if (train.out.empty()) throw InvalidArgument("--out is required: the run folder to create");
  }
  model.validate();
  optim.validate();
  loader.validate();
  augment.validate();
  eval.validate();
  train.validate();
  runtime.validate();
  dist.validate();
  if (train.cuda_graph && optim.accumulate != 1)
    throw InvalidArgument("--cuda-graph captures one optimizer step per batch: it needs --accumulate 1");
}

nlohmann::json TrainConfig::to_json() const {
  return {{"data", fs::absolute(data.data).lexically_normal().string()},
          {"stream", data.stream.to_json()},
          {"model", trainer::to_json(model)},
          {"optim", optim_to_json(optim)},
          {"loader", loader.to_json()},
          {"augment", augment_to_json(augment)},
          {"eval", eval_to_json(eval)},
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
  c.augment = augment_from_json(group("augment"));
  c.eval = eval_from_json(group("eval"));
  c.train = TrainOptions::from_json(group("train"));
  return c;
}

void add_options(po::options_description& desc, TrainConfig& c) {
  add_options(desc, c.data);
  add_options(desc, c.train);
  add_options(desc, c.model);
  add_options(desc, c.optim);
  add_options(desc, c.loader);
  add_options(desc, c.augment);
  desc.add_options()("eval-batch-size", po::value(&c.eval.batch_size)->default_value(c.eval.batch_size)->value_name("N"),
                     "short segments per validation forward pass")(
      "vote", po::value(&c.eval.vote)->default_value(c.eval.vote)->value_name("mean|majority"),
      "file-level vote over long segments")(
      "threshold", po::value(&c.eval.threshold)->default_value(c.eval.threshold)->value_name("P"),
      "detection probability at or above which a segment or file is positive");
  add_options(desc, c.runtime);
  add_options(desc, c.dist);
}

// ---------------------------------------------------------------------------------------------------------------
// Training

void check_checkpoint_fits(const Checkpoint& c, const MelInfo& info, const std::vector<std::string>& class_names,
                           const std::string& what, const std::string& dataset) {
  const MelInfo saved = MelInfo::from_json(c.mel);
  const std::string diff = saved.first_difference(info, "the checkpoint " + what, "the dataset " + dataset);
  if (!diff.empty()) throw FormatError("checkpoint does not fit the dataset: " + diff);
  if (c.class_names != class_names)
    throw FormatError("checkpoint does not fit the dataset: the checkpoint " + what + " has classes [" +
                      join(c.class_names) + "] but the dataset " + dataset + " has [" + join(class_names) + "]");
}

namespace {

/// The training state of one run: model, optimizer, schedule, scaler and bookkeeping.
class Run {
 public:
  Run(TrainConfig config, std::ostream& log_stream, const TrainHooks& hooks)
      : cfg_(std::move(config)), log_(Logger::from(log_stream, cfg_.runtime)), rank_log_(log_), hooks_(hooks) {}

  TrainResult run();

 private:
  void resolve_resume();
  void setup_model();
  void restore(const Checkpoint& c);
  Checkpoint make_checkpoint() const;
  Metrics train_epoch(int64_t epoch, double& lr, double& wait_s, double& seconds);
  nlohmann::json epoch_line(int64_t epoch, double lr, const Metrics& train, const EvalResult& val, double train_s,
                            double wait_s, double val_s) const;
  void finish(TrainResult& result);
  void step_body();
  ModelOutput graph_step(const at::Tensor& x, const at::Tensor& y, double lr, at::Tensor& loss);
  void capture_step();
  void join_job(const DistOptions& dist);
  std::string take_rank_device(int local_rank);
  void sync_model();
  nlohmann::json gather_rank_rng();
  void restore_rank_rng(const Checkpoint& c);
  bool writer() const { return rank_ == 0; }

  TrainConfig cfg_;
  // The log; ranks > 0 of a job log warnings and errors only, except on rank_log_ (what each rank says about itself).
  Logger log_;
  Logger rank_log_;
  const TrainHooks& hooks_;
  fs::path run_dir_;
  std::optional<Checkpoint> resume_from_;
  Dataset data_;
  Setup s_;
  std::shared_ptr<Classifier> model_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<CosineSchedule> schedule_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<StepProfiler> profiler_;
  StageTimes times_;
  int64_t epoch_ = 0;  // completed epochs
  int64_t step_ = 0;   // optimizer steps
  int64_t steps_per_epoch_ = 0;
  int64_t best_epoch_ = 0;
  double best_value_ = 0;
  int64_t bad_epochs_ = 0;
  bool early_stopped_ = false;
  // --cuda-graph: static inputs, learning rate and outputs of the captured step, and eager warmup steps done.
  bool use_graph_ = false;
  at::Tensor gx_, gy_, glr_, gloss_;
  ModelOutput gout_;
  int64_t graph_warmup_ = 0;
  double input_mean_ = 0, input_std_ = 1;
  // Data-parallel job: this rank, the world size, the process group and the gradient all-reduce (world > 1 only).
  int rank_ = 0, world_ = 1;
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<GradientSync> grad_sync_;
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
#endif
};

/// Forward, backward and optimizer step on the static buffers of --cuda-graph (lr as a device tensor).
void Run::step_body() {
  {
    AutocastGuard autocast(s_.device.type(), s_.autocast);
    gout_ = model_->forward(gx_);
    gloss_ = combined_loss(gout_, gy_, s_.positive_index, cfg_.train.bce_weight, s_.pos_weight_tensor);
  }
  gloss_.backward();
  if (cfg_.optim.clip_norm > 0) clip_grad_norm(params_, cfg_.optim.clip_norm);
  opt_->step(glr_);
}

/// Captures step_body() in graph_, once. The loader's prefetch thread is paused for the capture and the capture is
/// thread-local (cudaStreamCaptureModeThreadLocal); why both: trainer/README.md, "CUDA Graph capture and the
/// prefetch thread".
void Run::capture_step() {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  const LoaderPause quiet(*loader_);
  sync_device(s_.device);
  opt_->zero_grad();
  graph_ = std::make_unique<at::cuda::CUDAGraph>();
  {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    graph_->capture_begin(c10::MempoolId_t{0, 0}, cudaStreamCaptureModeThreadLocal);
    step_body();
    graph_->capture_end();
    at::autocast::set_autocast_cache_enabled(cache);
  }
  sync_device(s_.device);
  log_.info("captured the training step in a CUDA Graph (thread-local capture, loader prefetch paused)");
#endif
}

/// One training step through the CUDA Graph: a few eager warmup steps on a side stream, then one capture, then
/// replays. The batch is copied into the static input buffers; gradients stay allocated between replays.
ModelOutput Run::graph_step(const at::Tensor& x, const at::Tensor& y, double lr, at::Tensor& loss) {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  constexpr int64_t kWarmupSteps = 3;
  if (!gx_.defined()) {
    gx_ = at::empty_like(x);
    gy_ = at::empty_like(y);
    glr_ = at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(s_.device));
  }
  gx_.copy_(x, /*non_blocking=*/true);
  gy_.copy_(y, /*non_blocking=*/true);
  glr_.fill_(lr);
  if (!graph_ && graph_warmup_ < kWarmupSteps) {
    sync_device(s_.device);
    {
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
      opt_->zero_grad();
      step_body();
    }
    sync_device(s_.device);
    ++graph_warmup_;
  } else {
    if (!graph_) capture_step();
    graph_->replay();
  }
  loss = gloss_;
  return gout_;
#else
  (void)x;
  (void)y;
  (void)lr;
  (void)loss;
  throw Error("--cuda-graph: this melforge-train was built without CUDA");
#endif
}

void Run::resolve_resume() {
  TrainConfig& c = cfg_;
  if (c.train.resume.empty()) {
    run_dir_ = c.train.out;
    if (writer()) check_run_dir(run_dir_, c.train.overwrite);
    return;
  }
  const fs::path ckpt = resume_checkpoint(c.train.resume);
  if (!fs::exists(ckpt)) throw IoError("--resume: no checkpoint at " + ckpt.string());
  run_dir_ = run_dir_of(ckpt);
  if (!c.train.out.empty() && fs::absolute(c.train.out).lexically_normal() != run_dir_.lexically_normal() &&
      !(fs::exists(c.train.out) && fs::equivalent(c.train.out, run_dir_)))
    throw InvalidArgument("--out '" + c.train.out.string() + "' differs from the run folder of --resume ('" +
                          run_dir_.string() + "')");
  resume_from_ = load_checkpoint(ckpt);
  const int64_t saved_world = resume_from_->state.value("world_size", int64_t{1});
  if (saved_world != world_)
    throw InvalidArgument("--resume: " + ckpt.string() + " was written by a job of " + std::to_string(saved_world) +
                          " process(es); resume it with the same world size (this job has " +
                          std::to_string(world_) + "): the shuffle shards and the per-rank random states depend "
                          "on it");
  TrainConfig saved = TrainConfig::from_json(resume_from_->config);
  if (!c.data.data.empty()) saved.data.data = c.data.data;
  saved.data.stream.h5_cache = c.data.stream.h5_cache;
  if (c.data.stream.stream != "auto" && c.data.stream.stream != saved.data.stream.stream) {
    log_.warn("--stream " + c.data.stream.stream + " replaces the run's '" + saved.data.stream.stream +
              "': the shuffle order changes from here on, so the result will differ from an uninterrupted run");
    saved.data.stream.stream = c.data.stream.stream;
  }
  saved.runtime = c.runtime;
  saved.dist = c.dist;
  saved.loader.prefetch = c.loader.prefetch;
  saved.loader.gpu_mem = c.loader.gpu_mem;
  saved.train.profile_steps = c.train.profile_steps;
  saved.train.resume = c.train.resume;
  saved.train.out = run_dir_;
  saved.validate();
  if (saved.data.data.empty()) throw InvalidArgument("--resume: the checkpoint names no dataset; pass --data");
  cfg_ = std::move(saved);
  log_.info("resuming " + run_dir_.string() + " after epoch " + std::to_string(resume_from_->epoch) +
            " with its saved configuration");
}

void Run::setup_model() {
  model_ = make_model(cfg_.model, data_.info, data_.num_classes());
  std::tie(input_mean_, input_std_) = input_statistics(data_.train);
  model_->set_input_normalization(input_mean_, input_std_);
  model_->to(s_.device);
  if (cfg_.train.channels_last && s_.device.is_cuda()) to_channels_last(*model_);
  params_ = model_->parameters();
  opt_ = std::make_unique<AdamW>(params_, cfg_.optim);
  const int64_t batches = loader_->batches_per_epoch();
  steps_per_epoch_ = (batches + cfg_.optim.accumulate - 1) / cfg_.optim.accumulate;
  const int64_t total = std::max<int64_t>(1, cfg_.train.epochs * steps_per_epoch_);
  const auto warmup = static_cast<int64_t>(std::llround(cfg_.optim.warmup * static_cast<double>(total)));
  schedule_ = std::make_unique<CosineSchedule>(cfg_.optim.lr, total, std::min(warmup, total), cfg_.optim.min_lr_ratio);
  scaler_ = std::make_unique<GradScaler>(cfg_.train.amp == "fp16", s_.device);
  use_graph_ = cfg_.train.cuda_graph && s_.device.is_cuda();
}

void Run::restore(const Checkpoint& c) {
  const std::string what = resume_checkpoint(cfg_.train.resume).string();
  load_state_dict(*model_, c.model, what);
  opt_->load_state_dict(c.optimizer);
  scaler_->load_state_dict(c.scaler);
  if (c.rng_state.defined()) set_rng_state(c.rng_state);
  if (c.cuda_rng_state.defined() && s_.device.is_cuda()) set_rng_state(c.cuda_rng_state, s_.device);
  restore_rank_rng(c);
  if (c.cuda_rng_state.defined() != s_.device.is_cuda())
    log_.warn("--resume: the checkpoint was written on " + std::string(c.cuda_rng_state.defined() ? "CUDA" : "the CPU") +
              " and the run continues on " + s_.device.str() + ": the random draws from here on differ from an "
              "uninterrupted run");
  epoch_ = c.epoch;
  step_ = c.step;
  const auto& st = c.state;
  best_epoch_ = st.value("best_epoch", int64_t{0});
  best_value_ = st.contains("best_value") && st["best_value"].is_number() ? st["best_value"].get<double>() : 0.0;
  bad_epochs_ = st.value("bad_epochs", int64_t{0});
  early_stopped_ = st.value("early_stopped", false);
}

Checkpoint Run::make_checkpoint() const {
  Checkpoint c;
  c.version = kCheckpointVersion;
  c.model_config = model_->config_json();
  c.config = cfg_.to_json();
  c.mel = data_.info.to_json();
  c.class_names = data_.class_names;
  c.positive_class = s_.positive_name;
  c.positive_index = s_.positive_index;
  c.epoch = epoch_;
  c.step = step_;
  c.model = state_dict(*model_);
  c.optimizer = opt_->state_dict();
  c.scaler = scaler_->state_dict();
  c.scheduler = schedule_->to_json();
  c.rng_state = rng_state();
  if (s_.device.is_cuda()) c.cuda_rng_state = rng_state(s_.device);
  c.state = {{"best_metric", cfg_.train.best_metric},
             {"best_epoch", best_epoch_},
             {"best_value", best_value_},
             {"bad_epochs", bad_epochs_},
             {"early_stopped", early_stopped_},
             {"pos_weight", s_.pos_weight},
             {"steps_per_epoch", steps_per_epoch_},
             {"loader_seed", cfg_.model.seed}};
  if (world_ > 1) c.state["world_size"] = world_;
  return c;
}

/// Makes the CUDA device that choose_cuda_device() picks for `local_rank` this process's device and the current
/// one. Returns the choice's description for the log.
std::string Run::take_rank_device(int local_rank) {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const CudaDeviceChoice choice =
      choose_cuda_device(local_rank, static_cast<int>(torch::cuda::device_count()),
                         visible != nullptr ? std::optional<std::string>(visible) : std::nullopt);
  s_.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(choice.ordinal));
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(choice.ordinal));
  return choice.description;
#else
  throw InvalidArgument("local rank " + std::to_string(local_rank) + ": this melforge-train was built without CUDA");
#endif
}

/// Joins the data-parallel job through c10d: on CUDA the device of the local rank (take_rank_device), then the
/// process group (rendezvous included). Every rank logs its device and the join, at the level asked for.
void Run::join_job(const DistOptions& dist) {
  if (cfg_.train.cuda_graph && s_.device.is_cuda())
    throw InvalidArgument("--cuda-graph cannot be combined with data-parallel training (the gradient all-reduce "
                          "runs between backward and the optimizer step)");
  const std::string device = s_.device.is_cuda() ? take_rank_device(dist.local_rank)
                                                 : "local rank " + std::to_string(dist.local_rank) + " -> cpu";
  Stopwatch watch;
  group_ = std::make_unique<ProcessGroup>(dist, s_.device);
  rank_log_.info(fmt("rank %d of %d, %s: joined the job through c10d (%s process group, store at %s:%d) in %.1f s",
                     rank_, world_, device.c_str(), group_->backend().c_str(), dist.master_addr.c_str(),
                     group_->port(), watch.seconds()));
}

/// Rank 0's parameters and buffers on every rank; then the gradient all-reduce over the parameters.
void Run::sync_model() {
  std::vector<at::Tensor> tensors;
  for (const auto& p : model_->parameters()) tensors.push_back(p.data());
  for (const auto& b : model_->buffers()) tensors.push_back(b);
  group_->broadcast(tensors, 0);
  grad_sync_ = std::make_unique<GradientSync>(*group_, params_, cfg_.dist.bucket_mib, cfg_.dist.overlap);
  log_.info(fmt("global batch %lld (%lld per rank x %d ranks); gradients all-reduced in %lld bucket(s)%s",
                static_cast<long long>(cfg_.loader.batch_size * world_), static_cast<long long>(cfg_.loader.batch_size),
                world_, static_cast<long long>(grad_sync_->buckets()),
                cfg_.dist.overlap ? ", overlapping backward" : ""));
}

/// Every rank's generator states, gathered on rank 0: [{"cpu": hex, "cuda": hex}] by rank (empty elsewhere).
nlohmann::json Run::gather_rank_rng() {
  nlohmann::json mine = {{"cpu", to_hex(rng_state())}};
  if (s_.device.is_cuda()) mine["cuda"] = to_hex(rng_state(s_.device));
  const auto all = group_->gather_bytes("rng/" + std::to_string(epoch_), mine.dump());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : all) out.push_back(nlohmann::json::parse(s));
  return out;
}

/// A rank > 0 takes its own generator states from the checkpoint (rank 0's are the checkpoint's own).
void Run::restore_rank_rng(const Checkpoint& c) {
  if (rank_ == 0 || !c.state.contains("rank_rng")) return;
  const auto& all = c.state["rank_rng"];
  if (!all.is_array() || static_cast<int>(all.size()) != world_)
    throw FormatError("--resume: the checkpoint's per-rank random states do not match " + std::to_string(world_) +
                      " ranks");
  const auto& mine = all[static_cast<std::size_t>(rank_)];
  set_rng_state(from_hex(mine.at("cpu").get<std::string>()));
  if (mine.contains("cuda") && s_.device.is_cuda())
    set_rng_state(from_hex(mine.at("cuda").get<std::string>()), s_.device);
}

Metrics Run::train_epoch(int64_t epoch, double& lr, double& wait_s, double& seconds) {
  const int64_t batches = loader_->batches_per_epoch();
  const int64_t accumulate = cfg_.optim.accumulate;
  MetricAccumulator acc(data_.num_classes(), s_.positive_index, cfg_.eval.threshold, s_.device);
  model_->train();
  Stopwatch watch;
  loader_->start_epoch(epoch);
  Progress progress(fmt("epoch %lld/%lld", static_cast<long long>(epoch + 1),
                        static_cast<long long>(cfg_.train.epochs)),
                    batches, "batches", !log_.enabled(LogLevel::info));
  int64_t micro = 0;
  lr = schedule_->lr(step_);
  for (;;) {
    std::optional<Batch> batch;
    {
      TraceRange r("data");
      batch = loader_->next();
    }
    if (!batch) break;
    if (hooks_.on_batch) hooks_.on_batch(epoch, *batch);
    at::Tensor x = batch->x;
    if (cfg_.augment.enabled()) x = spec_augment(x, cfg_.augment);
    if (cfg_.train.channels_last && s_.device.is_cuda())
      x = x.unsqueeze(1).contiguous(at::MemoryFormat::ChannelsLast);
    ModelOutput out;
    at::Tensor loss;
    const bool last_micro = (micro + 1) % accumulate == 0 || batch->index == batches - 1;
    if (use_graph_) {
      TraceRange r("graph step");
      lr = schedule_->lr(step_);
      out = graph_step(x, batch->y, lr, loss);
      ++step_;
    } else {
      {
        TraceRange r("forward");
        AutocastGuard autocast(s_.device.type(), s_.autocast);
        out = model_->forward(x);
        loss = combined_loss(out, batch->y, s_.positive_index, cfg_.train.bce_weight, s_.pos_weight_tensor);
      }
      {
        TraceRange r("backward");
        at::Tensor objective = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
        const int64_t local = batch->y.size(0);
        if (grad_sync_ && local * world_ != batch->global_size)
          objective = objective * (static_cast<double>(local * world_) / static_cast<double>(batch->global_size));
        if (grad_sync_ && last_micro) grad_sync_->prepare();
        scaler_->scale(objective).backward();
      }
    }
    acc.add(out.logits.detach(), out.detection.detach(), batch->y,
            loss.detach() * static_cast<double>(batch->y.size(0)));
    ++micro;
    if (!use_graph_ && last_micro) {
      if (grad_sync_) {
        TraceRange r("all-reduce");
        grad_sync_->finish();
      }
      TraceRange r("optimizer");
      lr = schedule_->lr(step_);
      if (cfg_.optim.clip_norm > 0) {
        scaler_->unscale(params_);
        clip_grad_norm(params_, cfg_.optim.clip_norm);
      }
      scaler_->step(*opt_, lr, params_);
      opt_->zero_grad();
      ++step_;
    }
    if (profiler_) profiler_->step();
    progress.advance();
  }
  if (profiler_) profiler_->finish();
  if (group_) {
    std::vector<at::Tensor> counts = acc.counts();
    group_->allreduce_sum(counts);
  }
  Metrics m = acc.finish();
  progress.finish();
  seconds = watch.seconds();
  wait_s = loader_->wait_seconds();
  return m;
}

nlohmann::json Run::epoch_line(int64_t epoch, double lr, const Metrics& train, const EvalResult& val,
                               double train_s, double wait_s, double val_s) const {
  const auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  return {{"epoch", epoch + 1},
          {"step", step_},
          {"lr", lr},
          {"train_loss", num(train.loss)},
          {"train_accuracy", train.accuracy},
          {"val_loss", num(val.segment.loss)},
          {"val_accuracy", val.segment.accuracy},
          {"val_macro_f1", val.segment.macro_f1},
          {"val_file_accuracy", val.file.accuracy},
          {"val_file_macro_f1", val.file.macro_f1},
          {"val_det_f1", val.segment.det_f1},
          {"val_file_det_f1", val.file.det_f1},
          {"samples_per_s", train_s > 0 ? static_cast<double>(train.count) / train_s : 0.0},
          {"epoch_s", train_s + val_s},
          {"train_s", train_s},
          {"val_s", val_s},
          {"data_wait_fraction", train_s > 0 ? wait_s / train_s : 0.0}};
}

void Run::finish(TrainResult& result) {
  ScopedStage stage(times_, "final evaluation");
  const fs::path best = run_dir_ / "checkpoints" / "best.pt";
  const Checkpoint c = load_checkpoint(best);
  load_state_dict(*model_, c.model, best.string());
  EvalResult val = evaluate(*model_, data_.val, s_.positive_index, cfg_.train.bce_weight, cfg_.eval, s_.device,
                            s_.autocast);
  EvalResult test = evaluate(*model_, data_.test, s_.positive_index, cfg_.train.bce_weight, cfg_.eval, s_.device,
                             s_.autocast);
  write_file_atomically(run_dir_ / "confusion_val.csv", val.segment.confusion_csv(data_.class_names));
  write_file_atomically(run_dir_ / "confusion_test.csv", test.segment.confusion_csv(data_.class_names));
  write_file_atomically(run_dir_ / "confusion_val_files.csv", val.file.confusion_csv(data_.class_names));
  write_file_atomically(run_dir_ / "confusion_test_files.csv", test.file.confusion_csv(data_.class_names));
  nlohmann::json report = {{"run_dir", fs::absolute(run_dir_).string()},
                           {"checkpoint", fs::absolute(best).string()},
                           {"classes", data_.class_names},
                           {"positive_class", s_.positive_name},
                           {"epochs_done", epoch_},
                           {"best_epoch", best_epoch_},
                           {"best_metric", cfg_.train.best_metric},
                           {"best_value", best_value_},
                           {"early_stopped", early_stopped_},
                           {"val", val.to_json(data_.class_names)},
                           {"test", test.to_json(data_.class_names)}};
  write_json_atomically(run_dir_ / "report.json", report);
  log_.info(fmt("best epoch %lld (%s %.4f): test accuracy %.4f, macro-F1 %.4f; files %.4f (macro-F1 %.4f); "
                "detection F1 %.4f (files %.4f)",
                static_cast<long long>(best_epoch_), cfg_.train.best_metric.c_str(), best_value_,
                test.segment.accuracy, test.segment.macro_f1, test.file.accuracy, test.file.macro_f1,
                test.segment.det_f1, test.file.det_f1));
  result.val = std::move(val);
  result.test = std::move(test);
}

TrainResult Run::run() {
  Stopwatch total;
  cfg_.validate();
  const DistOptions dist = cfg_.dist.resolve();
  rank_ = dist.rank;
  world_ = dist.world_size;
  if (rank_ > 0 && log_.level() < LogLevel::warn) log_ = Logger(log_.stream(), LogLevel::warn);
  resolve_resume();
  s_.device = cfg_.runtime.resolve_device();
  if (cfg_.train.amp == "fp16" && !s_.device.is_cuda())
    throw InvalidArgument("--amp fp16 needs a CUDA device (use bf16 on the CPU)");
  if (!s_.device.is_cuda() && (cfg_.train.cuda_graph || cfg_.train.channels_last))
    log_.warn("--cuda-graph and --channels-last apply to CUDA only; ignored on the CPU");
  s_.autocast = amp_dtype(cfg_.train.amp);
  cfg_.runtime.apply_threads();
  if (world_ > 1 || cfg_.dist.forces_process_group()) join_job(dist);
  configure_cuda(s_.device.is_cuda());

  {
    const Dataset meta = load_dataset(cfg_.data.data, /*load_mel=*/false);
    for (const auto& name : kSplitNames) meta.require_files(name);
    std::tie(s_.positive_index, s_.positive_name) = pick_positive_class(meta, cfg_.train.positive_class, log_);
    if (resume_from_) {
      check_checkpoint_fits(*resume_from_, meta.info, meta.class_names,
                            resume_checkpoint(cfg_.train.resume).string(), cfg_.data.data.string());
      if (resume_from_->positive_index != s_.positive_index)
        throw FormatError("--resume: the checkpoint's positive class is '" + resume_from_->positive_class + "'");
    }
  }
  if (writer()) {
    if (resume_from_)
      truncate_metrics(run_dir_ / "metrics.jsonl", resume_from_->epoch);
    else if (cfg_.train.overwrite)
      clear_run_files(run_dir_);
    fs::create_directories(run_dir_ / "checkpoints");
  }

  {
    ScopedStage stage(times_, "load data");
    data_ = load_dataset(cfg_.data.data, cfg_.data.stream, -1, hooks_.on_load);
  }
  cfg_.data.stream.stream = data_.train.streamed() ? "on" : "off";
  if (data_.train.streamed())
    log_.info(fmt("streaming the spectrograms from the HDF5 files (chunk cache %lld MiB per split, shuffle windows "
                  "of %g MiB)", static_cast<long long>(cfg_.data.stream.h5_cache), cfg_.loader.stream_window));
  log_.info(fmt("data %s: %lld/%lld/%lld files, %lld train segments, %lld classes; device %s",
                cfg_.data.data.string().c_str(), static_cast<long long>(data_.train.files()),
                static_cast<long long>(data_.val.files()), static_cast<long long>(data_.test.files()),
                static_cast<long long>(data_.train.valid_segments()), static_cast<long long>(data_.num_classes()),
                s_.device.str().c_str()));

  LoaderOptions loader_opts = cfg_.loader;
  if (cfg_.train.cuda_graph && s_.device.is_cuda()) loader_opts.drop_last = true;
  loader_ = std::make_unique<BatchLoader>(data_.train, loader_opts, cfg_.model.seed, s_.device, rank_, world_);
  if (loader_->batches_per_epoch() == 0)
    throw InvalidArgument(fmt("--batch-size %lld with --drop-last leaves no batch: train has %lld segments",
                              static_cast<long long>(cfg_.loader.batch_size),
                              static_cast<long long>(loader_->segments())));
  if (loader_->device_resident())
    log_.info(fmt("train split resident on %s (%.1f MiB)", s_.device.str().c_str(),
                  static_cast<double>(loader_->resident_bytes()) / (1 << 20)));

  if (cfg_.train.pos_weight == "auto") {
    const at::Tensor nvl = data_.train.num_valid_long;
    const double pos = data_.train.label.eq(s_.positive_index).to(at::kLong).mul(nvl).sum().item<double>();
    const double all = nvl.sum().item<double>();
    s_.pos_weight = pos > 0 ? (all - pos) / pos : 1.0;
    if (pos == 0) log_.warn("no training segment of the positive class '" + s_.positive_name + "': pos_weight 1");
  } else {
    s_.pos_weight = std::stod(cfg_.train.pos_weight);
  }
  s_.pos_weight_tensor = at::full({1}, s_.pos_weight, at::TensorOptions().dtype(at::kFloat).device(s_.device));

  setup_model();
  if (world_ > 1 && rank_ > 0 && !resume_from_)
    at::manual_seed(mix_seed(cfg_.model.seed, static_cast<uint64_t>(rank_)));
  if (resume_from_) restore(*resume_from_);
  if (group_) sync_model();
  const Checkpoint first = make_checkpoint();
  nlohmann::json config = cfg_.to_json();
  config["mel"] = data_.info.to_json();
  config["classes"] = data_.class_names;
  config["positive_class"] = s_.positive_name;
  config["positive_index"] = s_.positive_index;
  config["pos_weight_value"] = s_.pos_weight;
  config["input_mean"] = input_mean_;
  config["input_std"] = input_std_;
  config["model_config"] = first.model_config;
  config["device"] = s_.device.str();
  config["threads"] = cfg_.runtime.threads;
  config["adamw"] = opt_->implementation();
  config["steps_per_epoch"] = steps_per_epoch_;
  config["melforge_version"] = MELFORGE_VERSION;
  if (group_) {
    config["world_size"] = world_;
    config["dist_backend"] = group_->backend();
    config["global_batch_size"] = cfg_.loader.batch_size * world_;
  }
  if (writer()) write_json_atomically(run_dir_ / "config.json", config);

  TrainResult result;
  result.run_dir = run_dir_;
  result.rank = rank_;
  if (cfg_.train.profile_steps > 0 && writer())
    profiler_ = std::make_unique<StepProfiler>(cfg_.train.profile_steps, run_dir_ / "trace.json", s_.device.is_cuda());

  while (epoch_ < cfg_.train.epochs && !early_stopped_) {
    const int64_t e = epoch_;
    double lr = 0, wait_s = 0, train_s = 0;
    Metrics tm;
    {
      ScopedStage stage(times_, "train");
      tm = train_epoch(e, lr, wait_s, train_s);
    }
    if (!std::isfinite(tm.loss))
      throw Error(fmt("the training loss became %s in epoch %lld; stopped. The checkpoints of the last good epoch "
                      "(%lld) are kept in %s",
                      std::isnan(tm.loss) ? "NaN" : "infinite", static_cast<long long>(e + 1),
                      static_cast<long long>(e), (run_dir_ / "checkpoints").string().c_str()));
    Stopwatch vw;
    EvalResult val;
    {
      ScopedStage stage(times_, "validate");
      val = evaluate(*model_, data_.val, s_.positive_index, cfg_.train.bce_weight, cfg_.eval, s_.device, s_.autocast);
    }
    const double val_s = vw.seconds();
    double value = metric_value(val, cfg_.train.best_metric);
    if (group_) {
      std::vector<at::Tensor> v{at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(s_.device))};
      group_->broadcast(v, 0);
      value = v[0].item<double>();
    }
    const bool improved = improves(value, best_value_, best_epoch_ > 0, cfg_.train.best_metric);
    epoch_ = e + 1;
    if (improved) {
      best_epoch_ = epoch_;
      best_value_ = value;
      bad_epochs_ = 0;
    } else {
      ++bad_epochs_;
    }
    if (cfg_.train.patience > 0 && bad_epochs_ >= cfg_.train.patience && epoch_ < cfg_.train.epochs)
      early_stopped_ = true;
    const nlohmann::json line = epoch_line(e, lr, tm, val, train_s, wait_s, val_s);
    {
      ScopedStage stage(times_, "checkpoint");
      const nlohmann::json rank_rng = group_ ? gather_rank_rng() : nlohmann::json();
      if (writer()) {
        append_line(run_dir_ / "metrics.jsonl", line.dump());
        Checkpoint c = make_checkpoint();
        if (group_) c.state["rank_rng"] = rank_rng;
        if (improved) save_checkpoint(c, run_dir_ / "checkpoints" / "best.pt");
        save_checkpoint(c, run_dir_ / "checkpoints" / "last.pt");
      }
    }
    log_.info(fmt("epoch %lld/%lld: lr %.3g, train loss %.4f acc %.4f | val loss %.4f acc %.4f macro-F1 %.4f, "
                  "files %.4f | %.0f samples/s, %.1f s, data wait %.1f%%%s",
                  static_cast<long long>(epoch_), static_cast<long long>(cfg_.train.epochs), lr, tm.loss, tm.accuracy,
                  val.segment.loss, val.segment.accuracy, val.segment.macro_f1, val.file.accuracy,
                  line["samples_per_s"].get<double>(), train_s + val_s,
                  100.0 * line["data_wait_fraction"].get<double>(), improved ? " *" : ""));
    if (early_stopped_)
      log_.info(fmt("early stop: %s has not improved for %lld epochs (best %.4f in epoch %lld)",
                    cfg_.train.best_metric.c_str(), static_cast<long long>(bad_epochs_), best_value_,
                    static_cast<long long>(best_epoch_)));
    if (hooks_.on_epoch_end && !hooks_.on_epoch_end(e)) {
      result.interrupted = true;
      break;
    }
  }
  loader_->stop();
  profiler_.reset();
  result.epochs_done = epoch_;
  result.best_epoch = best_epoch_;
  result.best_value = best_value_;
  result.early_stopped = early_stopped_;
  if (result.interrupted || !writer()) return result;
  finish(result);
  times_.add("total", total.seconds());
  nlohmann::json timings = times_.to_json();
  timings["peak_rss_bytes"] = peak_rss_bytes();
  write_json_atomically(run_dir_ / "timings.json", timings);
  return result;
}

}  // namespace

TrainResult train(TrainConfig config, std::ostream& log, const TrainHooks& hooks) {
  Run run(std::move(config), log, hooks);
  return run.run();
}

// ---------------------------------------------------------------------------------------------------------------
// eval

void EvalCommandOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
}

void add_options(po::options_description& desc, EvalCommandOptions& o) {
  desc.add_options()("checkpoint", po::value(&o.checkpoint)->value_name("FILE"), "checkpoint to evaluate")(
      "out", po::value(&o.out)->value_name("FILE"), "write the JSON report here");
}

namespace {

std::string summary_line(const char* level, const Metrics& m) {
  return fmt("  %-8s %7lld  accuracy %.4f  macro-F1 %.4f  detection acc %.4f F1 %.4f%s", level,
             static_cast<long long>(m.count), m.accuracy, m.macro_f1, m.det_accuracy, m.det_f1,
             std::isfinite(m.loss) ? fmt("  loss %.4f", m.loss).c_str() : "");
}

}  // namespace

nlohmann::json run_eval(const EvalCommandOptions& opts, const DataOptions& data, const EvalOptions& eval,
                        const RuntimeOptions& runtime, std::ostream& out, std::ostream& log_stream) {
  opts.validate();
  data.validate();
  eval.validate();
  runtime.validate();
  const Logger log = Logger::from(log_stream, runtime);
  const at::Device device = runtime.resolve_device();
  runtime.apply_threads();
  configure_cuda(device.is_cuda());
  const Checkpoint c = load_checkpoint(opts.checkpoint);
  {
    const Dataset meta = load_dataset(data.data, /*load_mel=*/false);
    check_checkpoint_fits(c, meta.info, meta.class_names, opts.checkpoint.string(), data.data.string());
    meta.require_files(eval.split);
  }
  const Split split = load_split(data.data / (eval.split + ".h5"), eval.split, data.stream);
  std::shared_ptr<Classifier> model = make_model_from_json(c.model_config);
  load_state_dict(*model, c.model, opts.checkpoint.string());
  model->to(device);
  double bce_weight = 1.0;
  if (c.config.contains("train") && c.config["train"].contains("bce_weight") &&
      c.config["train"]["bce_weight"].is_number())
    bce_weight = c.config["train"]["bce_weight"].get<double>();
  log.debug("evaluating " + opts.checkpoint.string() + " on " + split.path.string() + " (" + device.str() + ")");
  const EvalResult r = evaluate(*model, split, c.positive_index, bce_weight, eval, device);
  nlohmann::json report = r.to_json(c.class_names);
  report["checkpoint"] = fs::absolute(opts.checkpoint).string();
  report["data"] = fs::absolute(data.data).string();
  report["split"] = eval.split;
  report["classes"] = c.class_names;
  report["positive_class"] = c.positive_class;
  report["epoch"] = c.epoch;
  out << "checkpoint " << opts.checkpoint.string() << " (epoch " << c.epoch << ") on " << eval.split << " of "
      << data.data.string() << ": " << split.files() << " files, vote " << eval.vote << ", threshold "
      << eval.threshold << ", positive class '" << c.positive_class << "'\n";
  out << summary_line("segments", r.segment) << "\n" << summary_line("files", r.file) << "\n";
  out << fmt("  %.2f s, %.0f files/s\n", r.seconds, r.files_per_s);
  if (!opts.out.empty()) {
    write_json_atomically(opts.out, report);
    out << "report: " << opts.out.string() << "\n";
  }
  return report;
}

// ---------------------------------------------------------------------------------------------------------------
// bench

void BenchOptions::validate() const {
  if (steps < 1) throw InvalidArgument("--steps must be >= 1, got " + std::to_string(steps));
  if (warmup < 0) throw InvalidArgument("--warmup-steps must be >= 0, got " + std::to_string(warmup));
}

void add_options(po::options_description& desc, BenchOptions& o) {
  desc.add_options()("steps", po::value(&o.steps)->default_value(o.steps)->value_name("N"),
                     "timed batches / training steps")(
      "warmup-steps", po::value(&o.warmup)->default_value(o.warmup)->value_name("N"), "untimed warmup steps")(
      "out", po::value(&o.out)->value_name("FILE"), "write the JSON results here");
}

nlohmann::json run_bench(const TrainConfig& config, const BenchOptions& opts, std::ostream& out,
                         std::ostream& log_stream) {
  config.data.validate();
  config.model.validate();
  config.optim.validate();
  config.loader.validate();
  config.augment.validate();
  config.eval.validate();
  config.train.validate();
  config.runtime.validate();
  opts.validate();
  const Logger log = Logger::from(log_stream, config.runtime);
  const at::Device device = config.runtime.resolve_device();
  if (config.train.amp == "fp16" && !device.is_cuda())
    throw InvalidArgument("--amp fp16 needs a CUDA device (use bf16 on the CPU)");
  config.runtime.apply_threads();
  configure_cuda(device.is_cuda());
  const at::ScalarType autocast = amp_dtype(config.train.amp);

  const Dataset meta = load_dataset(config.data.data, /*load_mel=*/false);
  meta.require_files("train");
  meta.require_files("val");
  const auto [positive, positive_name] = pick_positive_class(meta, config.train.positive_class, log);
  Dataset d = load_dataset(config.data.data, config.data.stream);
  const int64_t total = opts.warmup + opts.steps;

  BatchLoader loader(d.train, config.loader, config.model.seed, device);
  nlohmann::json data_json;
  {
    int64_t epoch = 0, timed = 0, samples = 0;
    loader.start_epoch(epoch);
    Stopwatch watch;
    for (int64_t i = 0; i < total; ++i) {
      std::optional<Batch> b = loader.next();
      if (!b) {
        loader.start_epoch(++epoch);
        b = loader.next();
      }
      if (i + 1 == opts.warmup) {
        sync_device(device);
        watch.reset();
      }
      if (i >= opts.warmup) {
        ++timed;
        samples += b->y.size(0);
      }
    }
    sync_device(device);
    const double s = watch.seconds();
    loader.stop();
    data_json = {{"batches", timed},
                 {"samples", samples},
                 {"seconds", s},
                 {"batches_per_s", timed / s},
                 {"samples_per_s", static_cast<double>(samples) / s},
                 {"prefetch", config.loader.prefetch},
                 {"device_resident", loader.device_resident()}};
  }

  std::shared_ptr<Classifier> model = make_model(config.model, d.info, d.num_classes());
  const auto [mean, std] = input_statistics(d.train);
  model->set_input_normalization(mean, std);
  model->to(device);
  if (config.train.channels_last && device.is_cuda()) to_channels_last(*model);
  std::vector<at::Tensor> params = model->parameters();
  AdamW opt(params, config.optim);
  GradScaler scaler(config.train.amp == "fp16", device);
  loader.start_epoch(0);
  const Batch batch = *loader.next();
  loader.stop();
  const at::Tensor pos_weight = at::full({1}, 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
  nlohmann::json step_json;
  {
    model->train();
    Stopwatch watch;
    for (int64_t i = 0; i < total; ++i) {
      if (i == opts.warmup) {
        sync_device(device);
        watch.reset();
      }
      at::Tensor x = batch.x;
      if (config.augment.enabled()) x = spec_augment(x, config.augment);
      if (config.train.channels_last && device.is_cuda()) x = x.unsqueeze(1).contiguous(at::MemoryFormat::ChannelsLast);
      at::Tensor loss;
      {
        AutocastGuard ac(device.type(), autocast);
        loss = combined_loss(model->forward(x), batch.y, positive, config.train.bce_weight, pos_weight);
      }
      scaler.scale(loss).backward();
      if (config.optim.clip_norm > 0) {
        scaler.unscale(params);
        clip_grad_norm(params, config.optim.clip_norm);
      }
      scaler.step(opt, config.optim.lr, params);
      opt.zero_grad();
    }
    sync_device(device);
    const double s = watch.seconds();
    const int64_t samples = opts.steps * batch.y.size(0);
    step_json = {{"steps", opts.steps},
                 {"batch_size", batch.y.size(0)},
                 {"seconds", s},
                 {"steps_per_s", static_cast<double>(opts.steps) / s},
                 {"samples_per_s", static_cast<double>(samples) / s},
                 {"amp", config.train.amp},
                 {"adamw", opt.implementation()}};
  }

  nlohmann::json eval_json;
  {
    evaluate(*model, d.val, positive, config.train.bce_weight, config.eval, device, autocast);
    const EvalResult r = evaluate(*model, d.val, positive, config.train.bce_weight, config.eval, device, autocast);
    eval_json = {{"files", d.val.files()},
                 {"segments", r.segment.count},
                 {"seconds", r.seconds},
                 {"files_per_s", r.files_per_s},
                 {"segments_per_s", r.seconds > 0 ? static_cast<double>(r.segment.count) / r.seconds : 0.0},
                 {"batch_size", config.eval.batch_size}};
  }
  nlohmann::json result = {{"device", device.str()},
                           {"threads", config.runtime.threads},
                           {"model", model->config_json()},
                           {"positive_class", positive_name},
                           {"data_pipeline", data_json},
                           {"train_step", step_json},
                           {"evaluation", eval_json},
                           {"melforge_version", MELFORGE_VERSION}};
  out << fmt("bench on %s (%s), batch %lld:\n", config.data.data.string().c_str(), device.str().c_str(),
             static_cast<long long>(config.loader.batch_size));
  out << fmt("  data pipeline  %10.1f batches/s  %10.0f samples/s%s\n", data_json["batches_per_s"].get<double>(),
             data_json["samples_per_s"].get<double>(), loader.device_resident() ? " (device-resident)" : "");
  out << fmt("  training step  %10.1f steps/s    %10.0f samples/s\n", step_json["steps_per_s"].get<double>(),
             step_json["samples_per_s"].get<double>());
  out << fmt("  evaluation     %10.1f files/s    %10.0f segments/s\n", eval_json["files_per_s"].get<double>(),
             eval_json["segments_per_s"].get<double>());
  if (!opts.out.empty()) {
    write_json_atomically(opts.out, result);
    out << "results: " << opts.out.string() << "\n";
  }
  return result;
}

}  // namespace melforge::trainer
