#include "eval/eval_command.h"

#include <boost/program_options.hpp>
#include <cmath>

#include "data/dataset.h"
#include "eval/multilabel.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "melforge/common/fs_util.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/setup.h"
#include "util.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

void EvalCommandOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
  verify.validate();
  if (!scores.empty()) check_scores_path(scores, verify.trials, "--scores");
}

void add_options(po::options_description& desc, EvalCommandOptions& o) {
  desc.add_options()("checkpoint", po::value(&o.checkpoint)->value_name("FILE"), "checkpoint to evaluate")(
      "out", po::value(&o.out)->value_name("FILE"), "write the JSON report here")(
      "det-png", po::value(&o.det_png)->value_name("FILE"), "verification: write the DET curve as a PNG here")(
      "scores", po::value(&o.scores)->value_name("PATH"),
      "verification: write `score label enroll test` per trial here (several --trials: a folder of <list>.scores)");
  add_options(desc, o.verify);
}

namespace {

std::string summary_line(const char* level, const Metrics& m) {
  return fmt("  %-8s %7lld  accuracy %.4f  macro-F1 %.4f%s%s", level, static_cast<long long>(m.count), m.accuracy,
             m.macro_f1, m.has_detection ? fmt("  detection acc %.4f F1 %.4f", m.det_accuracy, m.det_f1).c_str() : "",
             std::isfinite(m.loss) ? fmt("  loss %.4f", m.loss).c_str() : "");
}

/// What an evaluation scored: "  scored F of F clips (S s of audio), P % of their frames (...)".
std::string coverage_line(const Coverage& c) {
  const std::string view =
      c.view == "tiles"         ? fmt("tiles of %lld frames, last tile of each clip padded and masked",
                                      static_cast<long long>(c.example_frames))
      : c.view == "embed-crops" ? fmt("evenly spaced crops of %lld frames, averaged",
                                      static_cast<long long>(c.example_frames))
                                : std::string("whole clips");
  return fmt("  scored %lld of %lld clips (%.1f of %.1f s of audio), %.2f %% of their frames (%s; %lld examples)",
             static_cast<long long>(c.clips_scored), static_cast<long long>(c.clips), c.seconds_scored, c.seconds,
             100.0 * c.fraction(), view.c_str(), static_cast<long long>(c.examples));
}

/// The view `model_kind` was trained through: the checkpoint's resolved "view" group, or (a checkpoint of a
/// schema-1/2 run from before views) the view resolve_view_options gives `split`.
data::views::ViewOptions trained_view(const Checkpoint& c, const Split& split, const std::string& model_kind) {
  const TrainConfig config = TrainConfig::from_json(c.config);
  return config.view_resolved ? config.view : resolve_view_options(config.view, split, model_kind);
}

/// The multi-label summary: mAP, ROC-AUC, F1 at the threshold and at the tuned one, and per class AP and AUC.
std::string multilabel_summary(const metrics::MultilabelMetrics& m, const std::vector<std::string>& classes) {
  std::string out = fmt("  files %lld  loss %.4f  mAP macro %.4f micro %.4f  ROC-AUC macro %.4f\n",
                        static_cast<long long>(m.files), m.loss, m.map_macro, m.map_micro, m.auc_macro);
  out += fmt("  F1 at %.4g: micro %.4f macro %.4f\n", m.f1.threshold, m.f1.micro, m.f1.macro);
  out += fmt("  F1 at %.4g (tuned on val): micro %.4f macro %.4f\n", m.f1_tuned.threshold, m.f1_tuned.micro,
             m.f1_tuned.macro);
  for (std::size_t c = 0; c < classes.size(); ++c)
    out += fmt("    %-20s AP %.4f  ROC-AUC %.4f  positives %lld\n", classes[c].c_str(), m.ap[c], m.auc[c],
               static_cast<long long>(m.positives[c]));
  return out;
}

/// `eval` of a --task multilabel checkpoint: the threshold is tuned on val, then `eval.split` is evaluated.
nlohmann::json run_multilabel_eval(const Checkpoint& c, Classifier& model, const DataOptions& data,
                                   EvalOptions eval, at::Device device, std::ostream& out) {
  const Split val = load_split(data.data / "val.h5", "val", data.stream);
  eval.view = trained_view(c, val, model.kind());
  const double tuned = tuned_threshold(evaluate_multilabel(model, val, eval, device), val);
  const Split split = eval.split == "val" ? val : load_split(data.data / (eval.split + ".h5"), eval.split, data.stream);
  const EvalResult r = evaluate_multilabel(model, split, eval, device, at::kFloat, tuned);
  nlohmann::json report = r.to_json(c.class_names);
  report["task"] = kTaskMultilabel;
  report["aggregate"] = eval.aggregate;
  report["tuned_threshold"] = tuned;
  out << "checkpoint (epoch " << c.epoch << ", task multilabel) on " << eval.split << " of " << data.data.string()
      << ": " << split.files() << " files, aggregate " << eval.aggregate << "\n"
      << coverage_line(r.coverage) << "\n"
      << multilabel_summary(r.multilabel, c.class_names) << fmt("  %.2f s, %.0f files/s\n", r.seconds, r.files_per_s);
  return report;
}

/// The crops --embed-crops asks for, of the checkpoint's --crop-seconds.
EmbedCrops checkpoint_crops(const Checkpoint& c, const VerifyOptions& verify) {
  return {verify.embed_crops, TrainConfig::from_json(c.config).view.crop_seconds};
}

/// The summary line of one scored list: "  <list>: EER ... minDCF ... (T target, N non-target trials)".
std::string list_line(const SplitTrials& set, const EvalResult& r) {
  const auto& m = r.verification;
  return fmt("  %s: EER %.4f %%  minDCF(0.01) %.4f  minDCF(0.05) %.4f  (EER threshold %.4f; %lld target, %lld "
             "non-target trials)",
             set.list.empty() ? "generated" : set.list.string().c_str(), 100.0 * m.eer, m.min_dcf_01, m.min_dcf_05,
             m.eer_threshold, static_cast<long long>(m.targets), static_cast<long long>(m.nontargets));
}

/// `eval` of a --task verification checkpoint: the split embedded once, its file embeddings scored on each trial
/// list (or its generated trials; AS-norm against the training split's with --as-norm).
nlohmann::json run_verification_eval(const Checkpoint& c, Classifier& model, const EvalCommandOptions& opts,
                                     const DataOptions& data, const EvalOptions& eval, at::Device device,
                                     std::ostream& out) {
  const Split split = load_split(data.data / (eval.split + ".h5"), eval.split, data.stream);
  std::string said;
  const std::vector<SplitTrials> sets =
      split_trial_sets(split_labels(split), split.paths, opts.verify, /*use_list=*/true, split.name, &said);
  if (!said.empty()) out << said << "\n";
  const EmbedCrops crops = checkpoint_crops(c, opts.verify);
  Coverage coverage;
  const at::Tensor emb = embed_split(model, split, eval.batch_size, device, at::kFloat, &coverage, crops);
  int64_t passes = coverage.batches;
  if (const int64_t bad = first_non_finite_row(emb); bad >= 0)
    throw Error("the checkpoint " + opts.checkpoint.string() + " gives a non-finite embedding for file '" +
                split.paths[static_cast<std::size_t>(bad)] + "' of " + split.path.string());
  at::Tensor cohort;
  if (opts.verify.as_norm > 0) {
    const Split train = load_split(data.data / "train.h5", "train", data.stream);
    Coverage train_coverage;
    cohort = cohort_rows(embed_split(model, train, eval.batch_size, device, at::kFloat, &train_coverage, crops),
                         opts.verify);
    passes += train_coverage.batches;
  }
  const std::vector<fs::path> written =
      opts.scores.empty() ? std::vector<fs::path>{} : scores_paths(opts.scores, sets, "--scores");
  if (sets.size() > 1 && !written.empty()) fs::create_directories(opts.scores);
  nlohmann::json lists = nlohmann::json::object(), names = nlohmann::json::array(), files = nlohmann::json::array();
  std::vector<EvalResult> results;
  for (std::size_t k = 0; k < sets.size(); ++k) {
    std::vector<float> scores;
    results.push_back(score_trials(emb, sets[k].trials, opts.verify, cohort, &scores));
    results.back().coverage = coverage;
    if (!written.empty()) {
      write_file_atomically(written[k], scores_text(sets[k], scores));
      files.push_back(written[k].string());
    }
    if (!sets[k].list.empty()) {
      lists[sets[k].list.string()] = verification_json(results.back(), opts.verify, sets[k].list);
      names.push_back(sets[k].list.string());
    }
  }
  const EvalResult& r = results.front();
  if (!opts.det_png.empty()) verification::write_det_png(opts.det_png, r.det, r.verification.eer);
  const nlohmann::json v = verification_json(r, opts.verify, sets.front().list);
  nlohmann::json report = {{"task", kTaskVerification}, {"EER", v["EER"]}, {"minDCF_0.01", v["minDCF_0.01"]},
                           {"minDCF_0.05", v["minDCF_0.05"]}, {"verification", v}, {"files", split.files()},
                           {"coverage", r.coverage.to_json()}, {"lists", lists}, {"trial_lists", names},
                           {"scores", files}, {"forward_passes", passes}};
  out << "checkpoint (epoch " << c.epoch << ", task verification) on " << eval.split << " of " << data.data.string()
      << ": " << split.files() << " files, " << sets.size() << (sets.size() == 1 ? " trial set, " : " trial sets, ")
      << v["scoring"].get<std::string>() << " scoring"
      << (crops.count > 0 ? fmt(", embeddings: mean of %lld crops of %g s", static_cast<long long>(crops.count),
                                crops.seconds)
                          : std::string(", embeddings of whole utterances"))
      << "\n";
  for (std::size_t k = 0; k < sets.size(); ++k) out << list_line(sets[k], results[k]) << "\n";
  out << coverage_line(r.coverage) << "\n";
  if (!opts.det_png.empty()) out << "DET curve: " << opts.det_png.string() << "\n";
  for (const auto& f : files) out << "scores: " << f.get<std::string>() << "\n";
  return report;
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
  check_checkpoint_model(c, opts.checkpoint.string(), "eval", eval.batch_size, "--eval-batch-size",
                         available_memory_bytes());
  const std::string task = model_task(c.model_config);
  {
    const Dataset meta = load_dataset(data.data, /*load_mel=*/false);
    check_checkpoint_fits(c, meta.info, meta.class_names, opts.checkpoint.string(), data.data.string(),
                          /*same_classes=*/task != kTaskVerification);
    meta.require_files(eval.split);
    if (task != kTaskVerification && (!opts.verify.trials.empty() || !opts.det_png.empty() || opts.verify.as_norm ||
                                      !opts.scores.empty() || opts.verify.embed_crops > 0))
      throw InvalidArgument("--trials, --as-norm, --embed-crops, --scores and --det-png score a --task verification "
                            "checkpoint; " +
                            opts.checkpoint.string() + " was trained with --task " + utf8::for_terminal(task, 60));
    if (opts.verify.as_norm > 0) meta.require_files("train");
    const bool multilabel = task == kTaskMultilabel;
    if (multilabel ? eval.vote != "mean" : eval.aggregate != "mean")
      throw InvalidArgument(multilabel ? "--vote applies to --task multiclass checkpoints; this one is multilabel "
                                         "(use --aggregate)"
                                       : "--aggregate applies to --task multilabel checkpoints; this one is "
                                         "multiclass (use --vote)");
    if (multilabel) {
      if (!meta.multilabel())
        throw FormatError("the checkpoint " + opts.checkpoint.string() + " was trained with --task multilabel but "
                          "the dataset " + data.data.string() + " has no multi-label targets matrix");
      meta.require_files("val");
    }
  }
  std::shared_ptr<Classifier> model = make_model_from_json(c.model_config, /*any_task=*/true);
  load_state_dict(*model, c.model, opts.checkpoint.string());
  model->to(device);
  if (task == kTaskMultilabel || task == kTaskVerification) {
    nlohmann::json report = task == kTaskMultilabel ? run_multilabel_eval(c, *model, data, eval, device, out)
                                                    : run_verification_eval(c, *model, opts, data, eval, device, out);
    report["checkpoint"] = fs::absolute(opts.checkpoint).string();
    report["data"] = fs::absolute(data.data).string();
    report["split"] = eval.split;
    report["classes"] = c.class_names;
    report["epoch"] = c.epoch;
    if (!opts.out.empty()) {
      write_json_atomically(opts.out, report);
      out << "report: " << opts.out.string() << "\n";
    }
    return report;
  }
  const Split split = load_split(data.data / (eval.split + ".h5"), eval.split, data.stream);
  double bce_weight = 1.0;
  if (c.config.contains("train") && c.config["train"].contains("bce_weight") &&
      c.config["train"]["bce_weight"].is_number())
    bce_weight = c.config["train"]["bce_weight"].get<double>();
  log.debug("evaluating " + opts.checkpoint.string() + " on " + split.path.string() + " (" + device.str() + ")");
  EvalOptions through = eval;
  through.view = trained_view(c, split, model->kind());
  const EvalResult r = evaluate(*model, split, c.positive_index, bce_weight, through, device);
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
  out << coverage_line(r.coverage) << "\n";
  out << summary_line("tiles", r.segment) << "\n" << summary_line("clips", r.file) << "\n";
  out << fmt("  %.2f s, %.0f files/s\n", r.seconds, r.files_per_s);
  if (!opts.out.empty()) {
    write_json_atomically(opts.out, report);
    out << "report: " << opts.out.string() << "\n";
  }
  return report;
}

}  // namespace melforge::trainer
