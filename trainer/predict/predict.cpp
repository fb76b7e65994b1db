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
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "eval/metrics.h"
#include "featurize/featurize.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/options.h"
#include "melforge/common/utf8.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "util.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
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
  int64_t num_valid_long = 0;
};

at::Device resolve_device(const std::string& name) {
  if (name == "cpu") return at::kCPU;
  const bool cuda = torch::cuda::is_available();
  if (name == "cuda" && !cuda) throw InvalidArgument("--device cuda: no CUDA device is available");
  return cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

/// Scores the files of `feats` (each [L, S, M, T]) and fills their rows.
void score_chunk(Classifier& model, const std::vector<FileFeatures>& feats, const std::vector<Row*>& rows,
                 Vote vote, double threshold, at::Device device) {
  const at::Tensor mel = at::stack([&] {
    std::vector<at::Tensor> v;
    for (const auto& f : feats) v.push_back(f.mel);
    return v;
  }());
  const int64_t F = mel.size(0), L = mel.size(1), S = mel.size(2), M = mel.size(3), T = mel.size(4);
  std::vector<int64_t> idx, nvl;
  for (int64_t f = 0; f < F; ++f) {
    nvl.push_back(feats[f].num_valid_long);
    for (int64_t l = 0; l < feats[f].num_valid_long; ++l) idx.push_back(f * L + l);
  }
  const int64_t V = static_cast<int64_t>(idx.size());
  const at::Tensor index = at::from_blob(idx.data(), {V}, at::kLong).clone();
  const at::Tensor x = mel.reshape({F * L, S, M, T}).index_select(0, index).reshape({V * S, M, T}).to(device);
  const ModelOutput out = model.forward(x);
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor dev_index = index.to(device);
  const at::Tensor probs = at::zeros({F * L, S, out.logits.size(1)}, fopts)
                               .index_copy_(0, dev_index, at::softmax(out.logits.to(at::kFloat), 1).view({V, S, -1}))
                               .view({F, L, S, -1});
  const at::Tensor det = at::zeros({F * L, S}, fopts)
                             .index_copy_(0, dev_index, at::sigmoid(out.detection.to(at::kFloat)).view({V, S}))
                             .view({F, L, S});
  const at::Tensor cprobs = probs.to(at::kCPU).contiguous(), cdet = det.to(at::kCPU).contiguous();
  const int64_t C = cprobs.size(3);
  const vote::FileVotes fv =
      vote::aggregate_files({cprobs.data_ptr<float>(), static_cast<std::size_t>(cprobs.numel())},
                            {cdet.data_ptr<float>(), static_cast<std::size_t>(cdet.numel())}, nvl, {F, L, S, C},
                            vote, threshold);
  for (int64_t f = 0; f < F; ++f) {
    Row& r = *rows[f];
    r.probs.assign(fv.class_probs.begin() + f * C, fv.class_probs.begin() + (f + 1) * C);
    r.predicted = fv.predicted[f];
    r.score = fv.detection_score[f];
    r.detected = fv.detected[f] != 0;
    r.num_valid_long = nvl[f];
  }
}

/// Writes `rows` as CSV with a header: path, predicted, detection_score, detected, p_<class> per class of
/// `class_names`, error. Paths, class names and errors go through utf8::escape, as in the JSON output.
void write_csv(const std::vector<Row>& rows, const std::vector<std::string>& class_names, std::ostream& out) {
  const auto field = [](const std::string& text) { return csv_field(utf8::escape(text)); };
  out << "path,predicted,detection_score,detected";
  for (const auto& n : class_names) out << ',' << field("p_" + n);
  out << ",error\n";
  for (const Row& r : rows) {
    out << field(r.path);
    if (r.error.empty()) {
      out << ',' << field(class_names[static_cast<std::size_t>(r.predicted)]) << ',' << number(r.score) << ','
          << (r.detected ? 1 : 0);
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
/// positive_class, detection_score, detected, num_valid_long), names not valid UTF-8 escaped (utf8::dump).
void write_json(const std::vector<Row>& rows, const Checkpoint& ck, std::ostream& out) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      arr.push_back({{"path", r.path}, {"error", r.error}});
      continue;
    }
    nlohmann::json probs = nlohmann::json::object();
    for (std::size_t c = 0; c < ck.class_names.size(); ++c) probs[ck.class_names[c]] = r.probs[c];
    arr.push_back({{"path", r.path},
                   {"predicted", ck.class_names[static_cast<std::size_t>(r.predicted)]},
                   {"probabilities", probs},
                   {"positive_class", ck.positive_class},
                   {"detection_score", r.score},
                   {"detected", r.detected},
                   {"num_valid_long", r.num_valid_long}});
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
}

void add_options(po::options_description& desc, PredictOptions& opts) {
  desc.add_options()
    ("checkpoint", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.checkpoint = s; }),
     "checkpoint to predict with")
    ("format", po::value<std::string>(&opts.format)->default_value(opts.format), "output format: csv or json")
    ("vote", po::value<std::string>(&opts.vote)->default_value(opts.vote),
     "file-level vote over long segments: mean or majority")
    ("threshold", po::value<double>(&opts.threshold)->default_value(opts.threshold, default_text(opts.threshold)),
     "detection probability at or above which the detection head says positive, in (0, 1)")
    ("threads", po::value<int>(&opts.threads)->default_value(opts.threads),
     "CPU threads for the spectrograms (0: all cores)")
    ("device", po::value<std::string>(&opts.device)->default_value(opts.device), "model device: cpu, cuda or auto")
    ("include-hidden", po::bool_switch(&opts.include_hidden),
     "also read files and folders whose name starts with '.' inside input folders (default: ignored)")
    (kPredictInputsName, po::value<std::vector<std::string>>()->multitoken()->notifier(
         [&opts](const std::vector<std::string>& v) { opts.inputs.assign(v.begin(), v.end()); }),
     "audio files or folders (searched recursively)");
}

