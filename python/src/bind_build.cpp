/// melforge._core._build: a melforge-build run from Python, through the builder's own option registration and
/// parser (builder/build_cli.h), so every flag, alias, default and message is the binary's.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "build_cli.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "pipeline.h"
#include "stop.h"

namespace nb = nanobind;
namespace po = boost::program_options;

namespace melforge::python {

namespace {

/// One keyword option from Python: the keyword, its value as text, and whether Python gave a bool.
using Keyword = std::tuple<std::string, std::string, bool>;

/// The command-line token(s) of `keyword`: `--name=value`, or `--name` alone for a switch given True (a switch
/// given False adds nothing). Throws InvalidArgument for a keyword that names no flag (with the nearest one) and for
/// a switch given anything but a bool.
void append_flag(const Keyword& keyword, const po::options_description& all, std::vector<std::string>& args) {
  const auto& [name, value, is_bool] = keyword;
  const std::string canonical = canonical_flag(name, all);
  if (canonical.empty() || canonical == "help") {
    std::string message = unknown_flag_message(name, all);
    const std::string near = nearest_flag(name, all);
    if (!near.empty()) {
      std::string keyword_name = near;
      for (char& c : keyword_name) c = c == '-' ? '_' : c;
      message += " (keyword " + keyword_name + "=)";
    }
    throw InvalidArgument(message);
  }
  const bool is_switch = all.find(canonical, false).semantic()->max_tokens() == 0;
  if (!is_switch) {
    args.push_back("--" + canonical + "=" + value);
    return;
  }
  if (!is_bool) throw InvalidArgument("--" + canonical + " is a switch: pass " + name + "=True or False");
  if (value == "true") args.push_back("--" + canonical);
}

/// Runs `config` on a worker thread while this thread, with the GIL released between checks, polls for Python
/// signals every 50 ms: a KeyboardInterrupt asks the build to stop (builder::request_stop; it removes its temporary
/// files at the next file or batch boundary) and is raised once the build has returned. Returns the report.
std::string run_with_signals(const builder::BuildConfig& config) {
  builder::clear_stop();
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::string report;
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      report = builder::run_build(config).report.dump();
    } catch (...) {
      error = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mutex);
    done = true;
    finished.notify_all();
  });
  bool interrupted = false;
  for (;;) {
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mutex);
      if (finished.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) break;
    }
    if (!interrupted && PyErr_CheckSignals() != 0) {
      interrupted = true;
      builder::request_stop(SIGINT);
    }
  }
  worker.join();
  builder::clear_stop();
  if (interrupted) throw nb::python_error();
  if (error) std::rethrow_exception(error);
  return report;
}

/// `_build(keywords)`: the help text and "" for help=True, else "" and the build report as JSON text.
std::tuple<std::string, std::string> build(const std::vector<Keyword>& keywords) {
  builder::BuildConfig config;
  std::string config_file;
  po::options_description all("melforge.build(output, input=None, manifest=None, **options): the options of "
                              "melforge-build, spelled with underscores");
  builder::add_build_groups(all, config, config_file);
  std::vector<std::string> args;
  bool help = false;
  for (const Keyword& k : keywords) {
    if (std::get<0>(k) == "help") help = help || std::get<1>(k) == "true";
    else append_flag(k, all, args);
  }
  if (help) args.push_back("--help");
  std::ostringstream help_text;
  try {
    if (!builder::parse_build_args(args, all, help_text, &config)) return {help_text.str(), ""};
  } catch (const po::error& e) {
    throw InvalidArgument(e.what());
  }
  return {"", run_with_signals(config)};
}

}  // namespace

void bind_build(nb::module_& m) {
  m.def("_build", &build, nb::arg("keywords"),
        "Runs melforge-build with `keywords`, a list of (flag name, value text, value was a bool); returns "
        "(help text, report JSON). Use melforge.build.");
}

}  // namespace melforge::python
