#include "embed/embed_command.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>

#include <boost/program_options.hpp>
#include <hdf5.h>

#include "data/dataset.h"
#include "eval/batching.h"
#include "eval/multilabel.h"
#include "eval/verification.h"
#include "featurize/clip_features.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "melforge/common/h5.h"
#include "models/model.h"
#include "options.h"
#include "predict/predict.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/setup.h"
#include "util.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

void EmbedOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
  if (out.empty()) throw InvalidArgument("--out is required: the HDF5 file to write");
  if (data.empty() == inputs.empty())
    throw InvalidArgument("embed needs either --data DIR (with --split) or audio files and folders, not both");
  if (split != "train" && split != "val" && split != "test")
    throw InvalidArgument("--split: '" + split + "' is not one of train, val, test");
  if (batch_size < 1) throw InvalidArgument("--eval-batch-size must be >= 1 (got " + std::to_string(batch_size) + ")");
  if (threads < 0) throw InvalidArgument("--threads must be >= 0 (got " + std::to_string(threads) + ")");
  if (embed_crops < 0 || embed_crops > kMaxEmbedCrops)
    throw InvalidArgument("--embed-crops must be 0 (whole files) or 1.." + std::to_string(kMaxEmbedCrops) + " (got " +
                          std::to_string(embed_crops) + ")");
  if (device != "cpu" && device != "cuda" && device != "auto")
    throw InvalidArgument("--device: '" + device + "' is not one of cpu, cuda, auto");
}

void add_options(po::options_description& desc, EmbedOptions& o) {
  desc.add_options()("checkpoint", po::value(&o.checkpoint)->value_name("FILE"), "a --task verification checkpoint")(
      "data", po::value(&o.data)->value_name("DIR"), "dataset folder whose --split is embedded")(
      "split", po::value(&o.split)->default_value(o.split), "split of --data: train, val or test")(
      "out", po::value(&o.out)->value_name("FILE"), "HDF5 file to write (embedding, path, label, class_names)")(
      "eval-batch-size", po::value(&o.batch_size)->default_value(o.batch_size)->value_name("N"),
      "tiles per forward pass (schema-1/2 splits; whole clips are batched by length)")(
      "threads", po::value(&o.threads)->default_value(o.threads)->value_name("N"),
      "CPU threads (0: all cores)")("device", po::value(&o.device)->default_value(o.device), "cpu, cuda or auto")(
      "embed-crops", po::value(&o.embed_crops)->default_value(o.embed_crops)->value_name("N"),
      "embed each file as the mean of N evenly spaced crops of the checkpoint's --crop-seconds (0: whole files)")(
      "include-hidden", po::bool_switch(&o.include_hidden), "read entries of input folders whose name starts with '.'")(
      "strict", po::bool_switch(&o.strict), "stop at the first audio input that cannot be embedded")(
      kEmbedInputsName, po::value<std::vector<std::string>>()->multitoken()->notifier(
                            [&o](const std::vector<std::string>& v) { o.inputs.assign(v.begin(), v.end()); }),
      "audio files or folders (searched recursively), instead of --data");
}

