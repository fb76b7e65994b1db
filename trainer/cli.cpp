#include "cli.h"

#include <ATen/Context.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <c10/util/Exception.h>
#include <new>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "cv/cv_command.h"
#include "data/dataset.h"
#include "embed/embed_command.h"
#include "eval/evaluate.h"
#include "eval/multilabel.h"
#include "export/export.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "models/model.h"
#include "options.h"
#include "predict/predict.h"
#include "train/overrides.h"
#include "train/trainer.h"
#include "util.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

/// A subcommand: one line of help, its options (and positional arguments), and what it runs once they are parsed;
/// it validates them before any work. Results go to the first stream, logs to the second.
struct Command {
  std::string summary;
  std::function<void(po::options_description&, po::positional_options_description&)> register_options;
  std::function<void(std::ostream&, std::ostream&)> run;
};

/// `inspect`: loads and checks a dataset folder, builds the model for it and runs it on the first train file.
void inspect(const DataOptions& data, const ModelOptions& model, std::ostream& out) {
  data.validate();
  model.validate();
  const Dataset d = load_dataset(data.data, data.stream);
  const MelInfo& m = d.info;
  out << "dataset " << d.dir.string() << " (schema_version " << d.train.meta.schema_version << ", written by melforge "
      << m.melforge_version << ")\n";
  out << "  classes (" << d.num_classes() << "): " << join(d.class_names) << "\n";
  if (m.is_fbank())
    out << fmt("  fbank (Kaldi): %lld Hz, %s, %lld columns, stored %s\n", static_cast<long long>(m.sample_rate),
               m.fbank.to_string().c_str(), static_cast<long long>(m.n_mels), m.dtype.c_str());
  else
    out << fmt("  mel: %lld Hz, n_fft %lld, win %lld, hop %lld, %lld mels, %g-%g Hz, log %s, stored %s\n",
               static_cast<long long>(m.sample_rate), static_cast<long long>(m.n_fft),
               static_cast<long long>(m.win_length), static_cast<long long>(m.hop_length),
               static_cast<long long>(m.n_mels), m.f_min, m.f_max, m.log.c_str(), m.dtype.c_str());
  out << fmt("  default tile: %g s (%lld frames of %lld mels)\n", m.short_seconds,
             static_cast<long long>(m.n_frames), static_cast<long long>(m.n_mels));
  for (const auto& name : kSplitNames) {
    const Split& s = d.split(name);
    out << fmt("  %-5s %6lld clips, %10lld frames (%.1f s), frames [%lld, %lld] float32, %.1f MiB %s\n", name.c_str(),
               static_cast<long long>(s.files()), static_cast<long long>(s.total_frames()),
               static_cast<double>(s.total_frames() * m.hop_length) / static_cast<double>(m.sample_rate),
               static_cast<long long>(s.total_frames()), static_cast<long long>(m.n_mels),
               s.frame_bytes() / (1 << 20), s.streamed() ? "streamed" : "in RAM");
  }
  for (const auto& name : kSplitNames) d.split(name).check_all_finite();
  out << "  every spectrogram is finite\n";
  d.require_files("train");

  const std::shared_ptr<Classifier> net = make_model(model, m, d.num_classes());
  net->eval();
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  out << fmt("model %s: %lld parameters, input [B, 1, %lld, %lld] -> logits [B, %lld], detection [B]\n",
             model.model.c_str(), static_cast<long long>(params), static_cast<long long>(m.n_mels),
             static_cast<long long>(m.n_frames), static_cast<long long>(d.num_classes()));
  const std::unique_ptr<data::views::View> view = split_view(d.train, resolve_view_options({}, d.train, model.model),
                                                             /*evaluation=*/true);
  const std::vector<int64_t> frames = d.train.clip_frame_counts();
  std::vector<data::views::Example> examples;
  view->clip_examples(0, frames[0], model.seed, 0, examples);
  const ExampleBatch b = gather_examples(d.train, examples);
  const at::Tensor& x = b.x;
  at::NoGradGuard no_grad;
  const ModelOutput y = net->forward(x, b.lengths);
  out << "  forward on " << d.train.paths[0] << ": input " << shape_text(x.sizes()) << " -> logits "
      << shape_text(y.logits.sizes()) << ", detection " << shape_text(y.detection.sizes()) << "\n";
}

/// The stop signal (SIGINT or SIGTERM) `train` received, 0 while none came. Written by the signal handler.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

/// Writes `text` to stderr from a signal handler (write(2) only).
void signal_safe_print(const char* text, std::size_t size) {
  if (::write(STDERR_FILENO, text, size) < 0) return;
}

