// Checkpoints: every field round trips bit-exactly, damaged or foreign files are refused with a FormatError, a
// failed write leaves nothing behind, state dicts move between models by name, and Python's torch.load (weights_only,
// the default) reads the file.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include "melforge_test_paths.h"
#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "catch_torch.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "melforge/common/errors.h"
#include "models/cnn.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "cli.h"
#include "eval/evaluate.h"
#include "train/setup.h"
#include <nlohmann/json.hpp>
#include <sstream>
#include "venv_python.h"
#include "test_skip.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_checkpoint {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::run_command;
using melforge::test::TempDir;
using melforge::test::venv_python;
namespace fs = std::filesystem;

namespace {

Checkpoint sample_checkpoint() {
  at::manual_seed(11);
  Checkpoint c;
  c.version = kCheckpointVersion;
  c.model_config = {{"model", "cnn"}, {"n_mels", 32}, {"channels", {16, 32, 64}}, {"dropout", 0.3}};
  c.config = {{"train", {{"lr", 0.001}, {"epochs", 3}}}, {"name", "résumé ✓"}};
  c.mel = {{"sample_rate", 8000}, {"f_max", 4000.0}, {"log", "db"}};
  c.class_names = {"dog", "cat", "bird song"};
  c.positive_class = "cat";
  c.positive_index = 1;
  c.epoch = 7;
  c.step = int64_t{1} << 40;
  c.model = {{"conv1.weight", at::randn({4, 1, 3, 3})}, {"conv1.bias", at::randn({4})},
             {"bn.num_batches_tracked", at::tensor(int64_t{5})}};
  c.optimizer = {{"state.0.exp_avg", at::randn({4, 1, 3, 3}, at::kDouble)}, {"step", at::tensor(3.0f)}};
  c.scaler = {{"scale", at::tensor(65536.0f)}, {"growth_tracker", at::tensor(int64_t{2}, at::kInt)}};
  c.scheduler = {{"base_lr", 0.001}, {"warmup", 10}};
  c.rng_state = at::randint(0, 256, {5056}, at::kByte);
  c.cuda_rng_state = at::randint(0, 256, {16}, at::kByte);
  c.state = {{"best_metric", 0.75}, {"best_epoch", 5}, {"sampler", {1, 2, 3}}};
  return c;
}

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.scalar_type() == b.scalar_type() &&
                                                         a.sizes() == b.sizes() && at::equal(a, b)));
}

void check_maps(const TensorMap& a, const TensorMap& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    CAPTURE(name);
    REQUIRE(b.count(name));
    CHECK(bit_equal(t, b.at(name)));
  }
}

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no exception of the expected type");
  return {};
}

void write_bytes(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The checkpoint's dict with `edit` applied, written to `p`.
template <typename F>
void write_edited(const Checkpoint& c, const fs::path& p, F&& edit) {
  const fs::path tmp = p.string() + ".orig";
  save_checkpoint(c, tmp);
  c10::IValue v = torch::jit::pickle_load(read_bytes(tmp));
  c10::impl::GenericDict d = v.toGenericDict();
  edit(d);
  write_bytes(p, torch_save_bytes(c10::IValue(d)));
}

CnnConfig small_cnn(int64_t hidden = 16) {
  CnnConfig c;
  c.n_mels = 8;
  c.n_frames = 8;
  c.num_classes = 3;
  c.channels = {2, 3, 4};
  c.hidden = hidden;
  return c;
}

}  // namespace

