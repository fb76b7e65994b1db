// The training loop on tiny tone datasets built through the builder library: accuracy, the run folder,
// determinism, exact resume, NaN handling, bad inputs, `eval` and `bench`.
#include <ATen/ops/equal.h>
#include <ATen/ops/isfinite.h>
#include <torch/cuda.h>

#include "catch_torch.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_train {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

using test::epoch_lines;
using test::read_json;
using test::read_lines;
using test::require_same_tensors;
using test::tiny_config;

namespace {

int64_t data_files_of_test(const fs::path& data) {
  return trainer::read_split(data / "test.h5", "test", /*load_frames=*/false).files();
}

bool any_different(const trainer::TensorMap& a, const trainer::TensorMap& b) {
  for (const auto& [name, t] : a)
    if (!at::equal(t, b.at(name))) return true;
  return false;
}

}  // namespace

TEST_CASE("a short CPU training on tones reaches high accuracy and leaves a complete run folder",
          "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 6);
  const fs::path run = d / "run";
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(tiny_config(data, run, 8), log);
  INFO(log.str());
  REQUIRE(r.test.has_value());
  REQUIRE(r.val.has_value());
  CHECK(r.epochs_done == 8);
  CHECK_FALSE(r.interrupted);
  CHECK(r.test->segment.accuracy >= 0.9);
  CHECK(r.test->file.accuracy >= 0.9);
  CHECK(r.val->segment.accuracy >= 0.9);

  for (const char* f : {"config.json", "metrics.jsonl", "checkpoints/last.pt", "checkpoints/best.pt", "report.json",
                        "confusion_val.csv", "confusion_test.csv", "timings.json"})
    CHECK(fs::is_regular_file(run / f));
  CHECK_FALSE(fs::exists(run / "checkpoints/last.pt.tmp"));

  const auto config = read_json(run / "config.json");
  CHECK(config["classes"] == std::vector<std::string>{"class0", "class1", "class2"});
  CHECK(config["mel"]["n_mels"] == 32);
  CHECK(config["train"]["epochs"] == 8);
  CHECK(config["positive_class"] == "class0");
  CHECK(config["view"]["view"] == "tiles");
  CHECK(config["view"]["tile_seconds"] == 0.25);
  CHECK(config["view"]["resolved"] == true);
  CHECK(config["model_config"]["n_frames"] == 31);

  const auto lines = epoch_lines(run / "metrics.jsonl");
  REQUIRE(lines.size() == 8);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CHECK(lines[i]["epoch"] == static_cast<int64_t>(i + 1));
    for (const char* k : {"lr", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "val_macro_f1",
                          "val_file_accuracy", "val_det_f1", "samples_per_s", "epoch_s", "data_wait_fraction"}) {
      INFO(k);
      CHECK(lines[i][k].is_number());
    }
    CHECK(lines[i]["data_wait_fraction"].get<double>() >= 0.0);
    CHECK(lines[i]["data_wait_fraction"].get<double>() <= 1.0);
  }
  CHECK(lines.back()["train_loss"].get<double>() < lines.front()["train_loss"].get<double>());

  const auto report = read_json(run / "report.json");
  CHECK(report["best_epoch"] == r.best_epoch);
  CHECK(report["test"]["tiles"]["accuracy"].get<double>() == Approx(r.test->segment.accuracy));
  CHECK(report["test"]["file"]["count"] == data_files_of_test(data));

  const trainer::Checkpoint last = trainer::load_checkpoint(run / "checkpoints/last.pt");
  const trainer::Checkpoint best = trainer::load_checkpoint(run / "checkpoints/best.pt");
  CHECK(last.epoch == 8);
  CHECK(best.epoch == r.best_epoch);
  CHECK(last.class_names == std::vector<std::string>{"class0", "class1", "class2"});
  CHECK(last.state["best_epoch"] == r.best_epoch);
  // The best epoch has the highest validation macro-F1 of the log.
  double best_f1 = -1;
  for (const auto& l : lines) best_f1 = std::max(best_f1, l["val_macro_f1"].get<double>());
  CHECK(lines[static_cast<std::size_t>(r.best_epoch - 1)]["val_macro_f1"].get<double>() == best_f1);

  std::ifstream csv(run / "confusion_test.csv");
  std::string header;
  std::getline(csv, header);
  CHECK_THAT(header, Catch::Contains("class0") && Catch::Contains("class2"));
}

