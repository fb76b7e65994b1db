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
#include "eval/multilabel.h"
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
  /// Multilabel: 1 for each class in the file's label set, [C].
  std::vector<uint8_t> labels;
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

/// The model's outputs on every tile of a file: softmax probabilities float32 [W, C] (multilabel: the sigmoid of each
/// class logit) and sigmoid detection probabilities [W] (empty without a detection head, and for multilabel),
/// row-major, with each tile's start and end, seconds.
struct TileScores {
  std::vector<float> probs;
  std::vector<float> det;
  std::vector<double> start, end;
  int64_t count = 0;
};

/// Runs the tiles of `frames` (float32 [T, n_mels], one clip of `num_samples` samples) through `model`
/// kPredictBatchSegments at a time, each padded with `pad` past its real frames and masked by its length.
TileScores score_clip(Classifier& model, const at::Tensor& frames, int64_t num_samples, const PredictTiles& tiles,
                      const MelInfo& info, float pad, at::Device device, bool multilabel) {
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
    const at::Tensor logits = out.logits.to(at::kFloat);
    const at::Tensor p = (multilabel ? at::sigmoid(logits) : at::softmax(logits, 1)).to(at::kCPU).contiguous();
    w.probs.insert(w.probs.end(), p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
    if (out.detection.defined() && !multilabel) {
      const at::Tensor d = at::sigmoid(out.detection.to(at::kFloat)).to(at::kCPU).contiguous();
      w.det.insert(w.det.end(), d.data_ptr<float>(), d.data_ptr<float>() + d.numel());
    }
  }
  return w;
}

/// Each tile's clip: 0 for all (the whole file as one clip) or, `per_tile`, its own index.
std::vector<int64_t> tile_clips(const TileScores& w, bool per_tile) {
  std::vector<int64_t> clip(static_cast<std::size_t>(w.count), 0);
  if (per_tile) std::iota(clip.begin(), clip.end(), int64_t{0});
  return clip;
}

/// The vote over `w`'s tiles: the whole file as one clip (`vote`), or (`per_tile`) each tile on its own.
vote::FileVotes vote_tiles(const TileScores& w, int64_t C, bool per_tile, Vote v, double threshold) {
  return vote::vote_clips(w.probs, w.det, tile_clips(w, per_tile), per_tile ? w.count : 1, C,
                          per_tile ? Vote::mean : v, threshold);
}

/// How predict turns a checkpoint's tile outputs into decisions.
struct Rule {
  /// A --task multilabel checkpoint (sigmoid scores, label sets) rather than multiclass (softmax, vote).
  bool multilabel = false;
  vote::Aggregate aggregate = vote::Aggregate::mean;
  Vote vote = Vote::mean;
  /// The detection threshold (multiclass) or the class-score threshold of the label sets (multilabel).
  double threshold = 0.5;
  /// Multilabel: where `threshold` comes from, for the log line.
  std::string threshold_source;
};

/// The rule for checkpoint `ck` (read from `what`) under `opts`: multilabel takes --aggregate (else the run's) and
/// --threshold (else the val-tuned threshold the checkpoint stores, else 0.5). Throws InvalidArgument for --vote
/// majority with a multilabel checkpoint and --aggregate with a multiclass one, FormatError for a stored threshold
/// outside [0, 1].
Rule predict_rule(const PredictOptions& opts, const Checkpoint& ck, const std::string& what) {
  Rule r;
  r.multilabel = model_task(ck.model_config) == kTaskMultilabel;
  r.vote = parse_vote(opts.vote);
  if (!r.multilabel) {
    if (!opts.aggregate.empty())
      throw InvalidArgument("--aggregate applies to a --task multilabel checkpoint; " + what +
                            " is --task multiclass (its tiles are combined by --vote)");
    r.threshold = opts.threshold.value_or(0.5);
    return r;
  }
  if (r.vote != Vote::mean)
    throw InvalidArgument("--vote " + opts.vote + ": " + what + " is --task multilabel; its tiles are combined by "
                          "--aggregate mean|max (default: the run's)");
  r.aggregate = vote::parse_aggregate(opts.aggregate.empty() ? trained_aggregate(ck.config) : opts.aggregate);
  const double stored = stored_threshold(ck.state, what);
  r.threshold = opts.threshold.value_or(stored >= 0 ? stored : 0.5);
  r.threshold_source = opts.threshold ? "--threshold"
                       : stored >= 0  ? "the threshold tuned on val, stored in the checkpoint"
                                      : "the default: the checkpoint stores no threshold tuned on val";
  return r;
}

/// The names of the classes whose `labels` entry (row `row` of [rows, C]) is set, in class order.
nlohmann::json label_set(const std::vector<uint8_t>& labels, std::size_t row, const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t c = 0; c < names.size(); ++c)
    if (labels[row * names.size() + c] != 0) out.push_back(names[c]);
  return out;
}

/// A label set as one CSV text: the names joined with ';' (the separator of multi-label manifests).
std::string joined(const nlohmann::json& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ";") + n.get<std::string>();
  return s;
}

