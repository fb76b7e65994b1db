#include "options.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <boost/program_options.hpp>
#include <malloc.h>

#include <cstdlib>
#include <iostream>
#include <limits>

#include "melforge/common/errors.h"
#include "melforge/common/options.h"
#include "melforge/common/parallel.h"

namespace po = boost::program_options;

namespace melforge::trainer {

void StreamOptions::validate() const {
  if (stream != "auto" && stream != "on" && stream != "off")
    throw InvalidArgument("--stream must be auto, on or off, got '" + stream + "'");
  if (h5_cache < 1) throw InvalidArgument("--h5-cache must be >= 1 MiB, got " + std::to_string(h5_cache));
}

nlohmann::json StreamOptions::to_json() const { return {{"stream", stream}, {"h5_cache", h5_cache}}; }

StreamOptions StreamOptions::from_json(const nlohmann::json& j) {
  StreamOptions o;
  try {
    if (j.contains("stream")) j.at("stream").get_to(o.stream);
    if (j.contains("h5_cache")) j.at("h5_cache").get_to(o.h5_cache);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("stream options: ") + e.what());
  }
  return o;
}

void add_options(po::options_description& desc, StreamOptions& opts) {
  desc.add_options()("stream", po::value(&opts.stream)->default_value(opts.stream)->value_name("auto|on|off"),
                     "spectrograms in RAM (off), streamed from the HDF5 files (on), or streamed only when the "
                     "dataset does not fit in the available memory (auto)")(
      "h5-cache", po::value(&opts.h5_cache)->default_value(opts.h5_cache)->value_name("MiB"),
      "HDF5 chunk cache per streamed split");
}

void DataOptions::validate() const {
  if (data.empty()) throw InvalidArgument("--data is required: a melforge-build output folder");
  stream.validate();
}

void add_options(po::options_description& desc, DataOptions& opts) {
  desc.add_options()("data", po::value<std::filesystem::path>(&opts.data)->value_name("DIR"),
                     "melforge-build output folder with train.h5, val.h5 and test.h5");
  add_options(desc, opts.stream);
}

void ModelOptions::validate() const {
  if (model != "auto" && model != "cnn" && model != "crnn" && model != "resnet-se" && model != "ecapa")
    throw InvalidArgument("--model: unknown model '" + model + "' (available: auto, cnn, crnn, resnet-se, ecapa)");
  if (cmn != "auto" && cmn != "on" && cmn != "off")
    throw InvalidArgument("--cmn must be auto, on or off, got '" + cmn + "'");
  if (rnn != "gru" && rnn != "lstm") throw InvalidArgument("--rnn: unknown layer '" + rnn + "' (gru or lstm)");
  if (rnn_hidden < 1) throw InvalidArgument("--rnn-hidden must be >= 1, got " + std::to_string(rnn_hidden));
  if (hidden < 1) throw InvalidArgument("--hidden must be >= 1, got " + std::to_string(hidden));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw InvalidArgument("--dropout must be in [0, 1), got " + std::to_string(dropout));
  if (embedding_dim < 1) throw InvalidArgument("--embedding-dim must be >= 1, got " + std::to_string(embedding_dim));
  if (width != "half" && width != "quarter")
    throw InvalidArgument("--width must be half or quarter, got '" + width + "'");
  if (channels < 8 || channels % 8 != 0)
    throw InvalidArgument("--channels must be a positive multiple of 8, got " + std::to_string(channels));
}

ModelOptions ModelOptions::resolved(const std::string& task) const {
  ModelOptions o = *this;
  if (o.model == "auto") o.model = task == "verification" ? "resnet-se" : "cnn";
  if (o.cmn == "auto") o.cmn = o.model == "resnet-se" || o.model == "ecapa" ? "on" : "off";
  return o;
}

void add_options(po::options_description& desc, ModelOptions& opts) {
  desc.add_options()("model", po::value(&opts.model)->default_value(opts.model)->value_name("NAME"),
                     "architecture: cnn (three conv layers, two max-pools, class and detection heads), crnn (conv "
                     "front end, then a GRU/LSTM over time), the speaker-embedding models resnet-se (ResNetSE34) "
                     "and ecapa (ECAPA-TDNN), or auto: resnet-se for --task verification, cnn otherwise")(
      "cmn", po::value(&opts.cmn)->default_value(opts.cmn)->value_name("auto|on|off"),
      "per-utterance cepstral mean normalisation in the model (each mel bin minus its mean over the utterance's "
      "real frames) instead of the training split's global mean/std; auto: on for resnet-se and ecapa, off for cnn "
      "and crnn")(
      "rnn", po::value(&opts.rnn)->default_value(opts.rnn)->value_name("gru|lstm"), "crnn: recurrent layer")(
      "rnn-hidden", po::value(&opts.rnn_hidden)->default_value(opts.rnn_hidden)->value_name("N"),
      "crnn: hidden size of the recurrent layer")(
      "hidden", po::value(&opts.hidden)->default_value(opts.hidden)->value_name("N"), "hidden layer width")(
      "dropout", po::value(&opts.dropout)->default_value(opts.dropout, default_text(opts.dropout))->value_name("P"),
      "dropout before the heads, in [0, 1)")(
      "seed", po::value(&opts.seed)->default_value(opts.seed)->value_name("N"), "seed of the initialisation")(
      "embedding-dim", po::value(&opts.embedding_dim)->default_value(opts.embedding_dim)->value_name("N"),
      "resnet-se, ecapa: width of the speaker embedding")(
      "width", po::value(&opts.width)->default_value(opts.width)->value_name("half|quarter"),
      "resnet-se: filters 32-256 (half) or 16-128 (quarter)")(
      "channels", po::value(&opts.channels)->default_value(opts.channels)->value_name("N"),
      "ecapa: channels of the SE-Res2Net blocks (a multiple of 8)");
}