TEST_CASE("training on the CPU is deterministic for a seed", "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  const auto last_of = [&](const std::string& name, uint64_t seed) {
    auto c = tiny_config(data, d / name, 2);
    c.model.seed = seed;
    trainer::train(c, log);
    return trainer::load_checkpoint(d / name / "checkpoints/last.pt");
  };
  const trainer::Checkpoint a = last_of("a", 42), b = last_of("b", 42), other = last_of("c", 43);
  require_same_tensors(a.model, b.model, "model");
  require_same_tensors(a.optimizer, b.optimizer, "optimizer");
  CHECK(any_different(a.model, other.model));
}

TEST_CASE("a run stopped after 2 epochs and resumed ends with the weights of an uninterrupted run",
          "[trainer][train][resume]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  const auto [accumulate, form] =
      GENERATE(table<int64_t, std::string>({{1, "run folder"}, {2, "checkpoint"}}));
  CAPTURE(accumulate, form);
  auto straight = tiny_config(data, d / "straight", 4);
  straight.optim.accumulate = accumulate;
  const trainer::TrainResult full = trainer::train(straight, log);

  auto first = straight;
  first.train.out = d / "pieces";
  trainer::TrainHooks stop_after_two;
  stop_after_two.on_epoch_end = [](int64_t epoch) { return epoch < 1; };
  const trainer::TrainResult part = trainer::train(first, log, stop_after_two);
  CHECK(part.interrupted);
  CHECK(part.epochs_done == 2);
  CHECK_FALSE(fs::exists(d / "pieces" / "report.json"));
  CHECK(epoch_lines(d / "pieces" / "metrics.jsonl").size() == 2);

  trainer::TrainConfig resume;
  resume.train.resume = form == "run folder" ? d / "pieces" : d / "pieces" / "checkpoints" / "last.pt";
  resume.runtime.threads = 2;
  resume.runtime.log_level = "warn";
  const trainer::TrainResult rest = trainer::train(resume, log);
  CHECK(rest.epochs_done == 4);
  CHECK(rest.best_epoch == full.best_epoch);

  const auto a = trainer::load_checkpoint(d / "straight" / "checkpoints/last.pt");
  const auto b = trainer::load_checkpoint(d / "pieces" / "checkpoints/last.pt");
  CHECK(a.step == b.step);
  require_same_tensors(a.model, b.model, "model");
  require_same_tensors(a.optimizer, b.optimizer, "optimizer");
  CHECK(at::equal(a.rng_state, b.rng_state));
  const auto la = epoch_lines(d / "straight" / "metrics.jsonl"), lb = epoch_lines(d / "pieces" / "metrics.jsonl");
  REQUIRE(lb.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(la[i]["train_loss"] == lb[i]["train_loss"]);
  REQUIRE(rest.test.has_value());
  CHECK(rest.test->segment.accuracy == full.test->segment.accuracy);
}

TEST_CASE("a NaN loss stops the run with a clear error and keeps the last good checkpoint", "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  trainer::TrainHooks poison;
  poison.on_batch = [](int64_t epoch, trainer::Batch& b) {
    if (epoch == 1 && b.index == 1) b.x = b.x.clone().fill_(std::numeric_limits<float>::quiet_NaN());
  };
  const auto config = tiny_config(data, d / "run", 4);
  try {
    trainer::train(config, log, poison);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("NaN") && Catch::Contains("epoch 2") && Catch::Contains("checkpoints"));
  }
  const auto last = trainer::load_checkpoint(d / "run" / "checkpoints/last.pt");
  CHECK(last.epoch == 1);
  for (const auto& [name, t] : last.model) {
    INFO(name);
    CHECK(at::isfinite(t).all().item<bool>());
  }
  CHECK(epoch_lines(d / "run" / "metrics.jsonl").size() == 1);
}