struct Featurizer::Impl {
  std::unique_ptr<featurize::Featurizer> featurizer;
  std::vector<int64_t> shape;
};

Featurizer::Featurizer(const MelInfo& info, int threads) : impl_(std::make_unique<Impl>()) {
  impl_->featurizer = std::make_unique<featurize::Featurizer>(info.dataset_params(), threads);
  impl_->shape = info.file_shape();
}

Featurizer::~Featurizer() = default;

FileFeatures Featurizer::operator()(const fs::path& path) {
  featurize::FloatFeatures f = (*impl_->featurizer)(path);
  FileFeatures out;
  out.num_valid_long = f.num_valid_long;
  out.mel = at::empty(impl_->shape, at::kFloat);
  std::memcpy(out.mel.data_ptr<float>(), f.values.data(), f.values.size() * sizeof(float));
  return out;
}

FileFeatures featurize_file(const fs::path& path, const MelInfo& info, int threads) {
  Featurizer f(info, threads);
  return f(path);
}

void run_predict(const PredictOptions& opts, std::ostream& out, std::ostream& log) {
  opts.validate();
  const Vote vote = parse_vote(opts.vote);
  const Checkpoint ck = load_checkpoint(opts.checkpoint);
  const std::shared_ptr<Classifier> model = make_model_from_json(ck.model_config);
  load_state_dict(*model, ck.model, "checkpoint '" + opts.checkpoint.string() + "'");
  const MelInfo info = MelInfo::from_json(ck.mel);
  const int64_t C = static_cast<int64_t>(ck.class_names.size());
  if (C != ck.model_config.value("num_classes", C))
    throw FormatError("checkpoint '" + opts.checkpoint.string() + "': " + std::to_string(C) +
                      " class names for a model of " + ck.model_config["num_classes"].dump() + " classes");
  const at::Device device = resolve_device(opts.device);
  model->to(device);
  model->eval();
  c10::NoGradGuard no_grad;

  const std::vector<PredictInput> files = collect_inputs(opts.inputs, opts.include_hidden);
  if (files.empty()) throw InvalidArgument("no audio files found in the inputs");
  Featurizer featurize(info, opts.threads);
  std::vector<Row> rows(files.size());
  const int64_t segments_per_file = info.num_long * info.num_short;
  const int64_t chunk_files = std::max<int64_t>(1, 1024 / std::max<int64_t>(1, segments_per_file));
  std::vector<FileFeatures> feats;
  std::vector<Row*> pending;
  int64_t scored = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    rows[i].path = files[i].path.string();
    rows[i].error = files[i].error;
    try {
      if (rows[i].error.empty()) {
        feats.push_back(featurize(files[i].path));
        pending.push_back(&rows[i]);
      }
    } catch (const AudioError& e) {
      rows[i].error = e.what();
    } catch (const IoError& e) {
      rows[i].error = e.what();
    }
    if (!feats.empty() && (static_cast<int64_t>(feats.size()) >= chunk_files || i + 1 == files.size())) {
      score_chunk(*model, feats, pending, vote, opts.threshold, device);
      scored += static_cast<int64_t>(feats.size());
      feats.clear();
      pending.clear();
    }
  }

  if (opts.format == "csv")
    write_csv(rows, ck.class_names, out);
  else
    write_json(rows, ck, out);
  const int64_t failed = static_cast<int64_t>(files.size()) - scored;
  log << "predict: " << scored << " file(s) scored, " << failed << " unreadable; model " << model->kind()
      << " (epoch " << ck.epoch << "), vote " << to_string(vote) << ", detection of '" << ck.positive_class
      << "' at " << opts.threshold << ", device " << device.str() << '\n';
  if (scored == 0)
    throw AudioError("no input file could be scored (first error: " + rows.front().error + ")");
}

}  // namespace melforge::trainer
