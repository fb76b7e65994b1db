// Continuing and repeating runs (issue 17, "Runs"): config.json's resolved values, `--resume --epochs N` (flags
// honoured or refused by name; bit-exact against a straight run when the schedule does not depend on the total),
// `--init-from` with and without `--reset-heads` (checkpoints, exports, state dicts edited in Python), and
// `--config` (INI files and a run's own config.json).
#include <ATen/Parallel.h>
#include <ATen/ops/equal.h>
#include <torch/cuda.h>

#include "catch_torch.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <fstream>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/overrides.h"
#include "train/trainer.h"
#include "trainer_fixture.h"
#include "venv_python.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_runs {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;
namespace po = boost::program_options;

using test::read_json;
using test::read_lines;
using test::require_same_tensors;
using test::run_in_process;
using test::tiny_config;
using test::with;

namespace {

/// The command line of tiny_config(data, out, epochs).
std::vector<std::string> tiny_args(const fs::path& data, const fs::path& out, int64_t epochs) {
  return {"melforge-train", "train",   "--data",      data.string(), "--out",      out.string(),
          "--epochs",       std::to_string(epochs), "--hidden", "24", "--dropout", "0.2",
          "--seed",         "42",      "--lr",        "3e-3",        "--warmup",   "0.1",
          "--batch-size",   "16",      "--prefetch",  "2",           "--threads",  "2",
          "--log-level",    "warn"};
}

/// Every metrics.jsonl field that does not measure time equals, line by line (step lines included).
void require_same_metrics(const fs::path& a, const fs::path& b) {
  const auto la = read_lines(a), lb = read_lines(b);
  REQUIRE(la.size() == lb.size());
  for (std::size_t i = 0; i < la.size(); ++i)
    for (const auto& item : la[i].items()) {
      const std::string& k = item.key();
      if (k == "samples_per_s" || k == "epoch_s" || k == "data_wait_fraction" || k.find("_s") == k.size() - 2)
        continue;
      INFO("line " << i + 1 << " " << k);
      CHECK(item.value() == lb[i].at(k));
    }
}

trainer::Checkpoint last_of(const fs::path& run) { return trainer::load_checkpoint(run / "checkpoints/last.pt"); }

}  // namespace

TEST_CASE("config.json records the resolved device, threads, world size and stream mode beside the requested ones",
          "[trainer][runs]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  auto c = tiny_config(data, d / "run", 1);
  c.runtime.threads = 0;
  c.runtime.device = "cpu";
  std::ostringstream log;
  trainer::train(c, log);
  const auto j = read_json(d / "run" / "config.json");
  CHECK(j["threads"] == at::get_num_threads());
  CHECK(j["threads"].get<int>() >= 1);
  CHECK(j["device"] == "cpu");
  CHECK(j["world_size"] == 1);
  CHECK(j["dist_backend"] == "none");
  CHECK(j["global_batch_size"] == 16);
  CHECK(j["stream"]["stream"] == "off");
  CHECK(j["pos_weight_value"].is_number());
  CHECK(j["adamw"] != "auto");
  CHECK(j["requested"]["threads"] == 0);
  CHECK(j["requested"]["device"] == "cpu");
  CHECK(j["requested"]["stream"] == "auto");
  CHECK(j["requested"]["pos_weight"] == "auto");
  CHECK(j["requested"]["adamw"] == "auto");
  CHECK(j["requested"]["world_size"] == 0);
  CHECK(j["device_check"] == nlohmann::json({{"result", "not_applicable"},
                                             {"reason", "the device is the CPU, the check's reference"}}));
}

TEST_CASE("every saved field of a run maps to a flag of train, and the resume lists name registered flags",
          "[trainer][runs]") {
  po::options_description desc;
  trainer::TrainConfig c;
  trainer::add_options(desc, c);
  for (const auto& field : trainer::config_fields(c.to_json())) {
    const std::string flag = trainer::flag_of_field(field);
    INFO(field << " -> " << flag);
    if (field == "/eval/split" || field == "/view/resolved") {
      CHECK(flag.empty());
      continue;
    }
    CHECK(desc.find_nothrow(flag, false) != nullptr);
  }
  for (const auto* names : {&trainer::resume_honoured_flags(), &trainer::unsaved_flags()})
    for (const auto& flag : *names) {
      INFO(flag);
      CHECK(desc.find_nothrow(flag, false) != nullptr);
    }
  CHECK(trainer::flag_of_field("/augment/time_masks") == "spec-time-masks");
  CHECK(trainer::flag_of_field("/loader/batch_size") == "batch-size");
  CHECK(trainer::flag_of_field("/eval/batch_size") == "eval-batch-size");
}

