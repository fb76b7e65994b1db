#include "predict/predict.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "eval/metrics.h"
#include "eval/batching.h"
#include "featurize/clip_features.h"
#include "featurize/featurize.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/options.h"
#include "melforge/common/utf8.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/setup.h"
#include "views/gather.h"
#include "views/view.h"
#include "util.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

std::string number(double v, int digits = 6) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

/// One input file's outcome.
struct Row {
  std::string path;
  std::string error;
  std::vector<float> probs;
  int64_t predicted = -1;
  float score = 0;
  bool detected = false;
  int64_t num_windows = 0;
};

at::Device resolve_device(const std::string& name) {
  if (name == "cpu") return at::kCPU;
  const bool cuda = torch::cuda::is_available();
  if (name == "cuda" && !cuda) throw InvalidArgument("--device cuda: no CUDA device is available");
  return cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

/// The model's outputs on every tile of a file: softmax probabilities float32 [W, C] and sigmoid detection
/// probabilities [W] (empty without a detection head), row-major, with each tile's start and end, seconds.
struct TileScores {
  std::vector<float> probs;
  std::vector<float> det;
  std::vector<double> start, end;
  int64_t count = 0;
};

/// Runs the tiles of `frames` (float32 [T, n_mels], one clip of `num_samples` samples) through `model`
/// kPredictBatchSegments at a time, each padded with `pad` past its real frames and masked by its length.
TileScores score_clip(Classifier& model, const at::Tensor& frames, int64_t num_samples, const PredictTiles& tiles,
                      const MelInfo& info, float pad, at::Device device) {
  const int64_t T = frames.size(0), M = frames.size(1);
  const std::vector<data::views::Example> examples =
      data::views::make_tiles_view_frames(tiles.tile, tiles.hop, 0.0)->examples(std::vector<int64_t>{T}, 0, 0);
  TileScores w;
  w.count = static_cast<int64_t>(examples.size());
  const double rate = static_cast<double>(info.sample_rate), hop = static_cast<double>(info.hop_length);
  for (const auto& e : examples) {
    w.start.push_back(static_cast<double>(e.start) * hop / rate);
    w.end.push_back(std::min(static_cast<double>(e.start + e.real) * hop, static_cast<double>(num_samples)) / rate);
  }
  for (int64_t first = 0; first < w.count; first += kPredictBatchSegments) {
    const int64_t B = std::min(kPredictBatchSegments, w.count - first);
    at::Tensor x = at::empty({B, M, tiles.tile}, at::kFloat);
    at::Tensor lengths = at::empty({B}, at::kLong);
    for (int64_t b = 0; b < B; ++b)
      lengths.data_ptr<int64_t>()[b] = data::views::gather_example(
          examples[static_cast<std::size_t>(first + b)], frames.data_ptr<float>(), M, tiles.tile, pad,
          x.data_ptr<float>() + b * M * tiles.tile);
    const ModelOutput out =
        model.fixed_frames() > 0 ? model.forward(x.to(device)) : model.forward(x.to(device), lengths.to(device));
    const at::Tensor p = at::softmax(out.logits.to(at::kFloat), 1).to(at::kCPU).contiguous();
    w.probs.insert(w.probs.end(), p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
    if (out.detection.defined()) {
      const at::Tensor d = at::sigmoid(out.detection.to(at::kFloat)).to(at::kCPU).contiguous();
      w.det.insert(w.det.end(), d.data_ptr<float>(), d.data_ptr<float>() + d.numel());
    }
  }
  return w;
}

/// The vote over `w`'s tiles: the whole file as one clip (`vote`), or (`per_tile`) each tile on its own.
vote::FileVotes vote_tiles(const TileScores& w, int64_t C, bool per_tile, Vote v, double threshold) {
  std::vector<int64_t> clip(static_cast<std::size_t>(w.count), 0);
  if (per_tile) std::iota(clip.begin(), clip.end(), int64_t{0});
  return vote::vote_clips(w.probs, w.det, clip, per_tile ? w.count : 1, C, per_tile ? Vote::mean : v, threshold);
}

/// Writes the --windows file (one row per tile) as files are scored: CSV (path, window, start, end, predicted, detection_score,
/// detected, p_<class>...) or a JSON array of objects with the same fields (probabilities by class name). Without a
/// detection head (`detection` false: --positive-class none) the detection fields are empty (CSV) or null (JSON).
class WindowWriter {
 public:
  WindowWriter(const fs::path& path, std::string format, const std::vector<std::string>& class_names, bool detection)
      : path_(path), format_(std::move(format)), class_names_(class_names), detection_(detection) {
    if (path.empty()) return;
    file_.open(path, std::ios::binary | std::ios::trunc);
    if (!file_) throw IoError(path.string() + ": cannot write the --windows file: " + std::strerror(errno));
    if (format_ == "json") {
      file_ << "[";
    } else {
      file_ << "path,window,start,end,predicted,detection_score,detected";
      for (const auto& n : class_names_) file_ << ',' << csv_field(utf8::escape("p_" + n));
      file_ << '\n';
    }
  }
  /// Adds the tiles of one file (`votes`: one per tile, from vote_tiles).
  void add(const std::string& file, const TileScores& w, const vote::FileVotes& votes) {
    if (path_.empty()) return;
    const auto C = class_names_.size();
    for (int64_t k = 0; k < w.count; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      const double start = w.start[kk], end = w.end[kk];
      const std::string& predicted = class_names_[static_cast<std::size_t>(votes.predicted[kk])];
      if (format_ == "json") {
        nlohmann::json probs = nlohmann::json::object();
        for (std::size_t c = 0; c < C; ++c) probs[class_names_[c]] = votes.class_probs[kk * C + c];
        nlohmann::json o = {{"path", file}, {"window", k}, {"start", start}, {"end", end}, {"predicted", predicted},
                            {"probabilities", probs}, {"detection_score", nullptr}, {"detected", nullptr}};
        if (detection_) {
          o["detection_score"] = votes.detection_score[kk];
          o["detected"] = votes.detected[kk] != 0;
        }
        file_ << (first_ ? "\n" : ",\n") << utf8::dump(o, -1);
        first_ = false;
        continue;
      }
      file_ << csv_field(utf8::escape(file)) << ',' << k << ',' << number(start, 10) << ',' << number(end, 10) << ','
            << csv_field(utf8::escape(predicted)) << ',';
      if (detection_) file_ << number(votes.detection_score[kk]) << ',' << static_cast<int>(votes.detected[kk]);
      else file_ << ',';
      for (std::size_t c = 0; c < C; ++c) file_ << ',' << number(votes.class_probs[kk * C + c]);
      file_ << '\n';
    }
  }
  /// Ends the JSON array and checks that everything was written.
  void close() {
    if (path_.empty()) return;
    if (format_ == "json") file_ << "\n]\n";
    file_.close();
    if (!file_) throw IoError(path_.string() + ": writing the --windows file failed");
  }

 private:
  fs::path path_;
  std::string format_;
  const std::vector<std::string>& class_names_;
  bool detection_;
  std::ofstream file_;
  bool first_ = true;
};

/// Writes `rows` as CSV with a header: path, predicted, detection_score, detected, p_<class> per class of
/// `class_names`, error (detection fields empty without a detection head, `detection` false). Paths, class names and
/// errors go through utf8::escape, as in the JSON output.
void write_csv(const std::vector<Row>& rows, const std::vector<std::string>& class_names, bool detection,
               std::ostream& out) {
  const auto field = [](const std::string& text) { return csv_field(utf8::escape(text)); };
  out << "path,predicted,detection_score,detected";
  for (const auto& n : class_names) out << ',' << field("p_" + n);
  out << ",error\n";
  for (const Row& r : rows) {
    out << field(r.path);
    if (r.error.empty()) {
      out << ',' << field(class_names[static_cast<std::size_t>(r.predicted)]) << ',';
      if (detection) out << number(r.score) << ',' << (r.detected ? 1 : 0);
      else out << ',';
      for (float p : r.probs) out << ',' << number(p);
      out << ",\n";
    } else {
      out << ",,,";
      for (std::size_t c = 0; c < class_names.size(); ++c) out << ',';
      out << ',' << field(r.error) << '\n';
    }
  }
}

/// Writes `rows` as a JSON array of objects (path and error, or path, predicted, probabilities by class name,
/// positive_class, detection_score, detected, num_windows; the last three but num_windows null without a detection
/// head), names not valid UTF-8 escaped (utf8::dump).
void write_json(const std::vector<Row>& rows, const Checkpoint& ck, std::ostream& out) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      arr.push_back({{"path", r.path}, {"error", r.error}});
      continue;
    }
    nlohmann::json probs = nlohmann::json::object();
    for (std::size_t c = 0; c < ck.class_names.size(); ++c) probs[ck.class_names[c]] = r.probs[c];
    nlohmann::json o = {{"path", r.path},
                        {"predicted", ck.class_names[static_cast<std::size_t>(r.predicted)]},
                        {"probabilities", probs},
                        {"positive_class", nullptr},
                        {"detection_score", nullptr},
                        {"detected", nullptr},
                        {"num_windows", r.num_windows}};
    if (ck.positive_index >= 0) {
      o["positive_class"] = ck.positive_class;
      o["detection_score"] = r.score;
      o["detected"] = r.detected;
    }
    arr.push_back(std::move(o));
  }
  out << utf8::dump(arr, 2) << '\n';
}

}  // namespace

void PredictOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
  if (inputs.empty()) throw InvalidArgument("predict needs at least one input file or folder");
  if (format != "csv" && format != "json") throw InvalidArgument("--format: '" + format + "' is not one of csv, json");
  parse_vote(vote);
  if (!(threshold > 0 && threshold < 1))
    throw InvalidArgument("--threshold must be in (0, 1) (got " + std::to_string(threshold) + ")");
  if (threads < 0) throw InvalidArgument("--threads must be >= 0 (got " + std::to_string(threads) + ")");
  if (device != "cpu" && device != "cuda" && device != "auto")
    throw InvalidArgument("--device: '" + device + "' is not one of cpu, cuda, auto");
  if (!std::isfinite(hop) || hop < 0)
    throw InvalidArgument("--hop must be a number of seconds > 0 (got " + std::to_string(hop) + ")");
  if (!windows.empty()) resolved_windows_format();
  if (windows.empty() && !windows_format.empty()) throw InvalidArgument("--windows-format needs --windows FILE");
}

std::string PredictOptions::resolved_windows_format() const {
  const std::string ext = windows.extension().string();
  const std::string f = !windows_format.empty() ? windows_format : ext == ".csv" ? "csv" : ext == ".json" ? "json" : "";
  if (f.empty())
    throw InvalidArgument("--windows " + windows.string() +
                          ": cannot tell the format from the extension (.csv or .json); give --windows-format");
  if (f != "csv" && f != "json") throw InvalidArgument("--windows-format: '" + f + "' is not one of csv, json");
  return f;
}