TEST_CASE("a checkpoint round trips every field bit-exactly", "[trainer][checkpoint]") {
  TempDir d;
  const Checkpoint c = sample_checkpoint();
  save_checkpoint(c, d / "ck.pt");
  CHECK_FALSE(fs::exists(d / "ck.pt.tmp"));
  const Checkpoint r = load_checkpoint(d / "ck.pt");
  CHECK(r.version == c.version);
  CHECK(r.model_config == c.model_config);
  CHECK(r.config == c.config);
  CHECK(r.mel == c.mel);
  CHECK(r.class_names == c.class_names);
  CHECK(r.positive_class == c.positive_class);
  CHECK(r.positive_index == c.positive_index);
  CHECK(r.epoch == c.epoch);
  CHECK(r.step == c.step);
  check_maps(r.model, c.model);
  check_maps(r.optimizer, c.optimizer);
  check_maps(r.scaler, c.scaler);
  CHECK(r.scheduler == c.scheduler);
  CHECK(bit_equal(r.rng_state, c.rng_state));
  CHECK(bit_equal(r.cuda_rng_state, c.cuda_rng_state));
  CHECK(r.state == c.state);

  Checkpoint empty = c;
  empty.optimizer.clear();
  empty.rng_state = at::Tensor();
  empty.cuda_rng_state = at::Tensor();
  save_checkpoint(empty, d / "ck.pt");
  const Checkpoint e = load_checkpoint(d / "ck.pt");
  CHECK(e.optimizer.empty());
  CHECK_FALSE(e.rng_state.defined());
  CHECK_FALSE(e.cuda_rng_state.defined());
}

TEST_CASE("model_config is a pickled dict, and version 1's JSON string still reads", "[trainer][checkpoint]") {
  TempDir d;
  const Checkpoint c = sample_checkpoint();
  save_checkpoint(c, d / "ck.pt");
  const c10::IValue root = torch::jit::pickle_load(read_bytes(d / "ck.pt"));
  const c10::IValue mc = root.toGenericDict().at("model_config");
  REQUIRE(mc.isGenericDict());
  CHECK(mc.toGenericDict().at("model").toStringRef() == "cnn");
  CHECK(mc.toGenericDict().at("n_mels").toInt() == 32);
  CHECK(mc.toGenericDict().at("dropout").toDouble() == 0.3);
  CHECK(mc.toGenericDict().at("channels").toListRef().size() == 3);
  CHECK(root.toGenericDict().at("version").toInt() == kCheckpointVersion);

  write_edited(c, d / "v1.pt", [&c](auto& dict) {
    dict.insert_or_assign("version", int64_t{1});
    dict.insert_or_assign("model_config", c.model_config.dump());
  });
  const Checkpoint old = load_checkpoint(d / "v1.pt");
  CHECK(old.version == 1);
  CHECK(old.model_config == c.model_config);
  write_edited(c, d / "bad.pt", [](auto& dict) { dict.insert_or_assign("model_config", int64_t{4}); });
  CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "bad.pt"); }),
             Catch::Contains("model_config") && Catch::Contains("not a dict or a JSON string"));
}

TEST_CASE("the generator state restored from a checkpoint replays the same numbers", "[trainer][checkpoint]") {
  TempDir d;
  Checkpoint c = sample_checkpoint();
  at::manual_seed(123);
  at::randn({10});
  c.rng_state = at::detail::getDefaultCPUGenerator().get_state();
  const at::Tensor expected = at::randn({100});
  save_checkpoint(c, d / "ck.pt");
  at::manual_seed(999);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(load_checkpoint(d / "ck.pt").rng_state);
  CHECK(at::equal(at::randn({100}), expected));
}