/// First SIGINT/SIGTERM: asks `train` to stop at its next batch or epoch end. Second one: quits at once with
/// 128 + signal (checkpoints are written atomically, so the last complete one stays).
void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) {
    static const char quit[] = "\nmelforge-train: second signal: quitting now (the last checkpoint is kept)\n";
    signal_safe_print(quit, sizeof quit - 1);
    ::_exit(128 + sig);
  }
  static const char stop[] =
      "\nmelforge-train: stopping at the next batch or epoch end (send the signal again to quit at once)\n";
  signal_safe_print(stop, sizeof stop - 1);
}

/// Routes SIGINT and SIGTERM to on_stop_signal for its lifetime and restores the previous handlers after. A signal
/// that was ignored when the command started (e.g. SIGINT of a background job) stays ignored.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) {
      struct sigaction current {};
      installed_[i] = ::sigaction(kSignals[i], nullptr, &current) == 0 && current.sa_handler != SIG_IGN;
      if (!installed_[i]) continue;
      struct sigaction action {};
      action.sa_handler = on_stop_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      installed_[i] = ::sigaction(kSignals[i], &action, &previous_[i]) == 0;
    }
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < std::size(kSignals); ++i)
      if (installed_[i]) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM};
  struct sigaction previous_[2] {};
  bool installed_[2] = {false, false};
};

/// Thrown by the batch hook to leave an epoch after a stop signal.
struct StopRequested {
  /// The epoch (0-based) that was left unfinished; -1 while the dataset was loading.
  int64_t epoch;
};

std::string signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig); }

/// Hooks that stop a run at SIGINT or SIGTERM (g_stop_signal): at the next training batch, after the epoch that is
/// being validated and checkpointed, or while the dataset loads.
TrainHooks stop_hooks() {
  TrainHooks hooks;
  hooks.on_batch = [](int64_t epoch, Batch&) {
    if (g_stop_signal.load() != 0) throw StopRequested{epoch};
  };
  hooks.on_epoch_end = [](int64_t) { return g_stop_signal.load() == 0; };
  hooks.on_load = [] {
    if (g_stop_signal.load() != 0) throw StopRequested{-1};
  };
  return hooks;
}

/// `train`: the result's paths and figures on `out`, the log on `err`. SIGINT or SIGTERM stops the run at the next
/// training batch (the unfinished epoch is dropped; the last completed one is checkpointed already) or, during
/// validation and the checkpoint writes, after the epoch is checkpointed; the exit code is then 128 + signal.
int run_train(const TrainConfig& config, std::ostream& out, std::ostream& err) {
  const StopSignals signals;
  TrainHooks hooks = stop_hooks();
  const std::filesystem::path run = config.train.resume.empty() ? config.train.out : config.train.resume;
  const auto stopped = [&](const std::string& where) {
    const int sig = g_stop_signal.load();
    err << "melforge-train: interrupted by " << signal_name(sig) << " " << where << "\n";
    return 128 + sig;
  };
  TrainResult r;
  try {
    r = train(config, err, hooks);
  } catch (const StopRequested& s) {
    if (s.epoch < 0) return stopped("while loading the dataset, before any epoch");
    const std::string resume = "continue with 'melforge-train train --resume " + run.string() + "'";
    return stopped("during epoch " + std::to_string(s.epoch + 1) + ", which is dropped; " +
                   (s.epoch > 0 ? "the checkpoints of epoch " + std::to_string(s.epoch) + " are kept; " + resume
                                : "no epoch was completed"));
  }
  if (r.rank != 0 && !r.interrupted) {
    out << "rank " << r.rank << ": trained " << r.epochs_done << " epochs; rank 0 writes the run folder "
        << r.run_dir.string() << "\n";
    return g_stop_signal.load() != 0 ? stopped("after the last epoch (the run is complete)") : kExitOk;
  }
  out << "run folder: " << r.run_dir.string() << "\n";
  if (r.interrupted)
    return stopped("after epoch " + std::to_string(r.epochs_done) + " (checkpointed); continue with "
                   "'melforge-train train --resume " + r.run_dir.string() + "'");
  out << "best epoch: " << r.best_epoch << " of " << r.epochs_done << (r.early_stopped ? " (early stop)" : "")
      << "\n";
  if (r.test && r.test->is_multilabel)
    out << "test: " << multilabel_summary(r.test->multilabel) << "\n";
  else if (r.test && r.test->is_verification)
    out << fmt("test: EER %.3f %%, minDCF(0.01) %.4f, minDCF(0.05) %.4f over %lld target and %lld non-target trials\n",
               100.0 * r.test->verification.eer, r.test->verification.min_dcf_01, r.test->verification.min_dcf_05,
               static_cast<long long>(r.test->verification.targets),
               static_cast<long long>(r.test->verification.nontargets));
  else if (r.test)
    out << fmt("test: accuracy %.4f, macro-F1 %.4f; file accuracy %.4f, file macro-F1 %.4f\n",
               r.test->segment.accuracy, r.test->segment.macro_f1, r.test->file.accuracy, r.test->file.macro_f1);
  out << "report: " << (r.run_dir / "report.json").string() << "\n";
  if (g_stop_signal.load() != 0) return stopped("during the final evaluation (the run is complete)");
  return kExitOk;
}

