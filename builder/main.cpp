// melforge-build: parse the configuration, run the build, print the report. Errors become messages and exit codes.
#include <pthread.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "bench.h"
#include "build_cli.h"
#include "build_options.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "merge.h"
#include "output_folder.h"
#include "pipeline.h"

namespace po = boost::program_options;

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitStrict = 3;

/// Writes `text` to stderr with write(2) (no stdio locks, so it is safe while other threads print).
void say(const std::string& text) {
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
}

/// Blocks SIGINT and SIGTERM in this thread and, through inheritance, in every thread started later, then starts a
/// thread that waits for them with sigwait. The first signal asks the build to stop (it removes its temporary files
/// and run() returns through Interrupted); a second one exits at once with 128 + signal, leaving OUT/.partial and
/// the lock file behind (the next build clears them). Must run before any other thread is created.
void handle_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int count = 0;
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      if (++count == 1) {
        say("\nmelforge-build: " + name + " received: stopping at the next file and removing temporary files "
            "(send it again to exit at once)\n");
        melforge::builder::request_stop(sig);
      } else {
        say("melforge-build: " + name + " received again: exiting now; temporary files are left in the output "
            "folder's .partial/ and are removed by the next build\n");
        std::_Exit(128 + sig);
      }
    }
  }).detach();
}

/// Parses `argv` (after the program or subcommand name) with parse_build_args into `config`; false after printing
/// --help.
bool parse(int argc, char** argv, const po::options_description& all, melforge::builder::BuildConfig& config) {
  return melforge::builder::parse_build_args(std::vector<std::string>(argv + 1, argv + argc), all, std::cout,
                                             &config);
}

/// `melforge-build bench ...`: the build's flags plus the bench's; prints the stage table.
int run_bench(int argc, char** argv) {
  melforge::builder::BuildConfig config;
  melforge::builder::BenchOptions bench;
  std::string config_file;
  po::options_description all(
      "melforge-build bench: time each stage of a build (scan, probe, decode, mel, compress, HDF5 write) on its own,\n"
      "then a whole build, on a sample of your corpus; the median of --repeats runs is reported\n\n"
      "Usage: melforge-build bench --input DIR|--manifest CSV [build options] [bench options]\n"
      "(--output is not needed: the HDF5 files and the end-to-end build go to a scratch folder that is removed)");
  po::options_description bench_group("Bench");
  melforge::builder::add_options(bench_group, bench);
  melforge::builder::add_build_groups(all, config, config_file);
  all.add(bench_group);
  if (!parse(argc, argv, all, config)) return 0;
  melforge::builder::run_bench(config, bench, std::cout, std::cerr);
  return 0;
}