TEST_CASE("invalid hyperparameters are refused before any data is read", "[trainer][train]") {
  const fs::path nowhere = fs::temp_directory_path() / "melforge-no-such-dataset";
  auto c = tiny_config(nowhere, nowhere / "run", 2);
  const int which = GENERATE(range(0, 18));
  CAPTURE(which);
  switch (which) {
    case 0: c.train.epochs = 0; break;
    case 1: c.train.amp = "fp8"; break;
    case 2: c.train.bce_weight = -1; break;
    case 3: c.train.pos_weight = "-2"; break;
    case 4: c.train.pos_weight = "lots"; break;
    case 5: c.train.best_metric = "val_speed"; break;
    case 6: c.train.patience = -1; break;
    case 7: c.loader.batch_size = 0; break;
    case 8: c.optim.lr = -1; break;
    case 9: c.optim.accumulate = 0; break;
    case 10: c.runtime.device = "tpu"; break;
    case 11: c.train.out.clear(); break;
    case 12: c.data.data.clear(); break;
    case 13: c.model.dropout = 1.0; break;
    case 14: c.view.view = "clips"; break;
    case 15: c.view.view = "slices"; break;
    case 16: c.view.min_real = 1.5; break;
    case 17: c.view.crop_seconds = -1; break;
  }
  std::ostringstream log;
  CHECK_THROWS_AS(trainer::train(c, log), InvalidArgument);
}

TEST_CASE("bad datasets and run folders get clear errors", "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;

  SECTION("a positive class that does not exist") {
    auto c = tiny_config(data, d / "run", 1);
    c.train.positive_class = "leak";
    CHECK_THROWS_WITH(trainer::train(c, log),
                      Catch::Contains("leak") && Catch::Contains("class0, class1, class2"));
    CHECK_FALSE(fs::exists(d / "run" / "config.json"));
  }
  SECTION("an empty split") {
    const fs::path only_train =
        test::build_tone_dataset(d.path(), 3, 3, "train-only", [](builder::BuildConfig& b) { b.build.split = "1,0,0"; });
    CHECK_THROWS_AS(trainer::train(tiny_config(only_train, d / "run", 1), log), FormatError);
    CHECK_THROWS_WITH(trainer::train(tiny_config(only_train, d / "run", 1), log), Catch::Contains("empty"));
  }
  SECTION("a missing split") {
    fs::remove(data / "val.h5");
    CHECK_THROWS_WITH(trainer::train(tiny_config(data, d / "run", 1), log), Catch::Contains("val.h5"));
  }
  SECTION("a non-empty run folder without --overwrite") {
    test::write_text(d / "run" / "notes.txt", "mine");
    CHECK_THROWS_WITH(trainer::train(tiny_config(data, d / "run", 1), log),
                      Catch::Contains("not empty") && Catch::Contains("--overwrite"));
    auto c = tiny_config(data, d / "run", 1);
    c.train.overwrite = true;
    trainer::train(c, log);
    CHECK(fs::exists(d / "run" / "report.json"));
    CHECK(fs::exists(d / "run" / "notes.txt"));
  }
  SECTION("resuming on a dataset the checkpoint does not fit") {
    auto c = tiny_config(data, d / "run", 2);
    trainer::TrainHooks stop;
    stop.on_epoch_end = [](int64_t) { return false; };
    trainer::train(c, log, stop);
    const fs::path other =
        test::build_tone_dataset(d.path(), 3, 3, "n_mels16", [](builder::BuildConfig& b) { b.mel.n_mels = 16; });
    trainer::TrainConfig r;
    r.train.resume = d / "run";
    r.data.data = other;
    r.given = {"data"};
    r.runtime.log_level = "warn";
    CHECK_THROWS_WITH(trainer::train(r, log), Catch::Contains("differs from the one") &&
                                                  Catch::Contains("--allow-dataset-change"));
    r.train.allow_dataset_change = true;
    CHECK_THROWS_WITH(trainer::train(r, log), Catch::Contains("does not fit") && Catch::Contains("n_mels"));
  }
  SECTION("fp16 without a CUDA device") {
    if (torch::cuda::is_available()) return;
    auto c = tiny_config(data, d / "run", 1);
    c.train.amp = "fp16";
    CHECK_THROWS_AS(trainer::train(c, log), InvalidArgument);
  }
}