nlohmann::json to_json(const ModelOptions& o) {
  return {{"model", o.model},     {"rnn", o.rnn},         {"rnn_hidden", o.rnn_hidden},
          {"hidden", o.hidden},   {"dropout", o.dropout}, {"seed", o.seed},
          {"embedding_dim", o.embedding_dim}, {"width", o.width}, {"channels", o.channels}, {"cmn", o.cmn}};
}

ModelOptions model_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.cmn = "off";
  try {
    if (j.contains("model")) j.at("model").get_to(o.model);
    if (j.contains("rnn")) j.at("rnn").get_to(o.rnn);
    if (j.contains("rnn_hidden")) j.at("rnn_hidden").get_to(o.rnn_hidden);
    if (j.contains("hidden")) j.at("hidden").get_to(o.hidden);
    if (j.contains("dropout")) j.at("dropout").get_to(o.dropout);
    if (j.contains("seed")) j.at("seed").get_to(o.seed);
    if (j.contains("embedding_dim")) j.at("embedding_dim").get_to(o.embedding_dim);
    if (j.contains("width")) j.at("width").get_to(o.width);
    if (j.contains("channels")) j.at("channels").get_to(o.channels);
    if (j.contains("cmn")) j.at("cmn").get_to(o.cmn);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("model options: ") + e.what());
  }
  return o;
}

void RuntimeOptions::validate() const {
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw InvalidArgument("--device must be auto, cpu or cuda, got '" + device + "'");
  if (threads < 0) throw InvalidArgument("--threads must be >= 0, got " + std::to_string(threads));
  if (!log_level.empty()) parse_log_level(log_level, "--log-level");
}

c10::Device RuntimeOptions::resolve_device() const {
  const bool cuda = torch::cuda::is_available();
  if (device == "cuda" && !cuda) throw InvalidArgument("--device cuda: no CUDA device is available");
  if (device == "cuda" || (device == "auto" && cuda)) return c10::Device(c10::kCUDA, 0);
  return c10::Device(c10::kCPU);
}

bool configure_allocator() {
  const char* keep = std::getenv("MELFORGE_MALLOC");
  if (keep != nullptr && std::string(keep) == "default") return false;
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_",
                           "GLIBC_TUNABLES"})
    if (std::getenv(name) != nullptr) return false;
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
}

void RuntimeOptions::apply_threads() const {
  if (threads <= 0) return;
  if (const std::string warning = threads_cap_warning(threads); !warning.empty())
    std::cerr << "[melforge-train] warn: " << warning << "\n" << std::flush;
  at::set_num_threads(resolve_threads(threads));
}

void add_options(po::options_description& desc, RuntimeOptions& opts) {
  desc.add_options()("device", po::value(&opts.device)->default_value(opts.device)->value_name("auto|cpu|cuda"),
                     "where to compute (auto: CUDA when available)")(
      "threads", po::value(&opts.threads)->default_value(opts.threads)->value_name("N"),
      "CPU threads for LibTorch (0: all cores)")(
      "log-level", po::value(&opts.log_level)->value_name("LEVEL"),
      "debug, info, warn or error (default: $MELFORGE_LOG_LEVEL, else info)");
}

LogLevel parse_log_level(const std::string& s, const std::string& source) {
  if (s == "debug") return LogLevel::debug;
  if (s == "info") return LogLevel::info;
  if (s == "warn" || s == "warning") return LogLevel::warn;
  if (s == "error") return LogLevel::error;
  throw InvalidArgument(source + " must be debug, info, warn or error, got '" + s + "'");
}

Logger Logger::from(std::ostream& out, const RuntimeOptions& opts) {
  if (!opts.log_level.empty()) return Logger(out, parse_log_level(opts.log_level, "--log-level"));
  const char* env = std::getenv("MELFORGE_LOG_LEVEL");
  if (env && *env) return Logger(out, parse_log_level(env, "MELFORGE_LOG_LEVEL"));
  return Logger(out, LogLevel::info);
}

void Logger::write(LogLevel level, const std::string& msg) const {
  if (!enabled(level)) return;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  *out_ << "[melforge-train] " << kNames[static_cast<int>(level)] << ": " << msg << "\n" << std::flush;
}

}  // namespace melforge::trainer