TEST_CASE("truncated, random and foreign files are refused with a FormatError", "[trainer][checkpoint]") {
  TempDir d;
  save_checkpoint(sample_checkpoint(), d / "ck.pt");
  const std::vector<char> bytes = read_bytes(d / "ck.pt");
  REQUIRE(bytes.size() > 1000);

  SECTION("truncated") {
    const double keep = GENERATE(0.0, 0.1, 0.5, 0.9, 0.999);
    CAPTURE(keep);
    write_bytes(d / "t.pt", std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() * keep)));
    CHECK_THROWS_AS(load_checkpoint(d / "t.pt"), FormatError);
  }
  SECTION("random bytes") {
    std::mt19937 rng(5);
    std::vector<char> junk(bytes.size());
    for (auto& b : junk) b = static_cast<char>(rng());
    write_bytes(d / "r.pt", junk);
    CHECK_THROWS_AS(load_checkpoint(d / "r.pt"), FormatError);
  }
  SECTION("a pickled tensor, not a dict") {
    write_bytes(d / "x.pt", torch::jit::pickle_save(c10::IValue(at::ones({3}))));
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "x.pt"); }),
               Catch::Contains("not a melforge checkpoint"));
  }
  SECTION("a dict without the format tag") {
    write_edited(sample_checkpoint(), d / "f.pt", [](auto& dict) { static_cast<void>(dict.erase("format")); });
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "f.pt"); }),
               Catch::Contains("not a melforge checkpoint"));
  }
  SECTION("another version") {
    write_edited(sample_checkpoint(), d / "v.pt", [](auto& dict) { dict.insert_or_assign("version", int64_t{3}); });
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "v.pt"); }), Catch::Contains("version 3"));
    write_edited(sample_checkpoint(), d / "v0.pt", [](auto& dict) { dict.insert_or_assign("version", int64_t{0}); });
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "v0.pt"); }), Catch::Contains("version 0"));
  }
  SECTION("a missing entry") {
    const std::string key = GENERATE("epoch", "model", "rng_state", "class_names", "mel");
    write_edited(sample_checkpoint(), d / "m.pt", [&](auto& dict) { static_cast<void>(dict.erase(key)); });
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "m.pt"); }),
               Catch::Contains("missing entry '" + key + "'"));
  }
  SECTION("an entry of the wrong type") {
    const std::string key = GENERATE("epoch", "model", "config", "class_names", "rng_state");
    write_edited(sample_checkpoint(), d / "w.pt",
                 [&](auto& dict) { dict.insert_or_assign(key, c10::IValue(std::string("{"))); });
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "w.pt"); }), Catch::Contains("'" + key + "'"));
  }
  SECTION("a tensor map holding a non-tensor") {
    write_edited(sample_checkpoint(), d / "n.pt", [&](auto& dict) {
      c10::impl::GenericDict m(c10::StringType::get(), c10::AnyType::get());
      m.insert("w", int64_t{3});
      dict.insert_or_assign("model", m);
    });
    CHECK_THAT(error_of<FormatError>([&] { load_checkpoint(d / "n.pt"); }), Catch::Contains("model.w"));
  }
  CHECK_THROWS_AS(load_checkpoint(d / "missing.pt"), IoError);
}

TEST_CASE("a failed write leaves neither the file nor the temporary file", "[trainer][checkpoint]") {
  TempDir d;
  SECTION("missing folder") {
    const fs::path p = d / "no/such/folder/ck.pt";
    CHECK_THAT(error_of<IoError>([&] { save_checkpoint(sample_checkpoint(), p); }), Catch::Contains(p.string()));
    CHECK_FALSE(fs::exists(p));
    CHECK_FALSE(fs::exists(p.string() + ".tmp"));
  }
  SECTION("the final path is a non-empty folder: the rename fails after the temporary file was written") {
    const fs::path p = d / "ck.pt";
    test::write_text(p / "keep.txt", "x");
    CHECK_THROWS_AS(save_checkpoint(sample_checkpoint(), p), IoError);
    CHECK(fs::is_directory(p));
    CHECK(fs::exists(p / "keep.txt"));
    CHECK_FALSE(fs::exists(p.string() + ".tmp"));
  }
  SECTION("an existing checkpoint is replaced whole") {
    const fs::path p = d / "ck.pt";
    Checkpoint c = sample_checkpoint();
    save_checkpoint(c, p);
    c.epoch = 8;
    save_checkpoint(c, p);
    CHECK(load_checkpoint(p).epoch == 8);
    CHECK_FALSE(fs::exists(p.string() + ".tmp"));
  }
}

