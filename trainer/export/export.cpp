#include "export/export.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <boost/program_options.hpp>

#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "eval/multilabel.h"
#include "eval/verification.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/setup.h"
#include "data/dataset.h"

namespace po = boost::program_options;

namespace melforge::trainer {

void ExportOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
  if (out.empty()) throw InvalidArgument("--out is required");
}

void add_options(po::options_description& desc, ExportOptions& opts) {
  desc.add_options()
    ("checkpoint", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.checkpoint = s; }),
     "checkpoint to export")
    ("out", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.out = s; }),
     "state-dict file to write (e.g. weights.pt); <out>.json receives the model configuration");
}

namespace {

/// Writes each (path, bytes) of `files` as one unit: all to `<path>.new` first (write_file_atomically, with fsync), then
/// renamed into place in order, so that a path changes only when every file is complete. When a write fails, the
/// temporaries are removed and no path has changed; when a rename fails, the temporaries and the files already
/// renamed are removed (a previous file of such a name is then gone too). Throws IoError naming the file.
void write_files_together(const std::vector<std::pair<std::filesystem::path, std::string_view>>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& [path, bytes] : files)
    if (fs::is_directory(path, ec)) throw IoError("cannot write '" + path.string() + "': it is a folder");
  std::vector<fs::path> temps;
  std::vector<fs::path> renamed;
  const auto remove_all_of = [&ec](const std::vector<fs::path>& paths) {
    for (const auto& p : paths) fs::remove(p, ec);
  };
  try {
    for (const auto& [path, bytes] : files) {
      temps.push_back(path.string() + ".new");
      write_file_atomically(temps.back(), bytes);
    }
  } catch (const IoError& e) {
    remove_all_of(temps);
    throw IoError(std::string(e.what()) + "; nothing was replaced");
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    fs::rename(temps[i], files[i].first, ec);
    if (ec) {
      const std::string why = ec.message();
      remove_all_of(temps);
      remove_all_of(renamed);
      throw IoError("cannot rename '" + temps[i].string() + "' to '" + files[i].first.string() + "': " + why);
    }
    renamed.push_back(files[i].first);
  }
}

/// What the export's class outputs mean: {"task", "scores": "softmax" | "sigmoid" | "cosine" (the function that turns
/// the model's first output into class scores)}; for --task multilabel also "aggregate" (the run's --aggregate) and
/// "threshold" (the threshold tuned on val that the checkpoint stores; null when it stores none). Throws FormatError
/// naming `what` for a task this build does not know or a stored threshold outside [0, 1].
nlohmann::json task_meta(const Checkpoint& ck, const std::string& task, const std::string& what) {
  if (task == kTaskMulticlass) return {{"task", task}, {"scores", "softmax"}};
  if (task == kTaskVerification) return {{"task", task}, {"scores", "cosine"}};
  if (task != kTaskMultilabel)
    throw FormatError(what + ": entry 'model_config': unknown task '" + utf8::for_terminal(task, 40) + "'");
  const double threshold = stored_threshold(ck.state, what);
  return {{"task", task},
          {"scores", "sigmoid"},
          {"aggregate", trained_aggregate(ck.config)},
          {"threshold", threshold >= 0 ? nlohmann::json(threshold) : nlohmann::json(nullptr)}};
}

}  // namespace

void run_export(const ExportOptions& opts, std::ostream& out) {
  opts.validate();
  const Checkpoint ck = load_checkpoint(opts.checkpoint);
  check_checkpoint_model(ck, opts.checkpoint.string(), "export", 0, "", available_memory_bytes());
  const std::string task = model_task(ck.model_config);
  const std::shared_ptr<Classifier> model = make_model_from_json(ck.model_config, /*any_task=*/true);
  load_state_dict(*model, ck.model, "checkpoint '" + opts.checkpoint.string() + "'");
  const TensorMap state = state_dict(*model);

  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  int64_t numel = 0;
  for (const auto& [name, t] : state) {
    dict.insert(name, t.contiguous());
    numel += t.numel();
  }
  const std::vector<char> bytes = torch_save_bytes(c10::IValue(dict));
  nlohmann::json meta = {{"model_config", ck.model_config},
                               {"class_names", ck.class_names},
                               {"positive_class", ck.positive_class},
                               {"positive_index", ck.positive_index},
                               {"mel", ck.mel},
                               {"epoch", ck.epoch},
                               {"checkpoint", opts.checkpoint.string()}};
  meta.update(task_meta(ck, task, "checkpoint '" + utf8::for_terminal(opts.checkpoint.string()) + "'"));
  if (ck.config.is_object() && ck.config.contains("view")) meta["view"] = ck.config["view"];
  const std::filesystem::path json_path = opts.out.string() + ".json";
  const std::string json_text = utf8::dump(meta, 2) + "\n";
  write_files_together({{json_path, json_text}, {opts.out, std::string_view(bytes.data(), bytes.size())}});
  out << "wrote " << opts.out.string() << " (" << state.size() << " tensors, " << numel << " values, model "
      << model->kind() << ", epoch " << ck.epoch << ", --task " << task << ")\n"
      << "wrote " << json_path.string() << '\n';
}

}  // namespace melforge::trainer