TEST_CASE("flags given with --resume are honoured or refused by name", "[trainer][runs][resume]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  const fs::path run = d / "run";
  const auto [code0, out0] = run_in_process(tiny_args(data, run, 2));
  INFO(out0);
  REQUIRE(code0 == 0);
  const std::vector<std::string> resume = {"melforge-train", "train", "--resume", run.string(), "--log-level", "warn"};
  struct Refused {
    std::vector<std::string> args;
    const char* named;
  };
  const Refused cases[] = {{{"--lr", "0.5"}, "--lr"},           {{"--batch-size", "8"}, "--batch-size"},
                           {{"--seed", "7"}, "--seed"},         {{"--model", "crnn"}, "--model"},
                           {{"--warmup", "0"}, "--warmup"},     {{"--overwrite"}, "--overwrite"},
                           {{"--epochs", "1"}, "--epochs 1"},   {{"--init-from", "x.pt"}, "--init-from"},
                           {{"--spec-time-masks", "2"}, "--spec-time-masks"}, {{"--vote", "majority"}, "--vote"}};
  const Refused& k = cases[GENERATE(range(0, 10))];
  CAPTURE(k.named);
  const auto [code, output] = run_in_process(with(resume, k.args));
  CHECK(code == 2);
  CHECK_THAT(output, Catch::Contains(k.named));
  CHECK(last_of(run).epoch == 2);

  // A refused flag with the run's own value, and honoured flags, are accepted (nothing is left to train: the run
  // is evaluated again).
  const auto [same, same_out] =
      run_in_process(with(resume, {"--lr", "3e-3", "--patience", "4", "--threads", "1", "--eval-batch-size", "32"}));
  INFO(same_out);
  CHECK(same == 0);
  CHECK(read_json(run / "config.json")["train"]["patience"] == 4);
  CHECK(read_json(run / "config.json")["eval"]["batch_size"] == 32);
}

TEST_CASE("resume --epochs N after a finished run equals a straight N-epoch run when the schedule does not depend "
          "on the total",
          "[trainer][runs][resume]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  const bool constant = GENERATE(true, false);
  CAPTURE(constant);
  const auto config = [&](const fs::path& out, int64_t epochs) {
    auto c = tiny_config(data, out, epochs);
    if (constant) {
      c.optim.warmup = 0;
      c.optim.min_lr_ratio = 1;
    }
    return c;
  };
  const trainer::TrainResult straight = trainer::train(config(d / "straight", 4), log);
  const trainer::TrainResult two = trainer::train(config(d / "extended", 2), log);
  REQUIRE(two.test.has_value());
  CHECK(fs::exists(d / "extended" / "report.json"));

  trainer::TrainConfig more;
  more.train.resume = d / "extended";
  more.train.epochs = 4;
  more.given = {"epochs"};
  more.runtime.threads = 2;
  more.runtime.log_level = "warn";
  const trainer::TrainResult extended = trainer::train(more, log);
  CHECK(extended.epochs_done == 4);
  REQUIRE(extended.test.has_value());
  CHECK(read_json(d / "extended" / "config.json")["train"]["epochs"] == 4);

  const auto a = last_of(d / "straight"), b = last_of(d / "extended");
  CHECK(a.step == b.step);
  const auto la = test::epoch_lines(d / "straight" / "metrics.jsonl");
  const auto lb = test::epoch_lines(d / "extended" / "metrics.jsonl");
  REQUIRE(lb.size() == 4);
  // Epochs 3 and 4 run at the learning rates of the straight 4-epoch schedule.
  for (std::size_t i = 2; i < 4; ++i) CHECK(la[i]["lr"] == lb[i]["lr"]);
  if (constant) {
    require_same_tensors(a.model, b.model, "model");
    require_same_tensors(a.optimizer, b.optimizer, "optimizer");
    CHECK(at::equal(a.rng_state, b.rng_state));
    require_same_metrics(d / "straight" / "metrics.jsonl", d / "extended" / "metrics.jsonl");
    CHECK(extended.best_epoch == straight.best_epoch);
    CHECK(extended.test->segment.accuracy == straight.test->segment.accuracy);
    CHECK(extended.test->segment.loss == straight.test->segment.loss);
    for (const char* split : {"val", "test"})
      for (const char* level : {"tiles", "file"}) {
        INFO(split << " " << level);
        CHECK(read_json(d / "extended" / "report.json")[split][level] ==
              read_json(d / "straight" / "report.json")[split][level]);
      }
  } else {
    // The first two epochs ran the 2-epoch cosine: other rates, so other weights (documented).
    CHECK(la[1]["lr"] != lb[1]["lr"]);
    bool differ = false;
    for (const auto& [name, t] : a.model) differ = differ || !at::equal(t, b.model.at(name));
    CHECK(differ);
  }
}