/// `melforge-build merge --output DIR [--copy] SHARD_DIR...`: joins a --shard K/N series; prints a summary.
int run_merge(int argc, char** argv) {
  melforge::builder::MergeOptions options;
  po::options_description all(
      "melforge-build merge: join the output folders of `melforge-build --shard K/N` (K = 1..N) into one dataset\n"
      "whose train.h5, val.h5 and test.h5 hold the files in the order of an unsharded build. By default `mel` is an\n"
      "HDF5 virtual dataset over the shard files, stored by paths relative to --output: keep the shard folders\n"
      "beside the merged folder (move them together). --copy writes self-contained files instead.\n\n"
      "Usage: melforge-build merge --output DIR [--copy] [--overwrite] SHARD_DIR...");
  all.add_options()("help,h", "show this help and exit");
  melforge::builder::add_options(all, options);
  po::positional_options_description positional;
  positional.add("shards", -1);
  po::variables_map vm;
  po::store(melforge::parse_flags(std::vector<std::string>(argv + 1, argv + argc), all, &positional), vm);
  if (vm.count("help")) {
    std::cout << all << "\n";
    return 0;
  }
  po::notify(vm);
  const auto r = melforge::builder::run_merge(options);
  std::printf("melforge-build merge: %d shards -> %s (%s)\n", r["merge"]["shard_count"].get<int>(),
              options.output.string().c_str(), r["merge"]["mode"].get<std::string>().c_str());
  for (const auto& split : melforge::builder::kSplitNames)
    std::printf("  %-5s %lld files\n", split.c_str(), r["files"]["per_split"][split].get<long long>());
  std::printf("%lld files written, %lld skipped (of %lld scanned); merged in %.2f s\nreport: %s\n",
              r["files"]["written"].get<long long>(), r["files"]["skipped"].get<long long>(),
              r["files"]["scanned"].get<long long>(), r["merge"]["seconds"].get<double>(),
              (options.output / melforge::builder::kReportName).string().c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "bench") == 0) return run_bench(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "merge") == 0) return run_merge(argc - 1, argv + 1);
  melforge::builder::BuildConfig config;
  std::string config_file;
  po::options_description all("melforge-build: audio corpus -> HDF5 log-mel dataset\n\n"
                              "Usage: melforge-build --input DIR|--manifest CSV --output DIR [options]\n"
                              "       melforge-build --layout NAME --input DATASET_ROOT --output DIR [options]\n"
                              "       melforge-build --shard K/N ... (one of N parts)   then   melforge-build merge --help\n"
                              "       melforge-build bench --help   (time each stage on your own corpus)\n"
                              "Flags may also be spelled as torchaudio names its parameters (--n_fft, --hop_length,\n"
                              "--sample_rate; --norm for --mel-norm), here and in the --config file; value names such as\n"
                              "slaney, htk, hann and reflect are read in any letter case.");
  melforge::builder::add_build_groups(all, config, config_file);
  if (!parse(argc, argv, all, config)) return 0;

  const auto result = melforge::builder::run_build(config);
  const auto& r = result.report;
  {
    std::printf("\nmelforge-build: %s engine, %lld files written, %lld skipped (of %lld scanned)\n",
                r["engine"].get<std::string>().c_str(), r["files"]["written"].get<long long>(),
                r["files"]["skipped"].get<long long>(), r["files"]["scanned"].get<long long>());
    for (const auto& split : melforge::builder::kSplitNames)
      std::printf("  %-5s %lld files\n", split.c_str(), r["files"]["per_split"][split].get<long long>());
    if (r.contains("speed_speakers")) {
      const auto& sp = r["speed_speakers"];
      std::string factors;
      for (const auto& f : sp["factors"])
        factors += (factors.empty() ? "" : ", ") + melforge::builder::speed_text(f.get<double>());
      std::printf("  speed speakers (%s): +%lld classes after the %lld original ones, +%lld train rows (%lld "
                  "utterances, %.1f s of audio)\n",
                  factors.c_str(), sp["classes_added"].get<long long>(), sp["original_classes"].get<long long>(),
                  sp["rows_added"].get<long long>(), sp["utterances_added"].get<long long>(),
                  sp["seconds_added"].get<double>());
    }
    for (const auto& s : r["skipped"])
      std::printf("  skipped %s: %s\n", s["path"].get<std::string>().c_str(), s["reason"].get<std::string>().c_str());
    const auto& clips = r["clips"];
    std::printf("  audio: %.1f s in, %.1f s stored (%.2f%%), %lld clips, %lld frames; %lld padded to one frame, "
                "%lld cut at --max-seconds (%.1f s dropped)\n",
                clips["seconds_in"].get<double>(), clips["seconds_stored"].get<double>(),
                clips["stored_fraction"].is_number() ? 100.0 * clips["stored_fraction"].get<double>() : 100.0,
                clips["rows"].get<long long>(), clips["frames"].get<long long>(), clips["padded"].get<long long>(),
                clips["capped"].get<long long>(), clips["seconds_dropped"].get<double>());
    std::printf("\n%s", result.timing_table.c_str());
    std::printf("throughput: %.1f files/s, %.0f frames/s, %.3f h of audio/s; peak RSS %.1f MiB\n",
                r["throughput"]["files_per_s"].get<double>(), r["throughput"]["frames_per_s"].get<double>(),
                r["throughput"]["audio_hours_per_s"].get<double>(),
                static_cast<double>(r["peak_rss_bytes"].get<long long>()) / (1 << 20));
    if (r.contains("shard"))
      std::printf("shard %d/%d: merge all %d shard folders with `melforge-build merge --output DIR SHARD_DIR...`\n",
                  r["shard"]["index"].get<int>(), r["shard"]["count"].get<int>(), r["shard"]["count"].get<int>());
    std::printf("report: %s\n", (config.build.output / melforge::builder::kReportName).string().c_str());
  }
  return 0;
}

/// Runs melforge-build and turns errors into messages and exit codes.
int run_and_report(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const melforge::builder::Interrupted& e) {
    std::fprintf(stderr, "melforge-build: %s; no output was replaced and the temporary files were removed\n",
                 e.what());
    return 128 + (e.signal() > 0 ? e.signal() : SIGINT);
  } catch (const melforge::InvalidArgument& e) {
    std::fprintf(stderr, "melforge-build: invalid argument: %s\n", e.what());
    return kExitUsage;
  } catch (const po::error& e) {
    std::fprintf(stderr, "melforge-build: %s (see --help)\n", e.what());
    return kExitUsage;
  } catch (const melforge::StrictError& e) {
    std::fprintf(stderr, "melforge-build: %s\n", e.what());
    return kExitStrict;
  } catch (const melforge::Error& e) {
    std::fprintf(stderr, "melforge-build: error: %s\n", e.what());
    return kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "melforge-build: unexpected error: %s\n", e.what());
    return kExitError;
  }
}

}  // namespace

/// After an error the process ends with _Exit, skipping atexit handlers: when an HDF5 write failed (full disk,
/// EFBIG), libhdf5 1.10's own clean-up at exit closes the file whose close already failed and crashes with SIGSEGV.
/// The partial file is already removed, so nothing is lost by skipping it.
int main(int argc, char** argv) {
  handle_stop_signals();
  const int code = run_and_report(argc, argv);
  if (code != 0) {
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return 0;
}