TEST_CASE("state dicts move between models by name", "[trainer][checkpoint]") {
  at::manual_seed(1);
  CnnNetImpl a(small_cnn());
  at::manual_seed(2);
  CnnNetImpl b(small_cnn());
  const TensorMap sa = state_dict(a);
  std::vector<std::string> names;
  for (const auto& item : a.named_parameters(true)) names.push_back(item.key());
  for (const auto& item : a.named_buffers(true)) names.push_back(item.key());
  std::sort(names.begin(), names.end());
  CHECK(std::count(names.begin(), names.end(), "conv1.weight") == 1);
  CHECK(std::count(names.begin(), names.end(), "detect_head.bias") == 1);
  std::vector<std::string> got;
  for (const auto& [n, t] : sa) {
    got.push_back(n);
    CHECK(t.device().is_cpu());
    CHECK(t.is_contiguous());
    CHECK_FALSE(t.requires_grad());
  }
  CHECK(got == names);
  // A copy, not a view of the parameters.
  sa.at("fc.bias").add_(1.0);
  CHECK_FALSE(at::equal(sa.at("fc.bias"), a.named_parameters()["fc.bias"]));
  const TensorMap fresh = state_dict(a);

  load_state_dict(b, fresh, "test");
  for (const auto& [n, t] : state_dict(b)) CHECK(at::equal(t, fresh.at(n)));
  a.eval();
  b.eval();
  const at::Tensor x = at::randn({2, 8, 8});
  CHECK(at::equal(a.forward(x).logits, b.forward(x).logits));

  SECTION("a model of another shape") {
    CnnNetImpl wide(small_cnn(32));
    const TensorMap before = state_dict(wide);
    CHECK_THAT(error_of<FormatError>([&] { load_state_dict(wide, fresh, "ck.pt"); }),
               Catch::Contains("ck.pt") && Catch::Contains("class_head.weight") && Catch::Contains("[3, 16]"));
    for (const auto& [n, t] : state_dict(wide)) CHECK(at::equal(t, before.at(n)));
  }
  SECTION("a missing or unexpected entry") {
    TensorMap missing = fresh;
    missing.erase("conv2.bias");
    CHECK_THAT(error_of<FormatError>([&] { load_state_dict(b, missing, "ck.pt"); }),
               Catch::Contains("missing entry 'conv2.bias'"));
    TensorMap extra = fresh;
    extra["rnn.weight_ih_l0"] = at::zeros({3});
    CHECK_THAT(error_of<FormatError>([&] { load_state_dict(b, extra, "ck.pt"); }),
               Catch::Contains("unexpected entry 'rnn.weight_ih_l0'"));
  }
}

TEST_CASE("Python's torch.load reads a checkpoint with weights_only (the default)", "[trainer][checkpoint][python]") {
  const std::string python = venv_python();
  if (python.empty()) {
    MELFORGE_SKIP("the torch venv of tools/setup_torch.sh is not installed (run bash tools/setup_torch.sh)");
  }
  TempDir d;
  Checkpoint c = sample_checkpoint();
  at::manual_seed(3);
  CnnNetImpl m(small_cnn());
  c.model = state_dict(m);
  save_checkpoint(c, d / "ck.pt");
  std::string out;
  const int rc = run_command("'" + python + "' '" + std::string(MELFORGE_SOURCE_DIR) +
                                 "/tools/check_export.py' checkpoint '" + (d / "ck.pt").string() + "'",
                             out);
  INFO(out);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("conv1.weight") && Catch::Contains("epoch 7"));
}

namespace {

/// The crafted checkpoints of tools/make_hostile_checkpoints.py, made once (from a small CNN's checkpoint) for every
/// command below: the folder and its cases.json.
const std::pair<fs::path, nlohmann::json>& hostile_checkpoints() {
  static TempDir dir;
  static const nlohmann::json cases = [] {
    const std::string python = venv_python();
    REQUIRE_FALSE(python.empty());
    Checkpoint c = sample_checkpoint();
    c.step = 12;
    at::manual_seed(3);
    CnnNetImpl m(small_cnn());
    c.model = state_dict(m);
    c.model_config = m.config_json();
    save_checkpoint(c, dir / "valid.pt");
    std::string out;
    const int rc = run_command("'" + python + "' '" + std::string(MELFORGE_SOURCE_DIR) +
                                   "/tools/make_hostile_checkpoints.py' '" + (dir / "valid.pt").string() + "' '" +
                                   (dir / "hostile").string() + "'",
                               out);
    INFO(out);
    REQUIRE(rc == 0);
    std::ifstream in(dir / "hostile" / "cases.json");
    return nlohmann::json::parse(in);
  }();
  static const std::pair<fs::path, nlohmann::json> both{dir.path(), cases};
  return both;
}

}  // namespace