TEST_CASE("eval scores a checkpoint as the run's report did, and refuses a dataset it does not fit",
          "[trainer][train][eval]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 4);
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(tiny_config(data, d / "run", 3), log);
  REQUIRE(r.test.has_value());
  trainer::EvalCommandOptions e;
  e.checkpoint = d / "run" / "checkpoints" / "best.pt";
  e.out = d / "eval.json";
  trainer::DataOptions data_opts;
  data_opts.data = data;
  trainer::EvalOptions eval;
  trainer::RuntimeOptions runtime;
  runtime.log_level = "warn";
  std::ostringstream out;
  const nlohmann::json report = trainer::run_eval(e, data_opts, eval, runtime, out, log);
  CHECK(report["tiles"]["accuracy"].get<double>() == r.test->segment.accuracy);
  CHECK(report["file"]["accuracy"].get<double>() == r.test->file.accuracy);
  CHECK(read_json(d / "eval.json")["split"] == "test");
  CHECK_THAT(out.str(), Catch::Contains("accuracy"));

  const fs::path two_classes = test::build_tone_dataset(d.path(), 2, 4, "two");
  data_opts.data = two_classes;
  CHECK_THROWS_WITH(trainer::run_eval(e, data_opts, eval, runtime, out, log),
                    Catch::Contains("does not fit") && Catch::Contains("class2"));
  const fs::path hop =
      test::build_tone_dataset(d.path(), 3, 4, "hop", [](builder::BuildConfig& b) { b.mel.hop_length = 128; });
  data_opts.data = hop;
  CHECK_THROWS_WITH(trainer::run_eval(e, data_opts, eval, runtime, out, log), Catch::Contains("hop_length"));
}

