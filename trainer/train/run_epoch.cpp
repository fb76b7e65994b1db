#include "train/run.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>

#include "data/loader.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/progress.h"
#include "melforge/common/utf8.h"
#include "train/graph_step.h"
#include "train/mixup.h"
#include "train/monitor.h"
#include "train/profiling.h"
#include "train/run_folder.h"
#include "train/spec_augment.h"
#include "eval/multilabel.h"
#include "util.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

bool Run::run_epoch() {
  const int64_t e = epoch_;
  EpochTraining train;
  {
    ScopedStage stage(times_, "train");
    train = train_epoch(e);
  }
  check_finite(train.metrics.loss, e);
  Stopwatch vw;
  EvalResult val;
  {
    ScopedStage stage(times_, "validate");
    val = evaluate_split(data_.val);
  }
  const double val_s = vw.seconds();
  check_finite_validation(val, e);
  const bool improved = record_validation(val);
  nlohmann::json line = epoch_line(e, train, val, val_s);
  task_fields(line, val);
  if (monitor_)
    monitor_->end_epoch(line, static_cast<int64_t>(val.segment.confusion.size()) <= kMaxFullConfusionClasses
                                  ? val.segment.confusion
                                  : std::vector<std::vector<int64_t>>{});
  save_epoch(line, improved);
  log_epoch(line, train, val, val_s, improved);
  return !hooks_.on_epoch_end || hooks_.on_epoch_end(e);
}

Run::EpochTraining Run::train_epoch(int64_t epoch) {
  EpochTraining r;
  const int64_t batches = loader_->batches_per_epoch();
  MetricAccumulator acc(data_.num_classes(), s_.positive_index, cfg_.eval.threshold, s_.device);
  model_->train();
  Stopwatch watch;
  loader_->start_epoch(epoch);
  if (monitor_) monitor_->start_epoch();
  Progress progress(fmt("epoch %lld/%lld", static_cast<long long>(epoch + 1),
                        static_cast<long long>(cfg_.train.epochs)),
                    batches, "batches", !log_.enabled(LogLevel::info));
  int64_t micro = 0, ml_count = 0;
  at::Tensor ml_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(s_.device));
  r.lr = schedule_->lr(step_);
  for (;;) {
    std::optional<Batch> batch;
    {
      TraceRange range("data");
      batch = loader_->next();
    }
    if (!batch) break;
    if (hooks_.on_batch) hooks_.on_batch(epoch, *batch);
    if (device_check_.result == "pending") check_device(*batch);
    const bool last_micro = (micro + 1) % cfg_.optim.accumulate == 0 || batch->index == batches - 1;
    at::Tensor loss;
    const ModelOutput out = forward_backward(*batch, last_micro, r.lr, loss);
    if (multilabel_) {
      ml_loss.add_(loss.detach().to(at::kDouble) * static_cast<double>(batch->y.size(0)));
      ml_count += batch->y.size(0);
    } else {
      const at::Tensor det = out.detection.defined() ? out.detection.detach()
                                                     : at::zeros({out.logits.size(0)}, out.logits.options());
      acc.add(out.logits.detach(), det, batch->y, loss.detach() * static_cast<double>(batch->y.size(0)));
    }
    ++micro;
    if (monitor_) monitor_->add_batch(loss, batch->global_size);
    if (!graph_ && last_micro) r.lr = optimizer_step();
    if (monitor_ && last_micro) monitor_->end_step(epoch + 1, step_, r.lr, loader_->wait_seconds());
    if (profiler_) profiler_->step();
    progress.advance();
  }
  if (profiler_) profiler_->finish();
  at::Tensor ml_n = at::full({}, static_cast<double>(ml_count), ml_loss.options());
  if (group_) {
    std::vector<at::Tensor> counts = multilabel_ ? std::vector<at::Tensor>{ml_loss, ml_n} : acc.counts();
    group_->allreduce_sum(counts);
  }
  r.metrics = acc.finish();
  if (multilabel_) {
    r.metrics.count = static_cast<int64_t>(ml_n.item<double>());
    r.metrics.loss = ml_loss.item<double>() / std::max(1.0, ml_n.item<double>());
  }
  progress.finish();
  r.seconds = watch.seconds();
  r.wait_s = loader_->wait_seconds();
  return r;
}

