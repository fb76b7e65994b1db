#include "cli.h"

#include <ATen/Context.h>

#include <boost/program_options.hpp>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "models/cnn.h"
#include "options.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

/// A subcommand: one line of help, its options, and what it runs once they are parsed and validated.
struct Command {
  std::string summary;
  std::function<void(po::options_description&)> register_options;
  std::function<void(std::ostream&)> run;
};

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

[[gnu::format(printf, 1, 2)]] std::string format(const char* fmt, ...) {
  std::va_list args, copy;
  va_start(args, fmt);
  va_copy(copy, args);
  std::vector<char> buf(static_cast<std::size_t>(std::vsnprintf(nullptr, 0, fmt, copy)) + 1);
  va_end(copy);
  std::vsnprintf(buf.data(), buf.size(), fmt, args);
  va_end(args);
  return buf.data();
}

/// `inspect`: loads and checks a dataset folder, builds the model for it and runs it on the first train file.
void inspect(const DataOptions& data, const ModelOptions& model, std::ostream& out) {
  data.validate();
  model.validate();
  const Dataset d = load_dataset(data.data);
  const MelInfo& m = d.info;
  out << "dataset " << d.dir.string() << " (schema_version " << kSupportedSchemaVersion << ", written by melforge "
      << m.melforge_version << ")\n";
  out << "  classes (" << d.num_classes() << "): " << join(d.class_names) << "\n";
  out << format("  mel: %lld Hz, n_fft %lld, win %lld, hop %lld, %lld mels, %g-%g Hz, log %s, stored %s\n",
                static_cast<long long>(m.sample_rate), static_cast<long long>(m.n_fft),
                static_cast<long long>(m.win_length), static_cast<long long>(m.hop_length),
                static_cast<long long>(m.n_mels), m.f_min, m.f_max, m.log.c_str(), m.dtype.c_str());
  out << format("  segments: %lld long of %g s x %lld short of %g s, each [%lld mels x %lld frames]\n",
                static_cast<long long>(m.num_long), m.long_seconds, static_cast<long long>(m.num_short),
                m.short_seconds, static_cast<long long>(m.n_mels), static_cast<long long>(m.n_frames));
  for (const auto& name : kSplitNames) {
    const Split& s = d.split(name);
    out << format("  %-5s %6lld files, %8lld valid short segments, mel %s float32, %.1f MiB\n", name.c_str(),
                  static_cast<long long>(s.files()), static_cast<long long>(s.valid_segments()),
                  shape_text(s.mel.sizes()).c_str(), static_cast<double>(s.mel.nbytes()) / (1 << 20));
  }
  d.require_files("train");

  at::manual_seed(model.seed);
  CnnConfig config = CnnConfig::from_info(m, d.num_classes());
  config.hidden = model.hidden;
  config.dropout = model.dropout;
  CnnNet net(config);
  net->eval();
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  out << format("model %s: %lld parameters, input [B, 1, %lld, %lld] -> logits [B, %lld], detection [B]\n",
                model.model.c_str(), static_cast<long long>(params), static_cast<long long>(m.n_mels),
                static_cast<long long>(m.n_frames), static_cast<long long>(d.num_classes()));
  const int64_t valid = d.train.num_valid_long[0].item<int64_t>();
  const at::Tensor x = d.train.mel[0].narrow(0, 0, valid).reshape({-1, m.n_mels, m.n_frames});
  at::NoGradGuard no_grad;
  const ModelOutput y = net->forward(x);
  out << "  forward on " << d.train.paths[0] << ": input " << shape_text(x.sizes()) << " -> logits "
      << shape_text(y.logits.sizes()) << ", detection " << shape_text(y.detection.sizes()) << "\n";
}

/// The commands of issue 3 that are not written yet: they parse no options and fail with a clear message.
Command pending(const std::string& name, const std::string& summary) {
  return {summary + " (not implemented yet)", [](po::options_description&) {},
          [name](std::ostream&) { throw Error("'" + name + "' is not implemented yet"); }};
}

std::string usage(const std::map<std::string, Command>& commands) {
  std::string s =
      "melforge-train: train and use classifiers on melforge-build HDF5 datasets (LibTorch)\n\n"
      "Usage: melforge-train <command> [options]\n       melforge-train <command> --help\n\nCommands:\n";
  for (const auto& [name, c] : commands) s += format("  %-8s %s\n", name.c_str(), c.summary.c_str());
  return s;
}

int run_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  DataOptions data;
  ModelOptions model;
  std::map<std::string, Command> commands = {
      {"inspect",
       {"check a dataset folder, build the model for it and run it on one file",
        [&](po::options_description& d) {
          add_options(d, data);
          add_options(d, model);
        },
        [&](std::ostream& o) { inspect(data, model, o); }}},
      {"train", pending("train", "train a model on a dataset folder")},
      {"eval", pending("eval", "evaluate a checkpoint on a split")},
      {"predict", pending("predict", "classify audio files with a checkpoint")},
      {"export", pending("export", "write a checkpoint's weights for Python's torch.load")},
      {"bench", pending("bench", "time the data pipeline, the training step and the evaluation")},
  };
  const std::string first = argc > 1 ? argv[1] : "";
  if (first.empty() || first == "--help" || first == "-h" || first == "help") {
    (first.empty() ? err : out) << usage(commands);
    return first.empty() ? kExitUsage : kExitOk;
  }
  if (first == "--version") {
    out << "melforge-train " << MELFORGE_VERSION << "\n";
    return kExitOk;
  }
  const auto it = commands.find(first);
  if (it == commands.end()) {
    err << "melforge-train: unknown command '" << first << "'\n\n" << usage(commands);
    return kExitUsage;
  }
  Command& command = it->second;
  po::options_description desc("melforge-train " + first + ": " + command.summary + "\n\nOptions");
  desc.add_options()("help,h", "show this help and exit");
  command.register_options(desc);
  po::variables_map vm;
  po::store(po::command_line_parser(std::vector<std::string>(argv + 2, argv + argc)).options(desc).run(), vm);
  if (vm.count("help")) {
    out << desc << "\n";
    return kExitOk;
  }
  po::notify(vm);
  command.run(out);
  return kExitOk;
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  try {
    return run_command(argc, argv, out, err);
  } catch (const InvalidArgument& e) {
    err << "melforge-train: invalid argument: " << e.what() << "\n";
    return kExitUsage;
  } catch (const po::error& e) {
    err << "melforge-train: " << e.what() << " (see --help)\n";
    return kExitUsage;
  } catch (const Error& e) {
    err << "melforge-train: error: " << e.what() << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    err << "melforge-train: unexpected error: " << e.what() << "\n";
    return kExitError;
  }
}

}  // namespace melforge::trainer
