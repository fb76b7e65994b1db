// melforge-train's command line, run in-process through run_cli: exit codes, messages, and `inspect` on a dataset.
#include "catch_torch.h"

#include <sstream>

#include "cli.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_cli {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result run(std::vector<std::string> args) {
  args.insert(args.begin(), "melforge-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = trainer::run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

}  // namespace

TEST_CASE("melforge-train without a known command prints the usage", "[trainer][cli]") {
  const auto none = run({});
  CHECK(none.code == trainer::kExitUsage);
  CHECK_THAT(none.err, Catch::Contains("Usage: melforge-train <command>"));
  const auto help = run({"--help"});
  CHECK(help.code == trainer::kExitOk);
  for (const std::string c : {"train", "eval", "predict", "export", "bench", "inspect"})
    CHECK_THAT(help.out, Catch::Contains("  " + c + " "));
  const auto unknown = run({"fit"});
  CHECK(unknown.code == trainer::kExitUsage);
  CHECK_THAT(unknown.err, Catch::Contains("unknown command 'fit'"));
  const auto version = run({"--version"});
  CHECK(version.code == trainer::kExitOk);
  CHECK_THAT(version.out, Catch::Contains(std::string("melforge-train ") + MELFORGE_VERSION));
}

TEST_CASE("train, eval and bench refuse invalid arguments before any work", "[trainer][cli]") {
  // The folder does not exist: reaching it would fail with kExitError instead.
  const std::string nowhere = (fs::temp_directory_path() / "melforge-no-such-dataset").string();
  const std::string run_dir = (fs::temp_directory_path() / "melforge-no-such-run").string();
  const std::vector<std::string> args = GENERATE_COPY(
      std::vector<std::string>{"train", "--out", run_dir},
      std::vector<std::string>{"train", "--data", nowhere},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--epochs", "0"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--amp", "fp8"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--lr", "-1"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--batch-size", "0"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--best-metric", "speed"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--pos-weight", "x"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--task", "tagging"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--task", "multilabel", "--best-metric",
                               "val_accuracy"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--aggregate", "median"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--device", "tpu"},
      std::vector<std::string>{"train", "--data", nowhere, "--out", run_dir, "--log-level", "loud"},
      std::vector<std::string>{"eval", "--data", nowhere},
      std::vector<std::string>{"eval", "--checkpoint", nowhere},
      std::vector<std::string>{"eval", "--checkpoint", nowhere, "--data", nowhere, "--split", "dev"},
      std::vector<std::string>{"eval", "--checkpoint", nowhere, "--data", nowhere, "--vote", "max"},
      std::vector<std::string>{"bench", "--data", nowhere, "--steps", "0"},
      std::vector<std::string>{"bench"},
      std::vector<std::string>{"export", "--checkpoint", nowhere},
      std::vector<std::string>{"predict", "--checkpoint", nowhere});
  CAPTURE(args);
  const auto r = run(args);
  CHECK(r.code == trainer::kExitUsage);
  CHECK_THAT(r.err, Catch::StartsWith("melforge-train: "));
  CHECK_FALSE(fs::exists(run_dir));
}

