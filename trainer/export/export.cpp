#include "export/export.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <nlohmann/json.hpp>
#include <cerrno>
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
  if (python.empty()) throw InvalidArgument("--python must name an interpreter (default python3)");
  const std::string json = out.string() + ".json";
  if (!onnx.empty() && (onnx == out || onnx.string() == json))
    throw InvalidArgument("--onnx " + onnx.string() + ": the ONNX file must be another file than --out and its .json");
}

void add_options(po::options_description& desc, ExportOptions& opts) {
  desc.add_options()
    ("checkpoint", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.checkpoint = s; }),
     "checkpoint to export")
    ("out", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.out = s; }),
     "state-dict file to write (e.g. weights.pt); <out>.json receives the model configuration")
    ("onnx", po::value<std::string>()->value_name("FILE")->notifier([&opts](const std::string& s) { opts.onnx = s; }),
     "also write an ONNX model (inputs x [B, n_mels, T], lengths [B]; output the embedding of a verification model, "
     "else the class scores), through Python")
    ("python", po::value(&opts.python)->default_value(opts.python)->value_name("EXE"),
     "Python interpreter for --onnx (needs torch, onnx, onnxscript and melforge)");
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

/// Runs `argv` (argv[0] looked up on PATH) with stdout and stderr into `output`; returns its exit code, 127 when it
/// could not be started, -1 when it did not exit normally.
int run_program(const std::vector<std::string>& argv, std::string& output) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) throw IoError("cannot create a pipe to run " + argv.front());
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw IoError("cannot start " + argv.front());
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    output.append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The last `max_chars` characters of `text`, for an error message.
std::string tail_of(const std::string& text, std::size_t max_chars) {
  return text.size() <= max_chars ? text : "..." + text.substr(text.size() - max_chars);
}

/// Throws InvalidArgument naming --python and the modules it cannot import of those `export --onnx` runs.
void check_onnx_python(const std::string& python) {
  static constexpr const char* kScript =
      "import importlib, sys\n"
      "missing = []\n"
      "for name in ('torch', 'onnx', 'onnxscript', 'melforge', 'melforge.onnx_export'):\n"
      "    if name == 'melforge.onnx_export' and missing:\n"
      "        continue\n"
      "    try:\n"
      "        importlib.import_module(name)\n"
      "    except Exception:\n"
      "        missing.append(name)\n"
      "print('missing:' + ', '.join(missing))\n"
      "sys.exit(3 if missing else 0)\n";
  std::string output;
  const int rc = run_program({python, "-c", kScript}, output);
  if (rc == 0) return;
  const std::size_t at = output.rfind("missing:");
  if (rc != 3 || at == std::string::npos)
    throw InvalidArgument("--python " + python + ": cannot run it to write --onnx (exit " + std::to_string(rc) +
                          "): " + tail_of(output, 400));
  std::string missing = output.substr(at + 8);
  while (!missing.empty() && (missing.back() == '\n' || missing.back() == '\r')) missing.pop_back();
  throw InvalidArgument("--onnx needs a Python that imports torch, onnx, onnxscript and melforge; --python " + python +
                        " cannot import " + missing + " (pip install onnx onnxscript; melforge: pip install melforge)");
}

/// Writes the ONNX model of the export `weights` to `onnx` through `python -m melforge.onnx_export` (to
/// `<onnx>.partial` first, renamed when complete). Returns the module's own line (what it wrote).
std::string write_onnx(const std::string& python, const std::filesystem::path& weights,
                       const std::filesystem::path& onnx) {
  namespace fs = std::filesystem;
  const fs::path partial = onnx.string() + ".partial";
  std::error_code ec;
  fs::remove(partial, ec);
  std::string output;
  const int rc = run_program({python, "-m", "melforge.onnx_export", weights.string(), partial.string()}, output);
  if (rc != 0 || !fs::is_regular_file(partial, ec)) {
    fs::remove(partial, ec);
    throw Error("--onnx " + onnx.string() + ": " + python + " -m melforge.onnx_export failed (exit " +
                std::to_string(rc) + "); the export " + weights.string() + " is written: " + tail_of(output, 1500));
  }
  fs::rename(partial, onnx, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(partial, ec);
    throw IoError("cannot rename '" + partial.string() + "' to '" + onnx.string() + "': " + why);
  }
  const std::size_t line = output.rfind("wrote ");
  return line == std::string::npos ? "wrote " + onnx.string() : output.substr(line);
}

}  // namespace

void run_export(const ExportOptions& opts, std::ostream& out) {
  opts.validate();
  if (!opts.onnx.empty()) {
    const std::filesystem::path folder = opts.onnx.parent_path();
    std::error_code ec;
    if (!folder.empty() && !std::filesystem::is_directory(folder, ec))
      throw IoError("--onnx " + opts.onnx.string() + ": no such folder " + folder.string());
    check_onnx_python(opts.python);
  }
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
  if (opts.onnx.empty()) return;
  std::string said = write_onnx(opts.python, opts.out, opts.onnx);
  const std::size_t partial = said.find(opts.onnx.string() + ".partial");
  if (partial != std::string::npos) said.replace(partial, opts.onnx.string().size() + 8, opts.onnx.string());
  out << said << (said.empty() || said.back() != '\n' ? "\n" : "");
}

}  // namespace melforge::trainer
