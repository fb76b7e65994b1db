#include "eval/eval_command.h"

#include <boost/program_options.hpp>
#include <cmath>

#include "data/dataset.h"
#include "eval/multilabel.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/setup.h"
#include "util.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::trainer {

void EvalCommandOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
}

void add_options(po::options_description& desc, EvalCommandOptions& o) {
  desc.add_options()("checkpoint", po::value(&o.checkpoint)->value_name("FILE"), "checkpoint to evaluate")(
      "out", po::value(&o.out)->value_name("FILE"), "write the JSON report here");
}

namespace {

std::string summary_line(const char* level, const Metrics& m) {
  return fmt("  %-8s %7lld  accuracy %.4f  macro-F1 %.4f%s%s", level, static_cast<long long>(m.count), m.accuracy,
             m.macro_f1, m.has_detection ? fmt("  detection acc %.4f F1 %.4f", m.det_accuracy, m.det_f1).c_str() : "",
             std::isfinite(m.loss) ? fmt("  loss %.4f", m.loss).c_str() : "");
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
                                   const EvalOptions& eval, at::Device device, std::ostream& out) {
  const Split val = load_split(data.data / "val.h5", "val", data.stream);
  const double tuned = tuned_threshold(evaluate_multilabel(model, val, eval, device), val);
  const Split split = eval.split == "val" ? val : load_split(data.data / (eval.split + ".h5"), eval.split, data.stream);
  const EvalResult r = evaluate_multilabel(model, split, eval, device, at::kFloat, tuned);
  nlohmann::json report = r.to_json(c.class_names);
  report["task"] = kTaskMultilabel;
  report["aggregate"] = eval.aggregate;
  report["tuned_threshold"] = tuned;
  out << "checkpoint (epoch " << c.epoch << ", task multilabel) on " << eval.split << " of " << data.data.string()
      << ": " << split.files() << " files, aggregate " << eval.aggregate << "\n"
      << multilabel_summary(r.multilabel, c.class_names) << fmt("  %.2f s, %.0f files/s\n", r.seconds, r.files_per_s);
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
  {
    const Dataset meta = load_dataset(data.data, /*load_mel=*/false);
    check_checkpoint_fits(c, meta.info, meta.class_names, opts.checkpoint.string(), data.data.string());
    meta.require_files(eval.split);
    const bool multilabel = model_task(c.model_config) == kTaskMultilabel;
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
  std::shared_ptr<Classifier> model = make_model_from_json(c.model_config, /*multilabel_ok=*/true);
  load_state_dict(*model, c.model, opts.checkpoint.string());
  model->to(device);
  if (model_task(c.model_config) == kTaskMultilabel) {
    nlohmann::json report = run_multilabel_eval(c, *model, data, eval, device, out);
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

}  // namespace melforge::trainer