TEST_CASE("bf16 autocast with SpecAugment trains on the CPU", "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  auto c = tiny_config(data, d / "run", 2);
  c.train.amp = "bf16";
  c.augment.time_masks = 2;
  c.augment.time_width = 4;
  c.augment.freq_masks = 1;
  c.augment.freq_width = 3;
  std::ostringstream log;
  const auto r = trainer::train(c, log);
  REQUIRE(r.test.has_value());
  const auto lines = epoch_lines(d / "run" / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  CHECK(std::isfinite(lines[1]["train_loss"].get<double>()));
  const auto config = read_json(d / "run" / "config.json");
  CHECK(config["train"]["amp"] == "bf16");
  CHECK(config["augment"]["time_masks"] == 2);
  CHECK(config["augment"]["freq_width"] == 3);
}

TEST_CASE("profile-steps writes a Chrome trace with the training ranges", "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  auto c = tiny_config(data, d / "run", 1);
  c.train.profile_steps = 2;
  std::ostringstream log;
  trainer::train(c, log);
  REQUIRE(fs::is_regular_file(d / "run" / "trace.json"));
  const auto trace = read_json(d / "run" / "trace.json");
  REQUIRE(trace.contains("traceEvents"));
  std::set<std::string> names;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  for (const char* n : {"forward", "backward", "optimizer"}) {
    INFO(n);
    CHECK(names.count(n) == 1);
  }
}

TEST_CASE("bench times the data pipeline, the training step and the evaluation", "[trainer][train][bench]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  auto c = tiny_config(data, {}, 1);
  trainer::BenchOptions b;
  b.steps = 3;
  b.warmup = 1;
  b.out = d / "bench.json";
  std::ostringstream out, log;
  const nlohmann::json j = trainer::run_bench(c, b, out, log);
  for (const char* k : {"data_pipeline", "train_step", "evaluation"}) {
    INFO(k);
    REQUIRE(j.contains(k));
  }
  CHECK(j["data_pipeline"]["samples_per_s"].get<double>() > 0);
  CHECK(j["data_pipeline"]["batches"] == 3);
  CHECK(j["train_step"]["samples_per_s"].get<double>() > 0);
  CHECK(j["evaluation"]["files_per_s"].get<double>() > 0);
  CHECK(read_json(d / "bench.json")["train_step"]["steps"] == 3);
  CHECK_THAT(out.str(), Catch::Contains("samples/s") && Catch::Contains("files/s"));
}

TEST_CASE("CUDA training: fp16 with loss scaling on a resident split, and a captured step with and without it",
          "[trainer][train][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  struct Case {
    const char* amp;
    bool graph;
    int64_t gpu_mem;
  };
  // The captured step with the default loader (prefetch thread on, batches copied from pinned memory while the
  // step is captured and replayed) and with the device-resident split; fp16 (no graph) on the resident split.
  const Case cases[] = {{"fp16", false, 64}, {"bf16", true, 0}, {"bf16", true, 64}};
  const Case& k = cases[GENERATE(0, 1, 2)];
  CAPTURE(k.amp, k.graph, k.gpu_mem);
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 6);
  auto c = tiny_config(data, d / "run", 6);
  c.runtime.device = "cuda";
  c.runtime.log_level = "info";
  c.train.amp = k.amp;
  c.train.cuda_graph = k.graph;
  c.train.channels_last = true;
  c.loader.prefetch = trainer::LoaderOptions{}.prefetch;
  c.loader.gpu_mem = k.gpu_mem;
  std::ostringstream log;
  const auto r = trainer::train(c, log);
  INFO(log.str());
  REQUIRE(r.test.has_value());
  CHECK(r.test->segment.accuracy >= 0.9);
  CHECK((log.str().find("captured the training step in a CUDA Graph") != std::string::npos) == k.graph);
  CHECK((log.str().find("train split resident on cuda") != std::string::npos) == (k.gpu_mem > 0));
}

TEST_CASE("a run configuration survives its JSON round trip", "[trainer][train]") {
  trainer::TrainConfig c = tiny_config("/data/set", "/runs/a", 7);
  c.model.model = "crnn";
  c.model.rnn = "lstm";
  c.optim.lr = 0.0125;
  c.optim.accumulate = 3;
  c.loader.drop_last = true;
  c.augment.time_masks = 2;
  c.eval.vote = "majority";
  c.train.amp = "bf16";
  c.train.positive_class = "class1";
  c.train.pos_weight = "2.5";
  c.train.best_metric = "val_loss";
  c.data.stream.stream = "on";
  c.data.stream.h5_cache = 9;
  c.loader.stream_window = 12.5;
  const nlohmann::json j = c.to_json();
  const trainer::TrainConfig back = trainer::TrainConfig::from_json(j);
  CHECK(back.to_json() == j);
  CHECK(back.model.rnn == "lstm");
  CHECK(back.optim.accumulate == 3);
  CHECK(back.train.pos_weight == "2.5");
  CHECK(back.data.data == fs::path("/data/set"));
  CHECK(back.data.stream.stream == "on");
  CHECK(back.data.stream.h5_cache == 9);
  CHECK(back.loader.stream_window == 12.5);
  nlohmann::json bad = j;
  bad["optim"]["lr"] = "fast";
  CHECK_THROWS_AS(trainer::TrainConfig::from_json(bad), FormatError);
}

}  // namespace melforge_test_trainer_train