namespace {

/// The embeddings and what names their rows.
struct Embedded {
  at::Tensor embedding;
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  std::vector<std::string> skipped_path, skipped_reason;
};

void write_matrix(const h5::File& file, const std::string& name, const at::Tensor& m) {
  const at::Tensor c = m.to(at::kCPU, at::kFloat).contiguous();
  const hsize_t dims[2] = {static_cast<hsize_t>(c.size(0)), static_cast<hsize_t>(c.size(1))};
  const std::string what = h5::child_name(file, name);
  const hid_t space_id = H5Screate_simple(2, dims, nullptr);
  if (space_id < 0) h5::throw_io(what + ": cannot create the dataspace");
  const h5::Dataspace space(space_id, what);
  const hid_t id = H5Dcreate2(file.id(), name.c_str(), H5T_NATIVE_FLOAT, space.id(), H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT);
  if (id < 0) h5::throw_io(what + ": cannot create");
  const h5::Dataset ds(id, what);
  if (c.numel() > 0 && H5Dwrite(ds.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data_ptr<float>()) < 0)
    h5::throw_io(what + ": cannot write");
}

Embedded embed_dataset(Classifier& model, const EmbedOptions& opts, const EmbedCrops& crops, at::Device device) {
  const Split split = load_split(opts.data / (opts.split + ".h5"), opts.split, StreamOptions{});
  Embedded e;
  e.embedding = embed_split(model, split, opts.batch_size, device, at::kFloat, nullptr, crops);
  e.paths = split.paths;
  e.labels = split_labels(split);
  return e;
}

/// One audio file's embedding: the L2-normalised embedding of the whole utterance, `frames` float32 [T, n_mels]
/// (one forward pass over all T frames, every one real), or with crops.count > 0 the mean of the embeddings of the
/// crop_starts crops of `crop_frames` frames (one pass over them; the whole file when it is no longer than a crop).
at::Tensor embed_frames(Classifier& model, const at::Tensor& frames, const EmbedCrops& crops, int64_t crop_frames,
                        at::Device device) {
  const int64_t T = frames.size(0);
  std::vector<at::Tensor> rows;
  if (crops.count > 0 && T > crop_frames) {
    for (const int64_t start : crop_starts(T, crop_frames, crops.count))
      rows.push_back(frames.slice(0, start, start + crop_frames).t());
  } else {
    rows.push_back(frames.t());
  }
  const at::Tensor x = at::stack(rows).contiguous().to(device);
  const at::Tensor lengths =
      at::full({x.size(0)}, x.size(2), at::TensorOptions().dtype(at::kLong).device(device));
  const ModelOutput out = model.forward(x, lengths);
  if (!out.embedding.defined())
    throw InvalidArgument("embed: the model (" + model.kind() + ") gives no speaker embedding");
  const at::Tensor e = out.embedding.to(at::kFloat).mean(0).to(at::kCPU);
  return e / e.norm().clamp_min(1e-12);
}

Embedded embed_audio(Classifier& model, const MelInfo& info, const EmbedOptions& opts, const EmbedCrops& crops,
                     at::Device device, std::ostream& log) {
  const int64_t crop_frames = crops.count > 0 ? frame_rate(info).frames(crops.seconds) : 0;
  const std::vector<PredictInput> files = collect_inputs(opts.inputs, opts.include_hidden);
  if (files.empty()) throw InvalidArgument("no audio files found in the inputs");
  featurize::ClipFeaturizer clips(info.mel_args(), mel::parse_dtype(info.dtype), static_cast<int>(info.channel),
                                  opts.threads);
  ModeGuard mode(model);
  model.eval();
  c10::NoGradGuard no_grad;
  Embedded e;
  std::vector<at::Tensor> rows;
  for (const PredictInput& in : files) {
    std::string error = in.error;
    try {
      if (error.empty()) {
        featurize::ClipFeatures f = clips(in.path);
        rows.push_back(embed_frames(model, at::from_blob(f.frames.data(), {f.n_frames, f.n_mels}, at::kFloat), crops,
                                    crop_frames, device));
        e.paths.push_back(in.path.string());
        e.labels.push_back(-1);
      }
    } catch (const AudioError& err) {
      error = err.what();
    } catch (const IoError& err) {
      error = err.what();
    }
    if (error.empty()) continue;
    if (opts.strict) throw AudioError("embed --strict: stopped at " + in.path.string() + " (" + error + ")");
    log << "embed: skipped " << in.path.string() << ": " << error << '\n';
    e.skipped_path.push_back(in.path.string());
    e.skipped_reason.push_back(error);
  }
  if (rows.empty()) throw AudioError("no input file could be embedded (first error: " + e.skipped_reason.front() + ")");
  e.embedding = at::stack(rows);
  return e;
}

void write_embeddings(const EmbedOptions& opts, const Checkpoint& ck, const Classifier& model, const Embedded& e) {
  const fs::path partial = opts.out.string() + ".partial";
  std::error_code ec;
  try {
    h5::File file = h5::create_file(partial);
    write_matrix(file, "embedding", e.embedding);
    h5::write_strings(file, "path", e.paths);
    h5::write_int32(file, "label", e.labels);
    h5::write_strings(file, "class_names", ck.class_names);
    h5::write_strings(file, "skipped_path", e.skipped_path);
    h5::write_strings(file, "skipped_reason", e.skipped_reason);
    h5::write_attribute_string(file, "checkpoint", fs::absolute(opts.checkpoint).string());
    h5::write_attribute_string(file, "model", model.kind());
    h5::write_attribute_int64(file, "embedding_dim", e.embedding.size(1));
    h5::write_attribute_int64(file, "epoch", ck.epoch);
    h5::write_attribute_int64(file, "embed_crops", opts.embed_crops);
    h5::write_attribute_string(file, "source", opts.data.empty() ? "audio" : "dataset");
    if (!opts.data.empty()) {
      h5::write_attribute_string(file, "split", opts.split);
      h5::write_attribute_string(file, "data", fs::absolute(opts.data).string());
    }
    file.close();
  } catch (...) {
    fs::remove(partial, ec);
    throw;
  }
  fs::rename(partial, opts.out, ec);
  if (ec) {
    fs::remove(partial, ec);
    throw IoError("cannot rename '" + partial.string() + "' to '" + opts.out.string() + "'");
  }
}

}  // namespace

