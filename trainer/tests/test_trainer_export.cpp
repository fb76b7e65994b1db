// export: the state dict file holds the checkpoint's weights (CPU, contiguous) under the module's names, the JSON
// beside it the model configuration; Python (the venv torch, python/melforge/models.py loaded by path through
// tools/check_export.py) loads both and reproduces the C++ outputs within 1e-5.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include "melforge_test_paths.h"
#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "catch_torch.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <fstream>
#include <set>
#include <sstream>

#include "export/export.h"
#include "export_check.h"
#include "melforge/common/errors.h"
#include "models/cnn.h"
#include "reliability/child_process.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "test_skip.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_export {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::check_export_in_python;
using melforge::test::TempDir;
using melforge::test::venv_python;
namespace fs = std::filesystem;

namespace {

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A checkpoint of a seeded CNN (with a non-trivial input normalisation) at `path`. time_pool flatten: as a
/// checkpoint from before the field was written (model_config without "time_pool").
std::shared_ptr<CnnNetImpl> seeded_checkpoint(const fs::path& path, uint64_t seed,
                                              const std::string& time_pool = "mean_max") {
  at::manual_seed(seed);
  CnnConfig c;
  c.n_mels = 16;
  c.n_frames = 12;
  c.num_classes = 4;
  c.hidden = 24;
  c.time_pool = time_pool;
  auto model = std::make_shared<CnnNetImpl>(c);
  model->set_input_normalization(-40.0, 12.5);
  Checkpoint ck;
  ck.version = kCheckpointVersion;
  ck.model_config = model->config_json();
  if (time_pool == "flatten") ck.model_config.erase("time_pool");
  ck.mel = {{"sample_rate", 8000}, {"n_mels", 16}};
  ck.class_names = {"a", "b", "c", "d"};
  ck.positive_class = "c";
  ck.positive_index = 2;
  ck.epoch = 9;
  ck.model = state_dict(*model);
  ck.optimizer = {{"state.0.exp_avg", at::ones({3})}};
  save_checkpoint(ck, path);
  return model;
}

}  // namespace