TEST_CASE("resume refuses a dataset changed since the checkpoint, naming the change, unless "
          "--allow-dataset-change",
          "[trainer][runs][resume][untrusted]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  const fs::path run = d / "run";
  const auto [code0, out0] = run_in_process(tiny_args(data, run, 1));
  INFO(out0);
  REQUIRE(code0 == 0);
  REQUIRE(last_of(run).state.contains("dataset"));
  for (const char* split : {"train.h5", "val.h5", "test.h5"}) {
    const h5::File f = h5::open_file(data / split, /*writable=*/true);
    h5::write_attribute_string(f, "build_id", "rebuilt");
  }
  const std::vector<std::string> resume = {"melforge-train", "train", "--resume", run.string(), "--log-level", "warn",
                                           "--threads", "2", "--epochs", "2"};
  const auto [refused, refused_out] = run_in_process(resume);
  CHECK(refused == 1);
  CHECK_THAT(refused_out, Catch::Contains("val split: ") && Catch::Contains(" then, 'rebuilt' now") &&
                              Catch::Contains("--allow-dataset-change"));
  CHECK(last_of(run).epoch == 1);
  const auto [code, output] = run_in_process(with(resume, {"--allow-dataset-change"}));
  INFO(output);
  CHECK(code == 0);
  CHECK_THAT(output, Catch::Contains("--allow-dataset-change: resuming on a changed dataset"));
  CHECK(last_of(run).epoch == 2);
  const nlohmann::json changes = read_json(run / "report.json")["dataset_changes"];
  REQUIRE(changes.size() == 3);
  for (const auto& split : {"train", "val", "test"}) {
    const std::string prefix = std::string("epoch 1: ") + split + " split: ";
    CHECK(std::count_if(changes.begin(), changes.end(), [&](const nlohmann::json& c) {
            const std::string text = c.get<std::string>();
            return text.rfind(prefix, 0) == 0 && text.find(" then, 'rebuilt' now") != std::string::npos;
          }) == 1);
  }
}

TEST_CASE("an early-stopped run extends only with a patience that lets it go on", "[trainer][runs][resume]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  const fs::path run = d / "run";
  // A learning rate too small to change a float32 weight: the validation metric never improves after epoch 1.
  std::vector<std::string> args = tiny_args(data, run, 4);
  args[std::find(args.begin(), args.end(), "--lr") - args.begin() + 1] = "1e-30";
  const auto [code0, out0] = run_in_process(with(args, {"--patience", "1"}));
  INFO(out0);
  REQUIRE(code0 == 0);
  CHECK_THAT(out0, Catch::Contains("early stop"));
  REQUIRE(last_of(run).epoch == 2);
  const std::vector<std::string> resume = {"melforge-train", "train", "--resume", run.string(), "--log-level", "warn",
                                           "--threads", "2", "--epochs", "5"};
  const auto [refused, refused_out] = run_in_process(resume);
  CHECK(refused == 2);
  CHECK_THAT(refused_out, Catch::Contains("--patience") && Catch::Contains("stopped early"));
  const auto [code, output] = run_in_process(with(resume, {"--patience", "0"}));
  INFO(output);
  CHECK(code == 0);
  CHECK(last_of(run).epoch == 5);
  CHECK(test::epoch_lines(run / "metrics.jsonl").size() == 5);
}