/// `cv`: the summary line on `out`, the log on `err`; SIGINT or SIGTERM stops the fold being trained as `train` does,
/// and the same command continues it (complete folds are skipped).
int run_cv_command(const TrainConfig& config, const CvCommandOptions& options, std::ostream& out, std::ostream& err) {
  const StopSignals signals;
  TrainHooks hooks = stop_hooks();
  const auto stopped = [&] {
    const int sig = g_stop_signal.load();
    err << "melforge-train: cv interrupted by " << signal_name(sig) << "; continue with the same melforge-train cv "
        << "command (complete folds are skipped, the interrupted fold resumes from its last checkpoint)\n";
    return 128 + sig;
  };
  CvResult r;
  try {
    r = run_cv(config, options, err, hooks);
  } catch (const StopRequested&) {
    return stopped();
  }
  if (r.interrupted) return stopped();
  out << cv_summary_line(r) << "\n";
  return kExitOk;
}

/// `bench` registers the groups of `train` that matter to one step, without the run-folder flags.
void add_bench_options(po::options_description& d, TrainConfig& c, BenchOptions& b) {
  add_options(d, c.data);
  add_options(d, c.model);
  add_options(d, c.optim);
  add_options(d, c.loader);
  add_options(d, c.augment);
  d.add_options()("amp", po::value(&c.train.amp)->default_value(c.train.amp)->value_name("off|fp16|bf16"),
                  "mixed precision")("positive-class", po::value(&c.train.positive_class)->value_name("NAME"),
                                     "class of the detection head")(
      "bce-weight", po::value(&c.train.bce_weight)->default_value(c.train.bce_weight)->value_name("W"),
      "weight of the detection head's BCE")("channels-last", po::bool_switch(&c.train.channels_last),
                                            "CUDA: channels-last convolutions")(
      "eval-batch-size", po::value(&c.eval.batch_size)->default_value(c.eval.batch_size)->value_name("N"),
      "short segments per evaluation forward pass")(
      "task", po::value(&c.train.task)->default_value(c.train.task)->value_name("multiclass|verification"),
      "the training step's loss: multiclass (cross-entropy + detection BCE) or verification (AAM-softmax; "
      "--model resnet-se, the default, or ecapa)")("margin", po::value(&c.train.margin)->default_value(c.train.margin), "AAM margin")(
      "scale", po::value(&c.train.scale)->default_value(c.train.scale), "AAM scale");
  add_options(d, c.runtime);
  add_options(d, b);
}

std::string usage(const std::map<std::string, Command>& commands) {
  std::string s =
      "melforge-train: train and use classifiers on melforge-build HDF5 datasets (LibTorch)\n\n"
      "Usage: melforge-train <command> [options]\n       melforge-train <command> --help\n"
      "Flags may also be spelled with underscores (--batch_size for --batch-size), as PyTorch users name them.\n\n"
      "Commands:\n";
  for (const auto& [name, c] : commands) s += fmt("  %-8s %s\n", name.c_str(), c.summary.c_str());
  return s;
}

/// The option groups of every subcommand; the parser fills those of the command given.
struct CommandOptions {
  DataOptions data;
  ModelOptions model;
  TrainConfig train_config;
  EvalCommandOptions eval_command;
  EvalOptions eval;
  RuntimeOptions runtime;
  PredictOptions predict;
  ExportOptions export_opts;
  EmbedOptions embed;
  BenchOptions bench;
  CvCommandOptions cv;
  /// Exit code of the command that ran (train and predict set it; the others return kExitOk or throw).
  int exit_code = kExitOk;
};