ModelOutput Run::forward_backward(const Batch& batch, bool last_micro, double& lr, at::Tensor& loss) {
  at::Tensor x = batch.x, lengths = batch.lengths;
  if (cfg_.augment.enabled()) x = spec_augment(x, cfg_.augment, nullptr, lengths);
  std::optional<MixupDraw> mix;
  if (cfg_.mixup.enabled()) {
    mix = draw_mixup(x.size(0), cfg_.mixup.alpha, x.device());
    x = mix_batch(x, *mix);
    lengths = mix_lengths(lengths, *mix);
  }
  if (cfg_.train.channels_last && s_.device.is_cuda()) x = x.unsqueeze(1).contiguous(at::MemoryFormat::ChannelsLast);
  if (graph_) {
    TraceRange range("graph step");
    lr = schedule_->lr(step_);
    ModelOutput out = graph_->step(x, lengths, batch.y, lr, loss);
    ++step_;
    return out;
  }
  ModelOutput out;
  {
    TraceRange range("forward");
    AutocastGuard autocast(s_.device.type(), s_.autocast);
    out = model_->forward(x, lengths);
    loss = training_loss(out, batch, mix ? &*mix : nullptr);
  }
  TraceRange range("backward");
  const int64_t accumulate = cfg_.optim.accumulate;
  at::Tensor objective = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
  const int64_t local = batch.y.size(0);
  if (grad_sync_ && local * world_ != batch.global_size)
    objective = objective * (static_cast<double>(local * world_) / static_cast<double>(batch.global_size));
  if (grad_sync_ && last_micro) grad_sync_->prepare();
  scaler_->scale(objective).backward();
  return out;
}

double Run::optimizer_step() {
  if (grad_sync_) {
    TraceRange range("all-reduce");
    grad_sync_->finish();
  }
  TraceRange range("optimizer");
  const double lr = schedule_->lr(step_);
  if (cfg_.optim.clip_norm > 0) {
    scaler_->unscale(params_);
    clip_grad_norm(params_, cfg_.optim.clip_norm);
  }
  scaler_->step(*opt_, lr, params_);
  opt_->zero_grad();
  ++step_;
  return lr;
}

std::string Run::kept_checkpoints() const {
  if (epoch_ == 0 || !fs::exists(run_dir_ / "checkpoints" / "last.pt"))
    return "no epoch was completed, so no checkpoint was written";
  return fmt("the checkpoints of epoch %lld are kept in %s", static_cast<long long>(epoch_),
             (run_dir_ / "checkpoints").string().c_str());
}

void Run::check_finite(double loss, int64_t epoch) const {
  if (std::isfinite(loss)) return;
  throw Error(fmt("the training loss became %s in epoch %lld; stopped (lower --lr?); %s",
                  std::isnan(loss) ? "NaN" : "infinite", static_cast<long long>(epoch + 1),
                  kept_checkpoints().c_str()));
}

void Run::check_finite_validation(const EvalResult& val, int64_t epoch) const {
  const double metric = metric_value(val, cfg_.train.best_metric);
  if (std::isfinite(val.segment.loss) && std::isfinite(metric)) return;
  const int64_t file = first_non_finite_file(val);
  const std::string which =
      file >= 0 ? fmt("the model's output on file %lld ('%s') of split 'val' (%s) is not finite",
                      static_cast<long long>(file), data_.val.paths[static_cast<std::size_t>(file)].c_str(),
                      data_.val.path.string().c_str())
                : "split 'val' (" + data_.val.path.string() + ")";
  throw Error(fmt("the validation %s became %s in epoch %lld: %s; the model diverged (lower --lr?); stopped; %s",
                  std::isfinite(val.segment.loss) ? cfg_.train.best_metric.c_str() : "loss",
                  std::isnan(std::isfinite(val.segment.loss) ? metric : val.segment.loss) ? "NaN" : "infinite",
                  static_cast<long long>(epoch + 1), which.c_str(), kept_checkpoints().c_str()));
}

