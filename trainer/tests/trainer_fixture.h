#pragma once
// Tiny datasets built through the builder library, for the trainer's tests.
#include <ATen/ops/equal.h>

#include "catch_torch.h"

#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "build_fixture.h"
#include "cli.h"
#include "pipeline.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace melforge::test {

/// A build configuration for a tone corpus at `in` written to `out`: 8 kHz, n_fft 256, hop 64, 32 mels, clips
/// stored whole (schema 3) with a default tile of 0.25 s, so one tile is [32 mels x 31 frames].
inline builder::BuildConfig tiny_build_config(const std::filesystem::path& in, const std::filesystem::path& out) {
  builder::BuildConfig c = tone_build_config(in, out);
  c.build.threads = 2;
  return c;
}

/// Writes a tone corpus of `classes` classes and `per_class` files each (plus a stereo file per class) under
/// `root/in` and builds it into `root/<name>` with tiny_build_config, after `adjust` (may be empty) changed the
/// configuration. Returns the dataset folder.
template <typename Adjust>
std::filesystem::path build_tone_dataset(const std::filesystem::path& root, int classes, int per_class,
                                         const std::string& name, Adjust&& adjust) {
  const std::filesystem::path in = root / ("in-" + std::to_string(classes) + "x" + std::to_string(per_class));
  if (!std::filesystem::exists(in)) write_tone_corpus(in, classes, per_class);
  builder::BuildConfig c = tiny_build_config(in, root / name);
  adjust(c);
  builder::run_build(c);
  return root / name;
}

/// The same without changes to the configuration.
inline std::filesystem::path build_tone_dataset(const std::filesystem::path& root, int classes, int per_class,
                                                const std::string& name = "data") {
  return build_tone_dataset(root, classes, per_class, name, [](builder::BuildConfig&) {});
}

/// A small, fast training configuration for the tiny datasets (hidden 24, batch 16, 2 threads, log level from
/// MELFORGE_TEST_LOG_LEVEL or warn), reading `data` and writing the run folder `out`.
inline trainer::TrainConfig tiny_config(const std::filesystem::path& data, const std::filesystem::path& out,
                                        int64_t epochs) {
  trainer::TrainConfig c;
  c.data.data = data;
  c.train.out = out;
  c.train.epochs = epochs;
  c.model.hidden = 24;
  c.model.dropout = 0.2;
  c.model.seed = 42;
  c.optim.lr = 3e-3;
  c.optim.warmup = 0.1;
  c.loader.batch_size = 16;
  c.loader.prefetch = 2;
  c.runtime.threads = 2;
  const char* level = std::getenv("MELFORGE_TEST_LOG_LEVEL");
  c.runtime.log_level = level ? level : "warn";
  return c;
}

/// `args` followed by `more`.
inline std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

/// Runs `args` (argv as for the binary; argv[0] is ignored) through run_cli in this process: the exit code and
/// stdout + stderr. Used where the process boundary is not what is tested, to save LibTorch's start-up (~2 s).
inline std::pair<int, std::string> run_in_process(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out;
  const int code = trainer::run_cli(static_cast<int>(argv.size()), argv.data(), out, out);
  return {code, out.str()};
}

/// The JSON document of file `p` (REQUIREs that it opens).
inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  REQUIRE(f);
  return nlohmann::json::parse(f);
}

/// The JSON objects of a JSON-lines file (empty lines skipped).
inline std::vector<nlohmann::json> read_lines(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// The epoch lines of a run's metrics.jsonl ("type": "epoch"; the step lines are left out).
inline std::vector<nlohmann::json> epoch_lines(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  for (auto& j : read_lines(metrics))
    if (j.value("type", "") == "epoch") out.push_back(std::move(j));
  return out;
}

/// Every tensor of `a` equals the one of the same name in `b`, bit for bit.
inline void require_same_tensors(const trainer::TensorMap& a, const trainer::TensorMap& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(what << " " << name);
    REQUIRE(b.count(name) == 1);
    CHECK(at::equal(t, b.at(name)));
  }
}

}  // namespace melforge::test
