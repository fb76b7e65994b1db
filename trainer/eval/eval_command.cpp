#include "eval/eval_command.h"

#include <boost/program_options.hpp>
#include <cmath>

#include "data/dataset.h"
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
  return fmt("  %-8s %7lld  accuracy %.4f  macro-F1 %.4f  detection acc %.4f F1 %.4f%s", level,
             static_cast<long long>(m.count), m.accuracy, m.macro_f1, m.det_accuracy, m.det_f1,
             std::isfinite(m.loss) ? fmt("  loss %.4f", m.loss).c_str() : "");
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
  }
  const Split split = load_split(data.data / (eval.split + ".h5"), eval.split, data.stream);
  std::shared_ptr<Classifier> model = make_model_from_json(c.model_config);
  load_state_dict(*model, c.model, opts.checkpoint.string());
  model->to(device);
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
