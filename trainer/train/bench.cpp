#include "train/bench.h"

#include <ATen/ops/full.h>

#include <boost/program_options.hpp>
#include <memory>
#include <optional>

#include "data/dataset.h"
#include "data/loader.h"
#include "eval/verification.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/timing.h"
#include "models/model.h"
#include "train/aam.h"
#include "train/setup.h"
#include "util.h"

namespace po = boost::program_options;

namespace melforge::trainer {

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

namespace {

/// Validates every group `bench` uses (the data-parallel group is not used) and the bench settings.
void validate_bench(const TrainConfig& config, const BenchOptions& opts) {
  config.data.validate();
  config.model.validate();
  check_model_task(config.model.model, config.train.task);
  config.optim.validate();
  config.loader.validate();
  config.view.validate();
  config.augment.validate();
  config.eval.validate();
  config.train.validate();
  config.runtime.validate();
  opts.validate();
}

/// Times opts.steps batches of `loader` after opts.warmup untimed ones, starting the next epoch when one ends, then
/// stops the loader: {"batches", "samples", "seconds", "batches_per_s", "samples_per_s", "prefetch",
/// "device_resident"}.
nlohmann::json time_data_pipeline(BatchLoader& loader, const BenchOptions& opts, const at::Device& device,
                                  int64_t prefetch) {
  int64_t epoch = 0, timed = 0, samples = 0;
  loader.start_epoch(epoch);
  Stopwatch watch;
  for (int64_t i = 0; i < opts.warmup + opts.steps; ++i) {
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
  return {{"batches", timed},
          {"samples", samples},
          {"seconds", s},
          {"batches_per_s", timed / s},
          {"samples_per_s", static_cast<double>(samples) / s},
          {"prefetch", prefetch},
          {"device_resident", loader.device_resident()}};
}

/// The model of `config` for `dataset` (its examples of `info`'s n_frames), normalised by its training split's
/// statistics (unless --cmn is on), on `device` (channels-last with --channels-last on CUDA).
std::shared_ptr<Classifier> make_bench_model(const TrainConfig& config, const Dataset& dataset, const MelInfo& info,
                                             const at::Device& device) {
  std::shared_ptr<Classifier> model = make_model(config.model, info, dataset.num_classes());
  if (!model->cmn()) {
    const auto [mean, stddev] = input_statistics(dataset.train);
    model->set_input_normalization(mean, stddev);
  }
  model->to(device);
  if (config.train.channels_last && device.is_cuda()) to_channels_last(*model);
  return model;
}

/// Times opts.steps training steps (augmentation, forward, loss, backward, clipping, AdamW) after opts.warmup
/// untimed ones, all on the first batch of `loader`: {"steps", "batch_size", "seconds", "steps_per_s",
/// "samples_per_s", "amp", "adamw"}.
nlohmann::json time_train_step(Classifier& model, BatchLoader& loader, const TrainConfig& config,
                               const BenchOptions& opts, const at::Device& device, int64_t positive) {
  const at::ScalarType autocast = amp_dtype(config.train.amp);
  std::vector<at::Tensor> params = model.parameters();
  AdamW opt(params, config.optim);
  GradScaler scaler(config.train.amp == "fp16", device);
  loader.start_epoch(0);
  const Batch batch = *loader.next();
  loader.stop();
  const at::Tensor pos_weight = at::full({1}, 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
  model.train();
  Stopwatch watch;
  for (int64_t i = 0; i < opts.warmup + opts.steps; ++i) {
    if (i == opts.warmup) {
      sync_device(device);
      watch.reset();
    }
    at::Tensor x = batch.x;
    if (config.augment.enabled()) x = spec_augment(x, config.augment, nullptr, batch.lengths);
    if (config.train.channels_last && device.is_cuda()) x = x.unsqueeze(1).contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor loss;
    {
      AutocastGuard ac(device.type(), autocast);
      const ModelOutput out = model.forward(x, batch.lengths);
      loss = config.train.verification()
                 ? aam_softmax_loss(out.logits, batch.y, config.train.margin, config.train.scale)
                 : combined_loss(out, batch.y, positive, config.train.bce_weight, pos_weight);
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
  return {{"steps", opts.steps},
          {"batch_size", batch.y.size(0)},
          {"seconds", s},
          {"steps_per_s", static_cast<double>(opts.steps) / s},
          {"samples_per_s", static_cast<double>(samples) / s},
          {"amp", config.train.amp},
          {"adamw", opt.implementation()}};
}

/// Evaluates the val split twice and reports the second pass (verification: the file embeddings, embed_split): {"files", "segments", "seconds", "files_per_s",
/// "segments_per_s", "batch_size"}.
nlohmann::json time_evaluation(Classifier& model, const Split& val, const TrainConfig& config,
                               const at::Device& device, int64_t positive) {
  const at::ScalarType autocast = amp_dtype(config.train.amp);
  if (config.train.verification()) {
    embed_split(model, val, config.eval.batch_size, device, autocast);
    Stopwatch watch;
    embed_split(model, val, config.eval.batch_size, device, autocast);
    const double s = watch.seconds();
    const auto files = static_cast<double>(val.files());
    return {{"files", val.files()},
            {"segments", val.files()},
            {"seconds", s},
            {"files_per_s", s > 0 ? files / s : 0.0},
            {"segments_per_s", s > 0 ? files / s : 0.0},
            {"batch_size", config.eval.batch_size}};
  }
  evaluate(model, val, positive, config.train.bce_weight, config.eval, device, autocast);
  const EvalResult r = evaluate(model, val, positive, config.train.bce_weight, config.eval, device, autocast);
  return {{"files", val.files()},
          {"segments", r.segment.count},
          {"seconds", r.seconds},
          {"files_per_s", r.files_per_s},
          {"segments_per_s", r.seconds > 0 ? static_cast<double>(r.segment.count) / r.seconds : 0.0},
          {"batch_size", config.eval.batch_size}};
}

/// The table of run_bench's result on `out`.
void print_bench(const nlohmann::json& result, const TrainConfig& config, std::ostream& out) {
  const nlohmann::json& data = result["data_pipeline"];
  const nlohmann::json& step = result["train_step"];
  const nlohmann::json& eval = result["evaluation"];
  out << fmt("bench on %s (%s), batch %lld:\n", config.data.data.string().c_str(),
             result["device"].get<std::string>().c_str(), static_cast<long long>(config.loader.batch_size));
  out << fmt("  data pipeline  %10.1f batches/s  %10.0f samples/s%s\n", data["batches_per_s"].get<double>(),
             data["samples_per_s"].get<double>(), data["device_resident"].get<bool>() ? " (device-resident)" : "");
  out << fmt("  training step  %10.1f steps/s    %10.0f samples/s\n", step["steps_per_s"].get<double>(),
             step["samples_per_s"].get<double>());
  out << fmt("  evaluation     %10.1f files/s    %10.0f segments/s\n", eval["files_per_s"].get<double>(),
             eval["segments_per_s"].get<double>());
}

}  // namespace

nlohmann::json run_bench(const TrainConfig& bench_config, const BenchOptions& opts, std::ostream& out,
                         std::ostream& log_stream) {
  TrainConfig config = bench_config;
  config.model = config.model.resolved(config.train.task);
  validate_bench(config, opts);
  if (config.train.multilabel())
    throw InvalidArgument("bench times the --task multiclass and verification steps; --task multilabel is not "
                          "supported by bench");
  const Logger log = Logger::from(log_stream, config.runtime);
  const at::Device device = config.runtime.resolve_device();
  if (config.train.amp == "fp16" && !device.is_cuda())
    throw InvalidArgument("--amp fp16 needs a CUDA device (use bf16 on the CPU)");
  config.runtime.apply_threads();
  configure_cuda(device.is_cuda());
  const Dataset meta = load_dataset(config.data.data, /*load_frames=*/false);
  meta.require_files("train");
  meta.require_files("val");
  const auto [positive, positive_name] = config.train.verification()
                                             ? std::pair<int64_t, std::string>{-1, "none"}
                                             : pick_positive_class(meta, config.train.positive_class, log);
  const TrainingView view = training_view(config, meta.train);
  config.eval.view = view.options;
  Dataset d = load_dataset(config.data.data, config.data.stream);
  const std::unique_ptr<data::views::View> train_view = split_view(d.train, view.options, /*evaluation=*/false);
  BatchLoader loader(d.train, *train_view, view.model_info.n_frames, config.loader, config.model.seed, device);
  nlohmann::json data_json = time_data_pipeline(loader, opts, device, config.loader.prefetch);
  std::shared_ptr<Classifier> model = make_bench_model(config, d, view.model_info, device);
  nlohmann::json step_json = time_train_step(*model, loader, config, opts, device, positive);
  nlohmann::json eval_json = time_evaluation(*model, d.val, config, device, positive);
  nlohmann::json result = {{"device", device.str()},
                           {"threads", config.runtime.threads},
                           {"model", model->config_json()},
                           {"positive_class", positive_name},
                           {"data_pipeline", std::move(data_json)},
                           {"train_step", std::move(step_json)},
                           {"evaluation", std::move(eval_json)},
                           {"melforge_version", MELFORGE_VERSION}};
  print_bench(result, config, out);
  if (!opts.out.empty()) {
    write_json_atomically(opts.out, result);
    out << "results: " << opts.out.string() << "\n";
  }
  return result;
}

}  // namespace melforge::trainer