bool Run::record_validation(const EvalResult& val) {
  double value = metric_value(val, cfg_.train.best_metric);
  if (group_) {
    std::vector<at::Tensor> v{at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(s_.device))};
    group_->broadcast(v, 0);
    value = v[0].item<double>();
  }
  const bool improved = improves(value, best_value_, best_epoch_ > 0, cfg_.train.best_metric);
  ++epoch_;
  if (improved) {
    best_epoch_ = epoch_;
    best_value_ = value;
    bad_epochs_ = 0;
  } else {
    ++bad_epochs_;
  }
  if (cfg_.train.patience > 0 && bad_epochs_ >= cfg_.train.patience && epoch_ < cfg_.train.epochs)
    early_stopped_ = true;
  return improved;
}

void Run::save_epoch(const nlohmann::json& line, bool improved) {
  ScopedStage stage(times_, "checkpoint");
  const nlohmann::json rank_rng = group_ ? gather_rank_rng() : nlohmann::json();
  if (!writer()) return;
  append_line(run_dir_ / "metrics.jsonl", utf8::dump(line));
  Checkpoint c = make_checkpoint();
  if (group_) c.state["rank_rng"] = rank_rng;
  if (const std::string key = std::string("val_") + kTunedThresholdKey; line.contains(key))
    c.state[kTunedThresholdKey] = line[key];
  if (improved) {
    save_checkpoint(c, run_dir_ / "checkpoints" / "best.pt");
    checkpointed_ = true;
  }
  save_checkpoint(c, run_dir_ / "checkpoints" / "last.pt");
  checkpointed_ = true;
}

void Run::log_epoch(const nlohmann::json& line, const EpochTraining& train, const EvalResult& val, double val_s,
                    bool improved) const {
  const Metrics& tm = train.metrics;
  if (verification_) {
    log_.info(fmt("epoch %lld/%lld: lr %.3g, margin %.3g, train loss %.4f acc %.4f | val EER %.3f %% minDCF 0.01 "
                  "%.4f | %.0f samples/s, %.1f s, data wait %.1f%%%s",
                  static_cast<long long>(epoch_), static_cast<long long>(cfg_.train.epochs), train.lr, aam_margin(),
                  tm.loss, tm.accuracy, 100.0 * val.verification.eer, val.verification.min_dcf_01,
                  line["samples_per_s"].get<double>(), train.seconds + val_s,
                  100.0 * line["data_wait_fraction"].get<double>(), improved ? " *" : ""));
  } else if (multilabel_) {
    const auto& m = val.multilabel;
    log_.info(fmt("epoch %lld/%lld: lr %.3g, train loss %.4f | val loss %.4f mAP %.4f (micro %.4f) ROC-AUC %.4f "
                  "F1 micro %.4f | %.0f samples/s, %.1f s, data wait %.1f%%%s",
                  static_cast<long long>(epoch_), static_cast<long long>(cfg_.train.epochs), train.lr, tm.loss,
                  val.segment.loss, m.map_macro, m.map_micro, m.auc_macro, m.f1.micro,
                  line["samples_per_s"].get<double>(), train.seconds + val_s,
                  100.0 * line["data_wait_fraction"].get<double>(), improved ? " *" : ""));
  } else {
    log_.info(fmt("epoch %lld/%lld: lr %.3g, train loss %.4f acc %.4f | val loss %.4f acc %.4f macro-F1 %.4f, "
                  "files %.4f | %.0f samples/s, %.1f s, data wait %.1f%%%s",
                  static_cast<long long>(epoch_), static_cast<long long>(cfg_.train.epochs), train.lr, tm.loss,
                  tm.accuracy, val.segment.loss, val.segment.accuracy, val.segment.macro_f1, val.file.accuracy,
                  line["samples_per_s"].get<double>(), train.seconds + val_s,
                  100.0 * line["data_wait_fraction"].get<double>(), improved ? " *" : ""));
  }
  if (early_stopped_)
    log_.info(fmt("early stop: %s has not improved for %lld epochs (best %.4f in epoch %lld)",
                  cfg_.train.best_metric.c_str(), static_cast<long long>(bad_epochs_), best_value_,
                  static_cast<long long>(best_epoch_)));
}