TEST_CASE("export writes the checkpoint's weights and configuration", "[trainer][export]") {
  TempDir d;
  auto model = seeded_checkpoint(d / "ck.pt", 3);
  ExportOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.out = d / "weights.pt";
  std::ostringstream out;
  run_export(opts, out);
  CHECK_THAT(out.str(), Catch::Contains("weights.pt") && Catch::Contains("weights.pt.json"));
  CHECK_FALSE(fs::exists(d / "weights.pt.tmp"));

  const c10::IValue v = torch::jit::pickle_load(read_bytes(d / "weights.pt"));
  REQUIRE(v.isGenericDict());
  const TensorMap expected = state_dict(*model);
  std::size_t n = 0;
  for (const auto& item : v.toGenericDict()) {
    const std::string name = item.key().toStringRef();
    CAPTURE(name);
    REQUIRE(expected.count(name));
    const at::Tensor t = item.value().toTensor();
    CHECK(t.device().is_cpu());
    CHECK(t.is_contiguous());
    CHECK(t.scalar_type() == expected.at(name).scalar_type());
    CHECK(at::equal(t, expected.at(name)));
    ++n;
  }
  CHECK(n == expected.size());

  std::ifstream jf(d / "weights.pt.json");
  const auto j = nlohmann::json::parse(jf);
  CHECK(j["model_config"] == model->config_json());
  CHECK(j["class_names"] == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(j["positive_class"] == "c");
  CHECK(j["mel"]["sample_rate"] == 8000);

  opts.checkpoint = d / "missing.pt";
  CHECK_THROWS_AS(run_export(opts, out), IoError);
  opts.checkpoint.clear();
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  opts.checkpoint = d / "ck.pt";
  opts.out = d / "no/such/dir/weights.pt";
  CHECK_THROWS_AS(run_export(opts, out), IoError);
  CHECK_FALSE(fs::exists(d / "no"));
}

TEST_CASE("Python loads the export into python/melforge/models.py and reproduces the outputs",
          "[trainer][export][python]") {
  const std::string python = venv_python();
  if (python.empty()) {
    MELFORGE_SKIP("the torch venv of tools/setup_torch.sh is not installed (run bash tools/setup_torch.sh)");
  }
  // mean_max with padded rows (5, 1 and 9 of 12 frames real, random values after them); flatten (a checkpoint
  // from before time_pool) with full rows.
  const std::string time_pool = GENERATE("mean_max", "flatten");
  CAPTURE(time_pool);
  TempDir d;
  auto model = seeded_checkpoint(d / "ck.pt", 17, time_pool);
  ExportOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.out = d / "weights.pt";
  std::ostringstream out;
  run_export(opts, out);

  at::manual_seed(4);
  const at::Tensor x = at::randn({5, 16, 12}) * 12.5 - 40.0;
  const at::Tensor lengths =
      time_pool == "flatten" ? at::full({5}, 12, at::kLong) : at::tensor(std::vector<int64_t>{12, 5, 1, 9, 12}, at::kLong);
  model->eval();
  c10::NoGradGuard no_grad;
  const ModelOutput y = model->forward(x, lengths);
  std::string output;
  const int rc = check_export_in_python(python, d / "weights.pt", x,
                                        {{"logits", y.logits}, {"detection", y.detection}}, output, lengths);
  INFO(output);
  CHECK(rc == 0);
  CHECK_THAT(output, Catch::Contains("ok:") && Catch::Contains("(with lengths)"));

  // The comparison can fail: other weights give other outputs.
  std::string output2;
  CHECK(check_export_in_python(python, d / "weights.pt", x, {{"logits", y.logits + 1e-3}, {"detection", y.detection}},
                               output2) == 1);
  CHECK_THAT(output2, Catch::Contains("logits"));
}

namespace {

/// The whole file `p` as a string.
std::string read_text(const fs::path& p) {
  const std::vector<char> bytes = read_bytes(p);
  return std::string(bytes.begin(), bytes.end());
}

/// The names in folder `dir`.
std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("export writes the weights and their JSON both or neither", "[trainer][export]") {
  TempDir d;
  seeded_checkpoint(d / "ck.pt", 3);
  const fs::path weights = d / "weights.pt";
  const fs::path json = d / "weights.pt.json";

  SECTION("the .json path is a folder") {
    fs::create_directories(json / "inside");
    ExportOptions opts;
    opts.checkpoint = d / "ck.pt";
    opts.out = weights;
    std::ostringstream out;
    CHECK_THROWS_WITH(run_export(opts, out), Catch::Contains(json.string()) && Catch::Contains("is a folder"));
    CHECK(names_in(d.path()) == std::set<std::string>{"ck.pt", "weights.pt.json"});
  }

  SECTION("a file size limit fails the .json write, over a previous export") {
    // The limit lies between the sizes of the two files, so that weights.pt could be written and its .json not.
    Checkpoint ck = load_checkpoint(d / "ck.pt");
    ck.mel["note"] = std::string(400000, 'n');
    save_checkpoint(ck, d / "big.pt");
    const std::vector<std::string> args = {MELFORGE_TRAIN_EXE, "export", "--checkpoint", (d / "big.pt").string(),
                                           "--out"};
    std::vector<std::string> ref_args = args;
    ref_args.push_back((d / "ref.pt").string());
    REQUIRE(test::run_child(ref_args, d / "ref.log").exit_code == 0);
    const auto weights_size = fs::file_size(d / "ref.pt");
    const auto json_size = fs::file_size(d / "ref.pt.json");
    REQUIRE(weights_size < json_size / 2);

    test::write_text(weights, "previous weights");
    test::write_text(json, "previous json");
    std::vector<std::string> failing = args;
    failing.push_back(weights.string());
    test::ChildOptions limit;
    limit.file_size_limit = json_size / 2;
    const auto r = test::run_child(failing, d / "failing.log", limit);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains(json.string()) && Catch::Contains("File too large") &&
                             Catch::Contains("nothing was replaced"));
    CHECK(read_text(weights) == "previous weights");
    CHECK(read_text(json) == "previous json");
    CHECK(names_in(d.path()) == std::set<std::string>{"ck.pt", "big.pt", "ref.pt", "ref.pt.json", "ref.log",
                                                      "failing.log", "weights.pt", "weights.pt.json"});
  }
}

namespace {

/// A Python package folder for `python -m melforge.onnx_export` in the torch venv (which has torch and onnx but not
/// the melforge wheel): `<dir>/melforge/` with an empty __init__.py and the source's models.py and onnx_export.py
/// (the only files of the package that module imports).
fs::path onnx_package(const fs::path& dir) {
  const fs::path pkg = dir / "melforge";
  fs::create_directories(pkg);
  test::write_text(pkg / "__init__.py", "");
  const fs::path src = fs::path(MELFORGE_SOURCE_DIR) / "python" / "melforge";
  for (const char* name : {"models.py", "onnx_export.py"}) fs::copy_file(src / name, pkg / name);
  return dir;
}

/// Sets PYTHONPATH for its lifetime (the export's Python child inherits it), then restores it.
struct PythonPath {
  explicit PythonPath(const fs::path& dir) {
    if (const char* v = std::getenv("PYTHONPATH")) old = v;
    ::setenv("PYTHONPATH", dir.c_str(), 1);
  }
  ~PythonPath() {
    if (old) ::setenv("PYTHONPATH", old->c_str(), 1);
    else ::unsetenv("PYTHONPATH");
  }
  std::optional<std::string> old;
};

}  // namespace

TEST_CASE("export --onnx writes the ONNX model through Python", "[trainer][export][python]") {
  const std::string python = venv_python();
  if (python.empty()) {
    MELFORGE_SKIP("the torch venv of tools/setup_torch.sh is not installed (run bash tools/setup_torch.sh)");
  }
  TempDir d;
  seeded_checkpoint(d / "ck.pt", 5);
  ExportOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.out = d / "weights.pt";
  opts.onnx = d / "model.onnx";
  opts.python = python;
  const PythonPath path(onnx_package(d / "py"));
  std::ostringstream out;
  run_export(opts, out);
  INFO(out.str());
  CHECK_THAT(out.str(), Catch::Contains("wrote " + opts.onnx.string()) && Catch::Contains("output scores"));
  CHECK_FALSE(fs::exists(d / "model.onnx.partial"));
  std::string output;
  const int rc = test::run_command("'" + python + "' -c 'import onnx, sys; m = onnx.load(sys.argv[1]); "
                                   "onnx.checker.check_model(m); print([i.name for i in m.graph.input], "
                                   "[o.name for o in m.graph.output])' '" + opts.onnx.string() + "'", output);
  INFO(output);
  CHECK(rc == 0);
  CHECK_THAT(output, Catch::Contains("['x', 'lengths'] ['scores']"));
}

TEST_CASE("export --onnx refuses a Python without onnx or melforge before writing anything", "[trainer][export]") {
  TempDir d;
  seeded_checkpoint(d / "ck.pt", 5);
  std::string probe;
  REQUIRE(test::run_command("/usr/bin/python3 -c 'import onnx'", probe) != 0);
  ExportOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.out = d / "weights.pt";
  opts.onnx = d / "model.onnx";
  opts.python = "/usr/bin/python3";
  std::ostringstream out;
  CHECK_THROWS_AS(run_export(opts, out), InvalidArgument);
  CHECK_THROWS_WITH(run_export(opts, out), Catch::Contains("--python /usr/bin/python3 cannot import") &&
                                               Catch::Contains("onnx") &&
                                               Catch::Contains("pip install onnx onnxscript"));
  opts.python = (d / "no-such-python").string();
  CHECK_THROWS_WITH(run_export(opts, out), Catch::Contains("no-such-python") && Catch::Contains("cannot run"));
  opts.python = "python3";
  opts.onnx = d / "weights.pt.json";
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  CHECK(names_in(d.path()) == std::set<std::string>{"ck.pt"});

  // The command line: exit 2, nothing written.
  const auto r = test::run_child({MELFORGE_TRAIN_EXE, "export", "--checkpoint", (d / "ck.pt").string(), "--out",
                                  (d / "weights.pt").string(), "--onnx", (d / "model.onnx").string(), "--python",
                                  "/usr/bin/python3"},
                                 d / "cli.log");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("pip install onnx onnxscript"));
  CHECK(names_in(d.path()) == std::set<std::string>{"ck.pt", "cli.log"});

  const std::string python = venv_python();
  if (!python.empty()) {  // torch and onnx, but no melforge on its path
    opts.python = python;
    opts.onnx = d / "model.onnx";
    CHECK_THROWS_WITH(run_export(opts, out), Catch::Contains("cannot import melforge"));
  }
}

}  // namespace melforge_test_trainer_export