TEST_CASE("train --config reads an INI file like the flags, and a run's config.json repeats the run exactly",
          "[trainer][runs][config]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  const auto [code0, out0] = run_in_process(tiny_args(data, d / "flags", 2));
  INFO(out0);
  REQUIRE(code0 == 0);

  // The same run from an INI file (torchaudio-style spellings allowed, as in melforge-build's --config); the
  // command line overrides the file's epochs.
  test::write_text(d / "run.ini", "# the tiny run\ndata = " + data.string() +
                                      "\nepochs = 5\nhidden = 24\ndropout = 0.2\nseed = 42\nlr = 3e-3\nwarmup = "
                                      "0.1\nbatch_size = 16\nprefetch = 2\nthreads = 2\nlog-level = warn\n");
  const auto [code1, out1] = run_in_process(
      {"melforge-train", "train", "--config", (d / "run.ini").string(), "--out", (d / "ini").string(), "--epochs", "2"});
  INFO(out1);
  REQUIRE(code1 == 0);
  CHECK(read_json(d / "ini" / "config.json") == read_json(d / "flags" / "config.json"));
  require_same_tensors(last_of(d / "flags").model, last_of(d / "ini").model, "model");

  // The run again from its config.json, into another folder: the same configuration and the same weights.
  const auto [code2, out2] = run_in_process({"melforge-train", "train", "--config",
                                             (d / "flags" / "config.json").string(), "--out", (d / "again").string(),
                                             "--threads", "2", "--log-level", "warn"});
  INFO(out2);
  REQUIRE(code2 == 0);
  // Only what was asked for differs: the file names the stream mode the first run resolved.
  auto again = read_json(d / "again" / "config.json"), first = read_json(d / "flags" / "config.json");
  CHECK(again["requested"]["stream"] == "off");
  CHECK(first["requested"]["stream"] == "auto");
  again.erase("requested");
  first.erase("requested");
  CHECK(again == first);
  require_same_tensors(last_of(d / "flags").model, last_of(d / "again").model, "model");
  require_same_metrics(d / "flags" / "metrics.jsonl", d / "again" / "metrics.jsonl");

  // Flags given with a config.json replace its values.
  const auto [code3, out3] = run_in_process({"melforge-train", "train", "--config",
                                             (d / "flags" / "config.json").string(), "--out", (d / "other").string(),
                                             "--epochs", "1", "--seed", "7", "--threads", "2", "--log-level", "warn"});
  INFO(out3);
  REQUIRE(code3 == 0);
  const auto other = read_json(d / "other" / "config.json");
  CHECK(other["train"]["epochs"] == 1);
  CHECK(other["model"]["seed"] == 7);
  CHECK(other["model"]["hidden"] == 24);
  CHECK(other["optim"]["lr"] == 3e-3);

  SECTION("an unknown key of the INI file is named with the file") {
    test::write_text(d / "bad.ini", "epochs = 3\nlearning_rate = 0.1\n");
    const auto [code, output] = run_in_process({"melforge-train", "train", "--config", (d / "bad.ini").string(),
                                                "--data", data.string(), "--out", (d / "bad").string()});
    CHECK(code == 2);
    CHECK_THAT(output, Catch::Contains("bad.ini") && Catch::Contains("learning_rate"));
  }
  SECTION("a JSON file that is not a run's config.json, and a config.json with --resume") {
    test::write_text(d / "x.json", "{\"lr\": 0.1}");
    const auto [code, output] = run_in_process(
        {"melforge-train", "train", "--config", (d / "x.json").string(), "--out", (d / "bad").string()});
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains("x.json") && Catch::Contains("not a run's config.json"));
    const auto [code2b, output2b] = run_in_process({"melforge-train", "train", "--config",
                                                    (d / "flags" / "config.json").string(), "--resume",
                                                    (d / "flags").string()});
    CHECK(code2b == 2);
    CHECK_THAT(output2b, Catch::Contains("--resume"));
  }
}

namespace {

/// Runs `script` (Python, with sys.argv[1:] = `args`) in the torch venv; its exit code, output in `output`.
int run_python(const std::string& python, const std::string& script, const std::vector<std::string>& args,
               std::string& output) {
  std::string cmd = "'" + python + "' -c '" + script + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  return test::run_command(cmd, output);
}

}  // namespace