nlohmann::json Run::epoch_line(int64_t epoch, const EpochTraining& train, const EvalResult& val,
                               double val_s) const {
  const auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const double train_s = train.seconds;
  return {{"type", "epoch"},
          {"epoch", epoch + 1},
          {"step", step_},
          {"lr", train.lr},
          {"train_loss", num(train.metrics.loss)},
          {"train_accuracy", train.metrics.accuracy},
          {"val_loss", num(val.segment.loss)},
          {"val_accuracy", val.segment.accuracy},
          {"val_macro_f1", val.segment.macro_f1},
          {"val_file_accuracy", val.file.accuracy},
          {"val_file_macro_f1", val.file.macro_f1},
          {"val_det_f1", val.segment.det_f1},
          {"val_file_det_f1", val.file.det_f1},
          {"samples_per_s", train_s > 0 ? static_cast<double>(train.metrics.count) / train_s : 0.0},
          {"epoch_s", train_s + val_s},
          {"train_s", train_s},
          {"val_s", val_s},
          {"data_wait_fraction", train_s > 0 ? train.wait_s / train_s : 0.0}};
}

void Run::finish(TrainResult& result) {
  ScopedStage stage(times_, "final evaluation");
  const fs::path best = run_dir_ / "checkpoints" / "best.pt";
  const Checkpoint c = load_checkpoint(best);
  load_state_dict(*model_, c.model, best.string());
  if (multilabel_) return finish_multilabel(result);
  if (verification_) return finish_verification(result);
  EvalResult val = evaluate(*model_, data_.val, s_.positive_index, cfg_.train.bce_weight, cfg_.eval, s_.device,
                            s_.autocast);
  EvalResult test = evaluate(*model_, data_.test, s_.positive_index, cfg_.train.bce_weight, cfg_.eval, s_.device,
                             s_.autocast);
  if (static_cast<int64_t>(data_.class_names.size()) <= kMaxFullConfusionClasses) {
    write_file_atomically(run_dir_ / "confusion_val.csv", val.segment.confusion_csv(data_.class_names));
    write_file_atomically(run_dir_ / "confusion_test.csv", test.segment.confusion_csv(data_.class_names));
    write_file_atomically(run_dir_ / "confusion_val_files.csv", val.file.confusion_csv(data_.class_names));
    write_file_atomically(run_dir_ / "confusion_test_files.csv", test.file.confusion_csv(data_.class_names));
  } else {
    log_.info(fmt("%zu classes, more than %lld: the confusion CSVs are not written; report.json lists the largest "
                  "confusions (confusion_top)",
                  data_.class_names.size(), static_cast<long long>(kMaxFullConfusionClasses)));
  }
  nlohmann::json report = report_json(val, test);
  report["positive_class"] = s_.positive_name;
  write_json_atomically(run_dir_ / "report.json", report);
  log_.info(fmt("best epoch %lld (%s %.4f): test accuracy %.4f, macro-F1 %.4f; files %.4f (macro-F1 %.4f)%s",
                static_cast<long long>(best_epoch_), cfg_.train.best_metric.c_str(), best_value_,
                test.segment.accuracy, test.segment.macro_f1, test.file.accuracy, test.file.macro_f1,
                s_.positive_index < 0 ? ""
                                      : fmt("; detection F1 %.4f (files %.4f)", test.segment.det_f1,
                                            test.file.det_f1).c_str()));
  result.val = std::move(val);
  result.test = std::move(test);
}

void Run::write_timings(double total_s) {
  times_.add("total", total_s);
  nlohmann::json timings = times_.to_json();
  timings["peak_rss_bytes"] = peak_rss_bytes();
  write_json_atomically(run_dir_ / "timings.json", timings);
}

}  // namespace melforge::trainer