TEST_CASE("train, eval and bench through the command line", "[trainer][cli]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 4);
  const fs::path run_dir = d / "run";
  const std::vector<std::string> common = {"--data", data.string(), "--hidden", "16", "--batch-size", "16",
                                           "--threads", "2", "--log-level", "warn"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const auto t = run(with({"train", "--out", run_dir.string(), "--epochs", "2"}));
  INFO(t.err);
  REQUIRE(t.code == trainer::kExitOk);
  CHECK_THAT(t.out, Catch::Contains("run folder: " + run_dir.string()));
  CHECK_THAT(t.out, Catch::Contains("report: "));
  CHECK(fs::is_regular_file(run_dir / "checkpoints" / "best.pt"));

  const auto again = run(with({"train", "--out", run_dir.string(), "--epochs", "2"}));
  CHECK(again.code == trainer::kExitUsage);
  CHECK_THAT(again.err, Catch::Contains("not empty"));

  const auto missing_class = run(with({"train", "--out", (d / "run2").string(), "--positive-class", "leak"}));
  CHECK(missing_class.code == trainer::kExitUsage);
  CHECK_THAT(missing_class.err, Catch::Contains("leak") && Catch::Contains("class0"));

  const std::string ckpt = (run_dir / "checkpoints" / "best.pt").string();
  const auto e = run({"eval", "--checkpoint", ckpt, "--data", data.string(), "--split", "val", "--out",
                      (d / "val.json").string(), "--log-level", "warn"});
  INFO(e.err);
  REQUIRE(e.code == trainer::kExitOk);
  CHECK_THAT(e.out, Catch::Contains("on val of"));
  CHECK(fs::is_regular_file(d / "val.json"));

  const fs::path other = test::build_tone_dataset(d.path(), 2, 4, "two");
  const auto misfit = run({"eval", "--checkpoint", ckpt, "--data", other.string()});
  CHECK(misfit.code == trainer::kExitError);
  CHECK_THAT(misfit.err, Catch::Contains("does not fit"));

  const auto b = run(with({"bench", "--steps", "2", "--warmup-steps", "1", "--out", (d / "bench.json").string()}));
  INFO(b.err);
  REQUIRE(b.code == trainer::kExitOk);
  CHECK_THAT(b.out, Catch::Contains("training step"));
  CHECK(fs::is_regular_file(d / "bench.json"));
}

TEST_CASE("inspect refuses invalid arguments before any work", "[trainer][cli]") {
  // The folder does not exist: reaching it would fail with kExitError instead.
  const std::string nowhere = (fs::temp_directory_path() / "melforge-no-such-dataset").string();
  const std::vector<std::string> args = GENERATE_COPY(
      std::vector<std::string>{"inspect"}, std::vector<std::string>{"inspect", "--data", nowhere, "--model", "crnn2"},
      std::vector<std::string>{"inspect", "--data", nowhere, "--dropout", "1.5"},
      std::vector<std::string>{"inspect", "--data", nowhere, "--hidden", "0"},
      std::vector<std::string>{"inspect", "--data", nowhere, "--hidden", "many"},
      std::vector<std::string>{"inspect", "--data", nowhere, "--no-such-flag"});
  CAPTURE(args);
  const auto r = run(args);
  CHECK(r.code == trainer::kExitUsage);
  CHECK_THAT(r.err, Catch::StartsWith("melforge-train: "));
}

TEST_CASE("inspect loads a dataset, builds the model for it and runs it", "[trainer][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 4);
  builder::run_build(test::tiny_build_config(d / "in", d / "out"));
  const auto r = run({"inspect", "--data", (d / "out").string(), "--hidden", "16"});
  INFO(r.err);
  REQUIRE(r.code == trainer::kExitOk);
  CHECK_THAT(r.out, Catch::Contains("classes (3): class0, class1, class2"));
  CHECK_THAT(r.out, Catch::Contains("default tile: 0.25 s (31 frames of 32 mels)"));
  CHECK_THAT(r.out, Catch::Contains("input [B, 1, 32, 31] -> logits [B, 3], detection [B]"));
  CHECK_THAT(r.out, Catch::Contains("-> logits ["));
  CHECK_THAT(r.out, Catch::Matches("(.|\n)*forward on class[0-2]/[^ ]+: input \\[([1-9][0-9]*), 32, 31\\] -> logits "
                                   "\\[\\2, 3\\], detection \\[\\2\\](.|\n)*"));

  const auto missing = run({"inspect", "--data", (d / "nowhere").string()});
  CHECK(missing.code == trainer::kExitError);
  CHECK_THAT(missing.err, Catch::Contains("does not exist"));

  fs::remove(d / "out/val.h5");
  const auto incomplete = run({"inspect", "--data", (d / "out").string()});
  CHECK(incomplete.code == trainer::kExitError);
  CHECK_THAT(incomplete.err, Catch::Contains("has no val.h5"));
}

TEST_CASE("inspect reports an empty train split as an error", "[trainer][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  auto c = test::tiny_build_config(d / "in", d / "out");
  c.build.split = "0,0.5,0.5";
  builder::run_build(c);
  const auto r = run({"inspect", "--data", (d / "out").string()});
  CHECK(r.code == trainer::kExitError);
  CHECK_THAT(r.err, Catch::Contains("split 'train'"));
  CHECK_THAT(r.err, Catch::Contains("is empty"));
}

TEST_CASE("flags spelled with underscores reach the same option, before any work", "[trainer][cli]") {
  // Each alias form carries a value its option refuses: the message names the canonical flag, so the alias was read
  // as that flag (an unread alias would fail as an unrecognised option instead).
  const std::string nowhere = (fs::temp_directory_path() / "melforge-no-such-dataset").string();
  const std::string run_dir = (fs::temp_directory_path() / "melforge-no-such-run").string();
  const auto [flag, canonical] = GENERATE(table<std::string, std::string>({{"--batch_size", "--batch-size"},
                                                                           {"--batch-size", "--batch-size"},
                                                                           {"--rnn_hidden", "--rnn-hidden"},
                                                                           {"--h5_cache", "--h5-cache"}}));
  const bool equals_form = GENERATE(false, true);
  CAPTURE(flag, equals_form);
  std::vector<std::string> args = {"train", "--data", nowhere, "--out", run_dir};
  if (equals_form) args.push_back(flag + "=0");
  else args.insert(args.end(), {flag, "0"});
  const auto r = run(args);
  CHECK(r.code == trainer::kExitUsage);
  CHECK_THAT(r.err, Catch::StartsWith("melforge-train: invalid argument: " + canonical));
  CHECK_FALSE(fs::exists(run_dir));
}

TEST_CASE("an unknown flag names the nearest one and fails before any work", "[trainer][cli]") {
  const std::string nowhere = (fs::temp_directory_path() / "melforge-no-such-dataset").string();
  const std::string run_dir = (fs::temp_directory_path() / "melforge-no-such-run").string();
  const auto [flag, expected] = GENERATE(table<std::string, std::string>(
      {{"--batchsize", "unrecognised option '--batchsize'; did you mean --batch-size?"},
       {"--epoch_s", "unrecognised option '--epoch_s'; did you mean --epochs?"},
       {"--lr_rate", "unrecognised option '--lr_rate'"},
       {"--zzzzzzzz", "unrecognised option '--zzzzzzzz' (see --help)"}}));
  CAPTURE(flag);
  const auto r = run({"train", "--data", nowhere, "--out", run_dir, flag, "3"});
  CHECK(r.code == trainer::kExitUsage);
  CHECK_THAT(r.err, Catch::StartsWith("melforge-train: " + expected));
  CHECK_FALSE(fs::exists(run_dir));
  const auto prefix = run({"train", "--data", nowhere, "--out", run_dir, "--r", "3"});
  CHECK(prefix.code == trainer::kExitUsage);
  CHECK_THAT(prefix.err, Catch::Contains("unrecognised option '--r'; did you mean --"));
  const auto help = run({"train", "--help"});
  CHECK(help.code == trainer::kExitOk);
  CHECK_THAT(help.out, Catch::Contains("--batch-size") && !Catch::Contains("--batch_size"));
}

}  // namespace melforge_test_trainer_cli