TEST_CASE("train --init-from starts a new run from trained weights, with --reset-heads for another class set",
          "[trainer][runs][init]") {
  TempDir d;
  const fs::path a_data = test::build_tone_dataset(d.path(), 3, 3, "a");
  const fs::path b_data = test::build_tone_dataset(d.path(), 2, 3, "b");
  std::ostringstream log;
  trainer::train(tiny_config(a_data, d / "run_a", 2), log);
  const fs::path a_best = d / "run_a" / "checkpoints" / "best.pt";
  const trainer::Checkpoint a = trainer::load_checkpoint(a_best);

  // A learning rate too small to change a float32 weight: after one epoch, last.pt holds the initial weights.
  const auto frozen = [&](const fs::path& data, const fs::path& out) {
    auto c = tiny_config(data, out, 1);
    c.optim.lr = 1e-30;
    c.model.seed = 5;
    return c;
  };

  SECTION("the same class set: every tensor comes from the checkpoint") {
    auto c = frozen(a_data, d / "same");
    c.train.init_from = a_best;
    trainer::train(c, log);
    require_same_tensors(a.model, last_of(d / "same").model, "model");
    CHECK(read_json(d / "same" / "config.json")["train"]["init_from"] == fs::absolute(a_best).string());
    CHECK(read_json(d / "same" / "config.json")["input_mean"] == a.model.at("input_mean").item<double>());
  }
  SECTION("another class set: refused without --reset-heads, backbone from A and fresh heads with it") {
    auto c = frozen(b_data, d / "run_b");
    c.train.init_from = a_best;
    CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--reset-heads") && Catch::Contains("class2") &&
                                                  Catch::Contains(a_best.string()));
    CHECK_FALSE(fs::exists(d / "run_b" / "config.json"));
    c.train.reset_heads = true;
    trainer::train(c, log);
    const trainer::Checkpoint b = last_of(d / "run_b");
    auto fresh_config = frozen(b_data, d / "fresh");
    trainer::train(fresh_config, log);
    const trainer::Checkpoint fresh = last_of(d / "fresh");
    for (const auto& [name, t] : b.model) {
      INFO(name);
      const bool head = name.rfind("class_head.", 0) == 0 || name.rfind("detect_head.", 0) == 0;
      CHECK(at::equal(t, head ? fresh.model.at(name) : a.model.at(name)));
    }
    CHECK(b.model.at("class_head.weight").size(0) == 2);
  }
  SECTION("another architecture is refused naming the difference") {
    auto c = frozen(a_data, d / "wide");
    c.train.init_from = a_best;
    c.model.hidden = 32;
    CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("hidden 24 (this run: 32)"));
  }
}

TEST_CASE("weights exported to Python, edited there and saved with torch.save load back with --init-from",
          "[trainer][runs][init][python]") {
  const std::string python = test::venv_python();
  if (python.empty()) MELFORGE_SKIP("the torch venv of tools/setup_torch.sh is not installed (run bash tools/setup_torch.sh)");
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  trainer::train(tiny_config(data, d / "a", 2), log);
  const fs::path best = d / "a" / "checkpoints" / "best.pt";
  const auto [code, output] = run_in_process(
      {"melforge-train", "export", "--checkpoint", best.string(), "--out", (d / "weights.pt").string()});
  INFO(output);
  REQUIRE(code == 0);
  // Python: fc.weight doubled (exact in float32); a second file with fc.weight renamed; a third saved as an
  // OrderedDict, as model.state_dict() gives one.
  const std::string script =
      "import sys, collections, torch\n"
      "sd = torch.load(sys.argv[1])\n"
      "sd[\"fc.weight\"] = sd[\"fc.weight\"] * 2\n"
      "torch.save(sd, sys.argv[2])\n"
      "od = collections.OrderedDict(sd)\n"
      "torch.save(od, sys.argv[4])\n"
      "sd[\"fc.weights\"] = sd.pop(\"fc.weight\")\n"
      "torch.save(sd, sys.argv[3])\n";
  std::string py_out;
  REQUIRE(run_python(python, script,
                     {(d / "weights.pt").string(), (d / "edited.pt").string(), (d / "renamed.pt").string(),
                      (d / "ordered.pt").string()},
                     py_out) == 0);
  INFO(py_out);
  const trainer::Checkpoint a = trainer::load_checkpoint(best);
  const auto frozen = [&](const fs::path& init, const fs::path& out) {
    auto c = tiny_config(data, out, 1);
    c.optim.lr = 1e-30;
    c.train.init_from = init;
    return c;
  };
  // An OrderedDict (what model.state_dict() is) is not read by LibTorch's unpickler: refused with the remedy.
  CHECK_THROWS_WITH(trainer::train(frozen(d / "ordered.pt", d / "ordered"), log),
                    Catch::Contains("ordered.pt") && Catch::Contains("torch.save(dict(model.state_dict())"));
  const char* file = GENERATE("weights.pt", "edited.pt");
  CAPTURE(file);
  trainer::train(frozen(d / file, d / "run"), log);
  const trainer::Checkpoint b = last_of(d / "run");
  for (const auto& [name, t] : a.model) {
    INFO(name);
    const bool doubled = name == "fc.weight" && std::string(file) != "weights.pt";
    CHECK(at::equal(b.model.at(name), doubled ? t.mul(2) : t));
  }
  CHECK_THROWS_WITH(trainer::train(frozen(d / "renamed.pt", d / "renamed"), log),
                    Catch::Contains("renamed.pt") && Catch::Contains("missing from the file: fc.weight") &&
                        Catch::Contains("unexpected (not in the model): fc.weights"));
}

}  // namespace melforge_test_trainer_runs