void add_options(po::options_description& desc, PredictOptions& opts) {
  desc.add_options()
    ("checkpoint", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.checkpoint = s; }),
     "checkpoint to predict with")
    ("format", po::value<std::string>(&opts.format)->default_value(opts.format), "output format: csv or json")
    ("vote", po::value<std::string>(&opts.vote)->default_value(opts.vote),
     "file-level vote over the file's tiles: mean or majority")
    ("threshold", po::value<double>(&opts.threshold)->default_value(opts.threshold, default_text(opts.threshold)),
     "detection probability at or above which the detection head says positive, in (0, 1)")
    ("threads", po::value<int>(&opts.threads)->default_value(opts.threads),
     "CPU threads for the spectrograms (0: all cores)")
    ("device", po::value<std::string>(&opts.device)->default_value(opts.device), "model device: cpu, cuda or auto")
    ("include-hidden", po::bool_switch(&opts.include_hidden),
     "also read files and folders whose name starts with '.' inside input folders (default: ignored)")
    ("hop", po::value<double>(&opts.hop)->value_name("SECONDS"),
     "seconds between tile starts, at most the tile (default: the hop the model was trained with)")
    ("windows", po::value<std::string>()->value_name("FILE")->notifier([&opts](const std::string& s) {
       opts.windows = s;
     }), "also write every tile's scores with start and end times to FILE (.csv or .json)")
    ("windows-format", po::value<std::string>(&opts.windows_format)->value_name("csv|json"),
     "format of the --windows file (default: from its extension)")
    ("strict", po::bool_switch(&opts.strict),
     "stop at the first input that cannot be scored (default: report it in its row, score the others, exit 3)")
    (kPredictInputsName, po::value<std::vector<std::string>>()->multitoken()->notifier(
         [&opts](const std::vector<std::string>& v) { opts.inputs.assign(v.begin(), v.end()); }),
     "audio files or folders (searched recursively)");
}