EmbedSummary run_embed(const EmbedOptions& opts, std::ostream& out, std::ostream& log) {
  opts.validate();
  RuntimeOptions runtime;
  runtime.device = opts.device;
  runtime.threads = opts.threads;
  const at::Device device = runtime.resolve_device();
  runtime.apply_threads();
  const Checkpoint ck = load_checkpoint(opts.checkpoint);
  check_checkpoint_model(ck, opts.checkpoint.string(), "embed", opts.batch_size, "--eval-batch-size",
                         available_memory_bytes());
  if (model_task(ck.model_config) != kTaskVerification)
    throw FormatError("embed needs a --task verification checkpoint; " + opts.checkpoint.string() +
                      " was trained with --task " + utf8::for_terminal(model_task(ck.model_config), 60));
  const MelInfo info = MelInfo::from_json(ck.mel);
  if (!opts.data.empty()) {
    const Dataset meta = load_dataset(opts.data, /*load_mel=*/false);
    check_checkpoint_fits(ck, meta.info, meta.class_names, opts.checkpoint.string(), opts.data.string(),
                          /*same_classes=*/false);
    meta.require_files(opts.split);
  }
  const std::shared_ptr<Classifier> model = make_model_from_json(ck.model_config, /*any_task=*/true);
  load_state_dict(*model, ck.model, "checkpoint '" + opts.checkpoint.string() + "'");
  model->to(device);
  const EmbedCrops crops{opts.embed_crops, TrainConfig::from_json(ck.config).view.crop_seconds};
  const Embedded e = opts.data.empty() ? embed_audio(*model, info, opts, crops, device, log)
                                       : embed_dataset(*model, opts, crops, device);
  if (const int64_t bad = first_non_finite_row(e.embedding); bad >= 0)
    throw Error("the checkpoint " + opts.checkpoint.string() + " gives a non-finite embedding for '" +
                e.paths[static_cast<std::size_t>(bad)] + "'");
  write_embeddings(opts, ck, *model, e);
  out << "wrote " << opts.out.string() << ": " << e.embedding.size(0) << " embeddings of " << e.embedding.size(1)
      << " values (model " << model->kind() << ", epoch " << ck.epoch << ")"
      << (e.skipped_path.empty() ? "" : fmt("; %zu input(s) skipped", e.skipped_path.size())) << '\n';
  return {e.embedding.size(0), static_cast<int64_t>(e.skipped_path.size())};
}

}  // namespace melforge::trainer