/// The subcommands, each registering and running over `opts`.
std::map<std::string, Command> make_commands(CommandOptions& opts) {
  return {
      {"inspect",
       {"check a dataset folder, build the model for it and run it on one file",
        [&opts](po::options_description& d, po::positional_options_description&) {
          add_options(d, opts.data);
          add_options(d, opts.model);
        },
        [&opts](std::ostream& o, std::ostream&) { inspect(opts.data, opts.model.resolved("multiclass"), o); }}},
      {"train",
       {"train a model on a dataset folder into a run folder (or --resume one)",
        [&opts](po::options_description& d, po::positional_options_description&) {
          add_options(d, opts.train_config);
        },
        [&opts](std::ostream& o, std::ostream& e) {
          opts.train_config = with_config_file(opts.train_config);
          opts.train_config.validate();
          opts.exit_code = run_train(opts.train_config, o, e);
        }}},
      {"cv",
       {"cross-validate on a dataset with folds: one run per test fold into DIR/fold-<f>, and DIR/cv_report.json",
        [&opts](po::options_description& d, po::positional_options_description&) {
          add_options(d, opts.train_config);
          add_options(d, opts.cv);
        },
        [&opts](std::ostream& o, std::ostream& e) {
          opts.train_config = with_config_file(opts.train_config);
          opts.exit_code = run_cv_command(opts.train_config, opts.cv, o, e);
        }}},
      {"eval",
       {"evaluate a checkpoint on a split of a dataset folder",
        [&opts](po::options_description& d, po::positional_options_description&) {
          add_options(d, opts.eval_command);
          add_options(d, opts.data);
          add_options(d, opts.eval);
          add_options(d, opts.runtime);
        },
        [&opts](std::ostream& o, std::ostream& e) {
          run_eval(opts.eval_command, opts.data, opts.eval, opts.runtime, o, e);
        }}},
      {"predict",
       {"classify audio files with a checkpoint",
        [&opts](po::options_description& d, po::positional_options_description& p) {
          add_options(d, opts.predict);
          p.add(kPredictInputsName, -1);
        },
        [&opts](std::ostream& o, std::ostream& e) {
          opts.predict.validate();
          opts.exit_code = run_predict(opts.predict, o, e).failed > 0 ? kExitSomeFailed : kExitOk;
        }}},
      {"export",
       {"write a checkpoint's weights for Python's torch.load",
        [&opts](po::options_description& d, po::positional_options_description&) {
          add_options(d, opts.export_opts);
        },
        [&opts](std::ostream& o, std::ostream&) {
          opts.export_opts.validate();
          run_export(opts.export_opts, o);
        }}},
      {"embed",
       {"write the speaker embeddings of a verification checkpoint (a dataset split or audio files) to HDF5",
        [&opts](po::options_description& d, po::positional_options_description& p) {
          add_options(d, opts.embed);
          p.add(kEmbedInputsName, -1);
        },
        [&opts](std::ostream& o, std::ostream& e) {
          opts.embed.validate();
          opts.exit_code = run_embed(opts.embed, o, e).skipped > 0 ? kExitSomeFailed : kExitOk;
        }}},
      {"bench",
       {"time the data pipeline, the training step and the evaluation, each on its own",
        [&opts](po::options_description& d, po::positional_options_description&) {
          add_bench_options(d, opts.train_config, opts.bench);
        },
        [&opts](std::ostream& o, std::ostream& e) { run_bench(opts.train_config, opts.bench, o, e); }}},
  };
}

int run_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CommandOptions opts;
  std::map<std::string, Command> commands = make_commands(opts);
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
  po::positional_options_description positional;
  command.register_options(desc, positional);
  po::variables_map vm;
  po::store(parse_flags(std::vector<std::string>(argv + 2, argv + argc), desc, &positional), vm);
  if (vm.count("help")) {
    out << desc << "\n";
    return kExitOk;
  }
  if (first == "train" || first == "cv") read_train_config_file(vm, desc, opts.train_config);
  po::notify(vm);
  command.run(out, err);
  return opts.exit_code;
}

/// What to change after an out-of-memory error in `command`: only flags that command has.
std::string memory_advice(const std::string& command) {
  if (command == "train" || command == "cv") return "lower --hidden, --batch-size or --eval-batch-size, or free memory";
  if (command == "eval" || command == "embed") return "lower --eval-batch-size, or free memory";
  return "free memory (or check that the checkpoint is the one meant: a crafted or corrupt file can describe a "
         "model larger than this machine)";
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  const std::string command = argc > 1 ? argv[1] : "";
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
  } catch (const std::bad_alloc&) {
    err << "melforge-train: error: out of memory (an allocation failed); " << memory_advice(command) << "\n";
    return kExitError;
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    what = what.substr(0, what.find('\n'));
    const bool oom = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                     what.find("can't allocate memory") != std::string::npos;
    err << "melforge-train: " << (oom ? "error: out of memory: " : "unexpected error: ") << what
        << (oom ? "; " + memory_advice(command) : std::string()) << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    err << "melforge-train: unexpected error: " << e.what() << "\n";
    return kExitError;
  }
}

}  // namespace melforge::trainer