at::Tensor featurize_clip(const fs::path& path, const MelInfo& info, int threads) {
  featurize::ClipFeaturizer clips(info.mel_args(), mel::parse_dtype(info.dtype), static_cast<int>(info.channel),
                                  threads);
  featurize::ClipFeatures f = clips(path);
  return at::from_blob(f.frames.data(), {f.n_frames, f.n_mels}, at::kFloat).clone();
}

PredictTiles predict_tiles(const MelInfo& info, const nlohmann::json& train_config, int64_t model_frames,
                           double hop_seconds) {
  if (!std::isfinite(hop_seconds) || hop_seconds < 0)
    throw InvalidArgument("--hop must be a number of seconds > 0 (got " + std::to_string(hop_seconds) + ")");
  const data::views::FrameRate rate{info.sample_rate, info.hop_length};
  PredictTiles t;
  t.tile = model_frames > 0 ? model_frames : info.n_frames;
  t.hop = t.tile;
  const bool schema3 = info.long_seconds <= 0;
  if (schema3 && train_config.is_object() && train_config.contains("view")) {
    const TrainConfig config = TrainConfig::from_json(train_config);
    if (config.view.view == "tiles" && rate.frames(config.view.tile_seconds) == t.tile)
      t.hop = rate.frames(config.view.hop_seconds());
  }
  if (hop_seconds > 0) t.hop = rate.frames(hop_seconds);
  if (t.hop < 1 || t.hop > t.tile)
    throw InvalidArgument("--hop " + std::to_string(hop_seconds) + " s gives " + std::to_string(t.hop) +
                          " frames between tiles; it must be 1 .. the tile's " + std::to_string(t.tile) + " frames (" +
                          std::to_string(static_cast<double>(t.tile * info.hop_length) / info.sample_rate) + " s)");
  return t;
}

namespace {

/// Scores one input (its tiles, then the vote) into `row`, adding its tiles to `tiles_out`.
void predict_file(Classifier& model, const MelInfo& info, featurize::ClipFeaturizer& clips, const PredictOptions& opts,
                  const PredictTiles& tiles, at::Device device, WindowWriter& tiles_out, Row& row) {
  const Vote vote = parse_vote(opts.vote);
  featurize::ClipFeatures f = clips(row.path);
  const at::Tensor frames = at::from_blob(f.frames.data(), {f.n_frames, f.n_mels}, at::kFloat);
  const TileScores w =
      score_clip(model, frames, f.num_samples, tiles, info, mel::silence_value(info.mel_args()), device);
  const int64_t C = static_cast<int64_t>(w.probs.size()) / w.count;
  const vote::FileVotes file = vote_tiles(w, C, false, vote, opts.threshold);
  row.probs = file.class_probs;
  row.predicted = file.predicted[0];
  row.score = file.detection_score[0];
  row.detected = file.detected[0] != 0;
  row.num_windows = w.count;
  tiles_out.add(row.path, w, vote_tiles(w, C, true, vote, opts.threshold));
}

}  // namespace