/// Writes the --windows file (one row per tile) as files are scored: CSV (path, window, start, end, predicted, detection_score,
/// detected, p_<class>...) or a JSON array of objects with the same fields (probabilities by class name). Without a
/// detection head (`detection` false: --positive-class none) the detection fields are empty (CSV) or null (JSON).
/// Multilabel (`multilabel`): path, window, start, end, labels (CSV: joined with ';'), p_<class>... (each class's
/// sigmoid on the tile).
class WindowWriter {
 public:
  WindowWriter(const fs::path& path, std::string format, const std::vector<std::string>& class_names, bool detection,
               bool multilabel)
      : path_(path), format_(std::move(format)), class_names_(class_names), detection_(detection),
        multilabel_(multilabel) {
    if (path.empty()) return;
    file_.open(path, std::ios::binary | std::ios::trunc);
    if (!file_) throw IoError(path.string() + ": cannot write the --windows file: " + std::strerror(errno));
    if (format_ == "json") {
      file_ << "[";
    } else {
      file_ << (multilabel_ ? "path,window,start,end,labels"
                            : "path,window,start,end,predicted,detection_score,detected");
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
  /// Adds the tiles of one file of a multilabel checkpoint (`tiles`: one clip per tile, from multilabel_clips).
  void add(const std::string& file, const TileScores& w, const vote::ClipLabels& tiles) {
    if (path_.empty()) return;
    const auto C = class_names_.size();
    for (int64_t k = 0; k < w.count; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      const nlohmann::json labels = label_set(tiles.labels, kk, class_names_);
      if (format_ == "json") {
        nlohmann::json probs = nlohmann::json::object();
        for (std::size_t c = 0; c < C; ++c) probs[class_names_[c]] = tiles.scores[kk * C + c];
        const nlohmann::json o = {{"path", file}, {"window", k}, {"start", w.start[kk]}, {"end", w.end[kk]},
                                  {"labels", labels}, {"probabilities", probs}};
        file_ << (first_ ? "\n" : ",\n") << utf8::dump(o, -1);
        first_ = false;
        continue;
      }
      file_ << csv_field(utf8::escape(file)) << ',' << k << ',' << number(w.start[kk], 10) << ','
            << number(w.end[kk], 10) << ',' << csv_field(utf8::escape(joined(labels)));
      for (std::size_t c = 0; c < C; ++c) file_ << ',' << number(tiles.scores[kk * C + c]);
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
  bool multilabel_;
  std::ofstream file_;
  bool first_ = true;
};

/// Writes the rows of a multilabel checkpoint as CSV with a header: path, labels (the label set joined with ';'),
/// p_<class> per class (its score), error.
void write_multilabel_csv(const std::vector<Row>& rows, const std::vector<std::string>& class_names,
                          std::ostream& out) {
  const auto field = [](const std::string& text) { return csv_field(utf8::escape(text)); };
  out << "path,labels";
  for (const auto& n : class_names) out << ',' << field("p_" + n);
  out << ",error\n";
  for (const Row& r : rows) {
    out << field(r.path) << ',';
    if (r.error.empty()) {
      out << field(joined(label_set(r.labels, 0, class_names)));
      for (float p : r.probs) out << ',' << number(p);
      out << ",\n";
    } else {
      for (std::size_t c = 0; c < class_names.size(); ++c) out << ',';
      out << ',' << field(r.error) << '\n';
    }
  }
}

/// Writes `rows` as CSV with a header: path, predicted, detection_score, detected, p_<class> per class of
/// `class_names`, error (detection fields empty without a detection head, `detection` false). Paths, class names and
/// errors go through utf8::escape, as in the JSON output. Multilabel rows: write_multilabel_csv.
void write_csv(const std::vector<Row>& rows, const std::vector<std::string>& class_names, bool detection,
               bool multilabel, std::ostream& out) {
  if (multilabel) return write_multilabel_csv(rows, class_names, out);
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
/// head), names not valid UTF-8 escaped (utf8::dump). Multilabel (`rule.multilabel`): path, labels (names, class
/// order), probabilities (each class's score), threshold, num_windows.
void write_json(const std::vector<Row>& rows, const Checkpoint& ck, const Rule& rule, std::ostream& out) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      arr.push_back({{"path", r.path}, {"error", r.error}});
      continue;
    }
    nlohmann::json probs = nlohmann::json::object();
    for (std::size_t c = 0; c < ck.class_names.size(); ++c) probs[ck.class_names[c]] = r.probs[c];
    if (rule.multilabel) {
      arr.push_back({{"path", r.path}, {"labels", label_set(r.labels, 0, ck.class_names)}, {"probabilities", probs},
                     {"threshold", rule.threshold}, {"num_windows", r.num_windows}});
      continue;
    }
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
  if (!aggregate.empty()) vote::parse_aggregate(aggregate);
  if (threshold && !(*threshold > 0 && *threshold < 1))
    throw InvalidArgument("--threshold must be in (0, 1) (got " + std::to_string(*threshold) + ")");
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
    ("aggregate", po::value<std::string>(&opts.aggregate)->value_name("mean|max"),
     "--task multilabel checkpoint: a file's class score is the mean or max over its tiles (default: the run's)")
    ("threshold", po::value<double>()->value_name("P")->notifier([&opts](double t) { opts.threshold = t; }),
     "in (0, 1): detection probability at or above which the detection head says positive (default 0.5); --task "
     "multilabel: class score at or above which a class is in a file's labels (default: the threshold tuned on val "
     "that the checkpoint stores, else 0.5)")
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

/// Scores one input (its tiles, then the vote, or for multilabel the aggregate and label sets) into `row`, adding its
/// tiles to `tiles_out`.
void predict_file(Classifier& model, const MelInfo& info, featurize::ClipFeaturizer& clips, const Rule& rule,
                  const PredictTiles& tiles, at::Device device, WindowWriter& tiles_out, Row& row) {
  featurize::ClipFeatures f = clips(row.path);
  const at::Tensor frames = at::from_blob(f.frames.data(), {f.n_frames, f.n_mels}, at::kFloat);
  const TileScores w = score_clip(model, frames, f.num_samples, tiles, info, mel::silence_value(info.mel_args()),
                                  device, rule.multilabel);
  const int64_t C = static_cast<int64_t>(w.probs.size()) / w.count;
  row.num_windows = w.count;
  if (rule.multilabel) {
    vote::ClipLabels file =
        vote::multilabel_clips(w.probs, tile_clips(w, false), 1, C, rule.aggregate, rule.threshold);
    row.probs = std::move(file.scores);
    row.labels = std::move(file.labels);
    tiles_out.add(row.path, w,
                  vote::multilabel_clips(w.probs, tile_clips(w, true), w.count, C, rule.aggregate, rule.threshold));
    return;
  }
  const Vote vote = rule.vote;
  const double threshold = rule.threshold;
  const vote::FileVotes file = vote_tiles(w, C, false, vote, threshold);
  row.probs = file.class_probs;
  row.predicted = file.predicted[0];
  row.score = file.detection_score[0];
  row.detected = file.detected[0] != 0;
  tiles_out.add(row.path, w, vote_tiles(w, C, true, vote, threshold));
}

}  // namespace

PredictSummary run_predict(const PredictOptions& opts, std::ostream& out, std::ostream& log) {
  opts.validate();
  const Checkpoint ck = load_checkpoint(opts.checkpoint);
  check_checkpoint_model(ck, opts.checkpoint.string(), "predict", kPredictBatchSegments, "", available_memory_bytes());
  const std::string what = "checkpoint '" + utf8::for_terminal(opts.checkpoint.string()) + "'";
  if (model_task(ck.model_config) == kTaskVerification)
    throw FormatError(what + " was trained with --task verification: it has no classes to predict (melforge-train "
                      "embed gives its embeddings)");
  const Rule rule = predict_rule(opts, ck, what);
  const std::shared_ptr<Classifier> model = make_model_from_json(ck.model_config, /*any_task=*/rule.multilabel);
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
                           ck.positive_index >= 0, rule.multilabel);
  std::vector<Row> rows(files.size());
  const auto write_rows = [&](const std::vector<Row>& done) {
    if (opts.format == "csv") write_csv(done, ck.class_names, ck.positive_index >= 0, rule.multilabel, out);
    else write_json(done, ck, rule, out);
  };
  PredictSummary summary;
  int64_t windows_scored = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    rows[i].path = files[i].path.string();
    rows[i].error = files[i].error;
    try {
      if (rows[i].error.empty()) {
        predict_file(*model, info, clips, rule, tiles, device, windows_out, rows[i]);
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
    write_rows(rows);
    windows_out.close();
    throw AudioError("predict --strict: stopped at " + files[i].path.string() + " (" + error + ")");
  }
  windows_out.close();
  write_rows(rows);
  const auto seconds = [&info](int64_t frames) {
    return static_cast<double>(frames * info.hop_length) / static_cast<double>(info.sample_rate);
  };
  log << "predict: " << summary.scored << " file(s) scored, " << summary.failed << " unreadable; " << windows_scored
      << " tile(s) of " << tiles.tile << " frames (" << seconds(tiles.tile) << " s) every " << tiles.hop
      << " frames (" << seconds(tiles.hop) << " s) covering every frame of each file; model " << model->kind()
      << " (epoch " << ck.epoch << "), "
      << (rule.multilabel ? "--task multilabel: " + vote::to_string(rule.aggregate) +
                                " class scores over the tiles, labels at a score >= " + number(rule.threshold) + " (" +
                                rule.threshold_source + ")"
          : "vote " + to_string(rule.vote) + ", " +
                (ck.positive_index >= 0 ? "detection of '" + ck.positive_class + "' at " + number(rule.threshold)
                                        : std::string("no detection head (--positive-class none)")))
      << ", device " << device.str() << '\n';
  if (summary.scored == 0)
    throw AudioError("no input file could be scored (first error: " + rows.front().error + ")");
  return summary;
}

}  // namespace melforge::trainer
