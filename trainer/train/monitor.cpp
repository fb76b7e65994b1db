#include "train/monitor.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <limits>

#include "melforge/common/errors.h"
#include "melforge/common/png.h"
#include "melforge/common/utf8.h"
#include "train/run_folder.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

double number_or_nan(const nlohmann::json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

void MonitorOptions::validate() const {
  if (log_every < 0)
    throw InvalidArgument("--log-every must be >= 0 (0: no step lines), got " + std::to_string(log_every));
}

void add_options(po::options_description& desc, MonitorOptions& o) {
  desc.add_options()("log-every", po::value(&o.log_every)->default_value(o.log_every)->value_name("N"),
                     "write the training loss and learning rate every N optimizer steps to metrics.jsonl and "
                     "TensorBoard (0: epoch lines only)")(
      "no-tensorboard", po::bool_switch()->notifier([&o](bool off) { o.tensorboard = !off; }),
      "do not write TensorBoard event files into the run folder");
}

nlohmann::json step_line(int64_t epoch, int64_t step, double loss, double lr, double samples_per_s,
                         double data_wait_fraction) {
  return {{"type", "step"},
          {"epoch", epoch},
          {"step", step},
          {"loss", finite_or_null(loss)},
          {"lr", lr},
          {"samples_per_s", samples_per_s},
          {"data_wait_fraction", data_wait_fraction}};
}

std::string confusion_png(const std::vector<std::vector<int64_t>>& confusion, int64_t& height, int64_t& width) {
  const auto n = static_cast<int64_t>(confusion.size());
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(n * n));
  for (const auto& row : confusion) {
    if (static_cast<int64_t>(row.size()) != n) throw InvalidArgument("confusion matrix is not square");
    int64_t total = 0;
    for (const int64_t c : row) total += c;
    for (const int64_t c : row)
      values.push_back(total > 0 ? static_cast<double>(c) / static_cast<double>(total)
                                 : std::numeric_limits<double>::quiet_NaN());
  }
  const RgbImage img = heat_map(values, n, n, heat_map_cell(n));
  height = img.height;
  width = img.width;
  return encode_png(img);
}

RunMonitor::RunMonitor(const fs::path& run_dir, const MonitorOptions& opts, int64_t step, bool resumed)
    : metrics_(run_dir / "metrics.jsonl"), opts_(opts) {
  if (!opts_.tensorboard) return;
  events_ = std::make_unique<tensorboard::EventWriter>(run_dir);
  if (resumed) {
    events_->add_session_start(step + 1);
    events_->flush();
  }
}

RunMonitor::~RunMonitor() = default;

void RunMonitor::start_epoch() {
  micro_ = 0;
  samples_ = 0;
  loss_sum_ = at::Tensor();
  interval_.reset();
  wait_start_ = 0;
}

void RunMonitor::add_batch(const at::Tensor& loss, int64_t samples) {
  if (opts_.log_every == 0) return;
  loss_sum_ = micro_ == 0 || !loss_sum_.defined() ? loss.detach() : loss_sum_.add(loss.detach());
  ++micro_;
  samples_ += samples;
}

void RunMonitor::end_step(int64_t epoch, int64_t step, double lr, double wait_s) {
  if (opts_.log_every == 0 || step % opts_.log_every != 0) {
    micro_ = 0;
    return;
  }
  const double loss = micro_ > 0 ? loss_sum_.item<double>() / static_cast<double>(micro_)
                                 : std::numeric_limits<double>::quiet_NaN();
  const double seconds = interval_.seconds();
  const double rate = seconds > 0 ? static_cast<double>(samples_) / seconds : 0.0;
  const double wait = seconds > 0 ? std::clamp((wait_s - wait_start_) / seconds, 0.0, 1.0) : 0.0;
  const nlohmann::json line = step_line(epoch, step, loss, lr, rate, wait);
  append_line(metrics_, utf8::dump(line));
  if (events_)
    for (const char* key : {"loss", "lr", "samples_per_s", "data_wait_fraction"})
      events_->add_scalar(std::string("step/") + key, step, number_or_nan(line[key]));
  micro_ = 0;
  samples_ = 0;
  interval_.reset();
  wait_start_ = wait_s;
}

void RunMonitor::end_epoch(const nlohmann::json& line, const std::vector<std::vector<int64_t>>& confusion) {
  if (!events_) return;
  const int64_t step = line.at("step").get<int64_t>();
  for (const auto& [key, value] : line.items())
    if (key != "step" && (value.is_number() || value.is_null()))
      events_->add_scalar("epoch/" + key, step, number_or_nan(value));
  if (!confusion.empty()) {
    int64_t height = 0, width = 0;
    const std::string png = confusion_png(confusion, height, width);
    events_->add_image("epoch/val_confusion", step, png, height, width);
  }
  events_->flush();
}

void RunMonitor::close() {
  if (events_) events_->close();
}

}  // namespace melforge::trainer