PredictSummary run_predict(const PredictOptions& opts, std::ostream& out, std::ostream& log) {
  opts.validate();
  const Vote vote = parse_vote(opts.vote);
  const Checkpoint ck = load_checkpoint(opts.checkpoint);
  check_checkpoint_model(ck, opts.checkpoint.string(), "predict", kPredictBatchSegments, "", available_memory_bytes());
  const std::shared_ptr<Classifier> model = make_model_from_json(ck.model_config);
  load_state_dict(*model, ck.model, "checkpoint '" + opts.checkpoint.string() + "'");
  const MelInfo info = MelInfo::from_json(ck.mel);
  const int64_t C = static_cast<int64_t>(ck.class_names.size());
  if (C != ck.model_config.value("num_classes", C))
    throw FormatError("checkpoint '" + opts.checkpoint.string() + "': " + std::to_string(C) +
                      " class names for a model of " + ck.model_config["num_classes"].dump() + " classes");
  const PredictTiles tiles = predict_tiles(info, ck.config, model_frames(*model), opts.hop);
  const at::Device device = resolve_device(opts.device);
  model->to(device);
  model->eval();
  c10::NoGradGuard no_grad;

  const std::vector<PredictInput> files = collect_inputs(opts.inputs, opts.include_hidden);
  if (files.empty()) throw InvalidArgument("no audio files found in the inputs");
  featurize::ClipFeaturizer clips(info.mel_args(), mel::parse_dtype(info.dtype), static_cast<int>(info.channel),
                                  opts.threads);
  WindowWriter windows_out(opts.windows, opts.windows.empty() ? "" : opts.resolved_windows_format(), ck.class_names,
                           ck.positive_index >= 0);
  std::vector<Row> rows(files.size());
  PredictSummary summary;
  int64_t windows_scored = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    rows[i].path = files[i].path.string();
    rows[i].error = files[i].error;
    try {
      if (rows[i].error.empty()) {
        predict_file(*model, info, clips, opts, tiles, device, windows_out, rows[i]);
        windows_scored += rows[i].num_windows;
      }
    } catch (const AudioError& e) {
      rows[i].error = e.what();
    } catch (const IoError& e) {
      rows[i].error = e.what();
    }
    if (rows[i].error.empty()) {
      ++summary.scored;
      continue;
    }
    ++summary.failed;
    if (!opts.strict) continue;
    const std::string error = rows[i].error;
    rows.resize(i);
    opts.format == "csv" ? write_csv(rows, ck.class_names, ck.positive_index >= 0, out) : write_json(rows, ck, out);
    windows_out.close();
    throw AudioError("predict --strict: stopped at " + files[i].path.string() + " (" + error + ")");
  }
  windows_out.close();
  opts.format == "csv" ? write_csv(rows, ck.class_names, ck.positive_index >= 0, out) : write_json(rows, ck, out);
  const auto seconds = [&info](int64_t frames) {
    return static_cast<double>(frames * info.hop_length) / static_cast<double>(info.sample_rate);
  };
  log << "predict: " << summary.scored << " file(s) scored, " << summary.failed << " unreadable; " << windows_scored
      << " tile(s) of " << tiles.tile << " frames (" << seconds(tiles.tile) << " s) every " << tiles.hop
      << " frames (" << seconds(tiles.hop) << " s) covering every frame of each file; model " << model->kind() << " (epoch " << ck.epoch << "), vote " << to_string(vote) << ", "
      << (ck.positive_index >= 0 ? "detection of '" + ck.positive_class + "' at " + number(opts.threshold)
                                 : std::string("no detection head (--positive-class none)"))
      << ", device " << device.str() << '\n';
  if (summary.scored == 0)
    throw AudioError("no input file could be scored (first error: " + rows.front().error + ")");
  return summary;
}

}  // namespace melforge::trainer