TEST_CASE("crafted checkpoints are refused by eval, predict and export with exit 1, naming the field",
          "[trainer][checkpoint][untrusted]") {
  const auto& [dir, cases] = hostile_checkpoints();
  const std::string command = GENERATE(as<std::string>{}, "export", "predict", "eval");
  REQUIRE(cases.at("cases").size() >= 9);
  for (const auto& c : cases.at("cases")) {
    const std::string file = c.at("file").get<std::string>();
    std::vector<std::string> args = {"melforge-train", command, "--checkpoint", file};
    if (command == "export") args.insert(args.end(), {"--out", (dir / "out.pt").string()});
    if (command == "predict") args.push_back((dir / "valid.pt").string());
    if (command == "eval") args.insert(args.end(), {"--data", dir.string()});
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    const int code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
    INFO(command << " " << c.at("name").get<std::string>() << ": " << err.str());
    CHECK(code == kExitError);
    CHECK_THAT(err.str(), Catch::Contains(c.at("field").get<std::string>()) && Catch::Contains(file));
    CHECK_THAT(err.str(), !Catch::Contains("--hidden") && !Catch::Contains("--batch-size"));
  }
  CHECK_FALSE(fs::exists(cases.at("payload_marker").get<std::string>()));
  CHECK_FALSE(fs::exists(dir / "out.pt"));
}

TEST_CASE("dataset_changes names what differs between the recorded dataset and this one", "[trainer][untrusted]") {
  const nlohmann::json then = {
      {"train", {{"clips", 24}, {"frames", 960}, {"classes", 2}, {"class_names_fnv1a", "00ff"}, {"build_id", "b1"}}},
      {"val", {{"clips", 6}, {"frames", 240}, {"classes", 2}, {"class_names_fnv1a", "00ff"}, {"build_id", "b1"}}}};
  CHECK(dataset_changes(then, then).empty());
  nlohmann::json now = then;
  now["train"]["clips"] = 300;
  now["val"]["build_id"] = "b2";
  now["test"] = then["val"];
  const std::vector<std::string> changes = dataset_changes(then, now);
  REQUIRE(changes.size() == 3);
  CHECK(changes[0] == "test split: not recorded then");
  CHECK(changes[1] == "train split: 24 clips then, 300 now");
  CHECK(changes[2] == "val split: 'b1' build_id then, 'b2' now");
}

TEST_CASE("beyond 1,000 classes report.json lists the largest confusions instead of the C x C matrix",
          "[trainer][untrusted]") {
  const int64_t classes = GENERATE(int64_t{5}, kMaxFullConfusionClasses + 1);
  std::vector<std::vector<int64_t>> confusion(static_cast<std::size_t>(classes),
                                              std::vector<int64_t>(static_cast<std::size_t>(classes), 0));
  std::vector<std::string> names;
  for (int64_t c = 0; c < classes; ++c) {
    names.push_back("c" + std::to_string(c));
    confusion[c][c] = 3;
  }
  confusion[1][4] = 9;
  confusion[3][2] = 2;
  const Metrics m = metrics::metrics_from_confusion(confusion, {{1, 0}, {0, 1}}, 0.0);
  const nlohmann::json j = metrics_json(m, names);
  CHECK(j.at("per_class").size() == static_cast<std::size_t>(classes));
  if (classes <= kMaxFullConfusionClasses) {
    CHECK(j.at("confusion").size() == static_cast<std::size_t>(classes));
    CHECK_FALSE(j.contains("confusion_top"));
  } else {
    CHECK_FALSE(j.contains("confusion"));
    REQUIRE(j.at("confusion_top").size() == 2);
    CHECK(j["confusion_top"][0] == nlohmann::json({{"true", "c1"}, {"predicted", "c4"}, {"count", 9}}));
    CHECK(j["confusion_top"][1] == nlohmann::json({{"true", "c3"}, {"predicted", "c2"}, {"count", 2}}));
    CHECK_THAT(j.at("confusion_note").get<std::string>(), Catch::Contains("1001 classes"));
  }
}

TEST_CASE("resume of a run folder without last.pt names best.pt and the command to resume from it", "[trainer][untrusted]") {
  TempDir d;
  fs::create_directories(d / "run" / "checkpoints");
  std::ofstream(d / "run" / "checkpoints" / "best.pt") << "x";
  const std::string run = (d / "run").string();
  std::vector<const char*> argv = {"melforge-train", "train", "--resume", run.c_str()};
  std::ostringstream out, err;
  const int code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  INFO(err.str());
  CHECK(code == kExitError);
  CHECK_THAT(err.str(), Catch::Contains("last.pt") && Catch::Contains("--resume " + run + "/checkpoints/best.pt"));
}

}  // namespace melforge_test_trainer_checkpoint
