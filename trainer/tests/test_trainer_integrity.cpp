// Issue 15, the trainer's part: the run-folder lock (two real processes), runs that fail before their first
// checkpoint (a model too large for the memory, an allocation failure), NaN and Inf spectrograms in a dataset,
// non-finite validation metrics, corrupt checkpoints (zip CRC, NaN weights) and a folder given as a checkpoint.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include "melforge_test_paths.h"
#include <caffe2/serialize/inline_container.h>

#include "catch_torch.h"

#include <algorithm>
#include <csignal>
#include <fstream>
#include <limits>
#include <sstream>

#include "cli.h"
#include "data/dataset.h"
#include "melforge/common/h5.h"
#include "models/model.h"
#include "options.h"
#include "reliability/child_process.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/setup.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_integrity {

using namespace melforge;
using melforge::test::TempDir;
using melforge::test::run_in_process;
using melforge::test::with;
namespace fs = std::filesystem;

namespace {

fs::path train_exe() { return MELFORGE_TRAIN_EXE; }

/// The tone dataset (3 classes x 4 files) every test here trains on, built once, and a 1-epoch run on it.
struct Shared {
  TempDir dir;
  fs::path data, run;
  Shared() {
    data = test::build_tone_dataset(dir.path(), 3, 4);
    run = dir / "run";
  }
};

Shared& shared() {
  static Shared s;
  return s;
}

/// `train` of a fresh run on `data` into `out` (the tiny configuration of trainer_fixture.h).
std::vector<std::string> train_args(const fs::path& data, const fs::path& out, int epochs, int64_t hidden = 24) {
  return {train_exe().string(), "train", "--data", data.string(), "--out", out.string(), "--epochs",
          std::to_string(epochs), "--hidden", std::to_string(hidden), "--seed", "42", "--lr", "3e-3", "--batch-size",
          "16", "--patience", "0", "--threads", "2", "--log-level", "warn"};
}

/// `args` with option `name` set to `value` (replaced where it is given, appended otherwise).
std::vector<std::string> set_option(std::vector<std::string> args, const std::string& name, const std::string& value) {
  const auto it = std::find(args.begin(), args.end(), name);
  if (it == args.end() || it + 1 == args.end()) return with(args, {name, value});
  *(it + 1) = value;
  return args;
}

/// The 1-epoch run of the shared dataset (made on first use); its best.pt.
fs::path good_checkpoint() {
  const fs::path best = shared().run / "checkpoints" / "best.pt";
  if (!fs::exists(best)) {
    const auto [code, output] = run_in_process(train_args(shared().data, shared().run, 1));
    INFO(output);
    REQUIRE(code == 0);
  }
  return best;
}

/// A copy of the shared dataset in `dir`.
fs::path copy_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* name : {"train.h5", "val.h5", "test.h5"}) fs::copy_file(shared().data / name, dir / name);
  return dir;
}

/// Writes `value` into the frames of clip `row` of a split file (its third frame, or its last when shorter; mel band 3).
void write_mel_value(const fs::path& file, int64_t row, float value) {
  auto f = h5::open_file(file, true);
  auto offsets = h5::open_dataset(f, "frame_offset");
  std::vector<int64_t> offset(static_cast<std::size_t>(h5::dims(offsets).at(0)));
  REQUIRE(H5Dread(offsets.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offset.data()) >= 0);
  REQUIRE(static_cast<std::size_t>(row + 1) < offset.size());
  const int64_t frame = offset[static_cast<std::size_t>(row)] +
                        std::min<int64_t>(2, offset[static_cast<std::size_t>(row + 1)] - offset[static_cast<std::size_t>(row)] - 1);
  auto ds = h5::open_dataset(f, "frames");
  const hid_t space = H5Dget_space(ds.id());
  const hsize_t start[2] = {static_cast<hsize_t>(frame), 3}, count[2] = {1, 1};
  REQUIRE(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0);
  const hsize_t one = 1;
  const hid_t mem = H5Screate_simple(1, &one, nullptr);
  REQUIRE(H5Dwrite(ds.id(), H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &value) >= 0);
  H5Sclose(mem);
  H5Sclose(space);
}

/// The stored paths of a split file.
std::vector<std::string> split_paths(const fs::path& file) { return h5::read_strings(h5::open_file(file), "path"); }

}  // namespace

TEST_CASE("a second train in a run folder that one is training in is refused at once, naming the folder and the "
          "pid, and the first finishes unchanged", "[trainer][integrity][lock]") {
  TempDir d;
  const fs::path run = d / "run";
  const int epochs = 3;
  const fs::path last = run / "checkpoints" / "last.pt";
  const std::vector<std::vector<std::string>> seconds = {
      {train_exe().string(), "train", "--resume", run.string(), "--threads", "2", "--log-level", "warn"},
      with(train_args(shared().data, run, 1), {"--overwrite"}),
  };
  std::vector<test::ChildResult> refused;
  pid_t first_pid = 0;
  test::ChildOptions opts;
  opts.on_poll = [&](pid_t first) {
    first_pid = first;
    if (!refused.empty() || !fs::exists(last)) return;
    ::kill(first, SIGSTOP);
    REQUIRE(test::wait_until_stopped(first, std::chrono::seconds(10)));
    for (std::size_t i = 0; i < seconds.size(); ++i)
      refused.push_back(test::run_child(seconds[i], d / ("second" + std::to_string(i) + ".log")));
    ::kill(first, SIGCONT);
  };
  const auto first = test::run_child(train_args(shared().data, run, epochs, 256), d / "first.log", opts);
  INFO("first: " << first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(refused.size() == seconds.size());
  for (const auto& r : refused) {
    INFO("second: " << r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.wall_s < 30);
    CHECK_THAT(r.output, Catch::Contains("run folder '" + run.string() + "' is in use by another melforge-train") &&
                             Catch::Contains("(pid " + std::to_string(first_pid) + ")"));
  }
  const auto lines = test::epoch_lines(run / "metrics.jsonl");
  REQUIRE(lines.size() == static_cast<std::size_t>(epochs));
  for (int e = 0; e < epochs; ++e) CHECK(lines[static_cast<std::size_t>(e)]["epoch"] == e + 1);
  CHECK(trainer::load_checkpoint(last).epoch == epochs);
  CHECK(fs::exists(run / "report.json"));
  CHECK_FALSE(fs::exists(run / ".melforge-train.lock"));

  std::ofstream(run / ".melforge-train.lock") << first_pid << "\n";
  const auto [code, output] = run_in_process(with(train_args(shared().data, run, 1), {"--overwrite"}));
  INFO("after the first finished, with its lock file left behind (as after a SIGKILL): " << output);
  CHECK(code == 0);
}

TEST_CASE("a model too large for the memory is refused before any work with exit 2, leaving no run folder",
          "[trainer][integrity][early]") {
  TempDir d;
  const fs::path run = d / "run";
  const auto [code, output] = run_in_process(train_args(shared().data, run, 1, 100000000));
  INFO(output);
  CHECK(code == 2);
  CHECK_THAT(output, Catch::Contains("--hidden") && Catch::Contains("GiB") && Catch::Contains("MemAvailable") &&
                         Catch::Contains("parameters"));
  CHECK_THAT(output, !Catch::Contains("kept") && !Catch::Contains("unexpected"));
  CHECK_FALSE(fs::exists(run));
  const auto [again, again_output] = run_in_process(train_args(shared().data, run, 1));
  INFO(again_output);
  CHECK(again == 0);
}

TEST_CASE("model_size counts exactly the parameters of the model make_model builds", "[trainer][integrity][early]") {
  trainer::MelInfo info;
  info.n_mels = GENERATE(32, 37);
  info.n_frames = 29;
  trainer::ModelOptions opts;
  opts.model = GENERATE("cnn", "crnn");
  opts.rnn = GENERATE("gru", "lstm");
  opts.hidden = 40;
  const auto model = trainer::make_model(opts, info, 5);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  CAPTURE(opts.model, opts.rnn, info.n_mels);
  CHECK(trainer::model_size(opts, info, 5).parameters == static_cast<double>(params));
}

TEST_CASE("an allocation failure in train is one clear line, not a stack trace, and leaves no run folder",
          "[trainer][integrity][early]") {
  const int64_t available = trainer::available_memory_bytes();
  trainer::TrainConfig config = test::tiny_config(shared().data, "unused", 1);
  const trainer::Dataset meta = trainer::load_dataset(shared().data, false);
  config.model.hidden = 1 << 16;
  const double need = trainer::training_memory_bytes(config, meta.info, meta.num_classes(), false);
  if (available >= 0 && need > static_cast<double>(available))
    MELFORGE_SKIP("the test model needs " << need / (1 << 30) << " GiB and only " << available / (1 << 30)
                                          << " GiB are available");
  TempDir d;
  const fs::path run = d / "run";
  const std::vector<std::string> args =
      with({"/usr/bin/prlimit", "--data=800000000", "--"}, train_args(shared().data, run, 1, 1 << 16));
  if (!fs::exists(args[0])) MELFORGE_SKIP("no /usr/bin/prlimit");
  const auto r = test::run_child(args, d / "run.log");
  INFO(r.output);
  CHECK(r.term_signal == 0);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("out of memory") && Catch::Contains("--hidden"));
  CHECK_THAT(r.output, !Catch::Contains("unexpected") && !Catch::Contains("frame #"));
  CHECK_FALSE(fs::exists(run));
}

TEST_CASE("NaN and Inf spectrograms are refused where they are read, naming split, file and row, with exit 1, and "
          "inspect reports them", "[trainer][integrity][data]") {
  TempDir d;
  const std::string split = GENERATE("train", "val", "test");
  const float value = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity());
  const std::string stream = GENERATE("off", "on");
  CAPTURE(split, value, stream);
  const fs::path data = copy_dataset(d / "data");
  const fs::path file = data / (split + ".h5");
  const int64_t row = 1;
  write_mel_value(file, row, value);
  const std::string name = split_paths(file).at(row);
  const std::vector<std::string> named = {file.string(), "split '" + split + "'", "row 1", "file " + name,
                                          std::isnan(value) ? "NaN" : "infinite"};
  {
    const fs::path run = d / "run";
    const auto [code, output] = run_in_process(with(train_args(data, run, 1), {"--stream", stream}));
    INFO(output);
    CHECK(code == 1);
    for (const auto& part : named) CHECK_THAT(output, Catch::Contains(part));
    CHECK_THAT(output, !Catch::Contains("normalisation"));
  }
  const auto [code, output] = run_in_process({"melforge-train", "inspect", "--data", data.string(), "--stream", stream});
  INFO("inspect: " << output);
  CHECK(code == 1);
  for (const auto& part : named) CHECK_THAT(output, Catch::Contains(part));
}

TEST_CASE("a model that diverges in the first epoch: the validation loss is an error naming the split and the file, "
          "not a missing best.pt", "[trainer][integrity][metrics]") {
  TempDir d;
  const fs::path run = d / "run";
  const std::string metric = GENERATE("val_loss", "val_macro_f1");
  CAPTURE(metric);
  std::vector<std::string> args = train_args(shared().data, run, 2);
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"--lr", "1e30"}, {"--warmup", "0"}, {"--batch-size", "4096"}, {"--best-metric", metric}})
    args = set_option(args, name, value);
  const auto [code, output] = run_in_process(args);
  INFO(output);
  CHECK(code == 1);
  CHECK_THAT(output, Catch::Contains("validation loss became") && Catch::Contains("epoch 1") &&
                         Catch::Contains("split 'val'") && Catch::Contains((shared().data / "val.h5").string()) &&
                         Catch::Contains("no checkpoint was written"));
  CHECK_THAT(output, !Catch::Contains("cannot open checkpoint") && !Catch::Contains("kept"));
  const auto paths = split_paths(shared().data / "val.h5");
  bool names_a_file = false;
  for (const auto& p : paths) names_a_file |= output.find("'" + p + "'") != std::string::npos;
  CHECK(names_a_file);
  CHECK_FALSE(fs::exists(run));
}

namespace {

/// The record of a torch archive holding the most bytes: its data offset and size.
std::pair<uint64_t, uint64_t> largest_record(const fs::path& file) {
  caffe2::serialize::PyTorchStreamReader reader(file.string());
  std::pair<uint64_t, uint64_t> best{0, 0};
  for (const auto& name : reader.getAllRecords()) {
    const uint64_t size = reader.getRecordSize(name);
    if (size > best.second) best = {reader.getRecordOffset(name), size};
  }
  return best;
}

/// Flips (XOR 0xFF) 16 bytes in the middle of the largest record of `file`: its zip CRC-32 no longer matches.
void flip_weight_bytes(const fs::path& file) {
  const auto [offset, size] = largest_record(file);
  REQUIRE(size > 64);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  for (uint64_t i = offset + size / 2; i < offset + size / 2 + 16; ++i) {
    f.seekg(static_cast<std::streamoff>(i));
    const int c = f.get();
    f.seekp(static_cast<std::streamoff>(i));
    f.put(static_cast<char>(c ^ 0xFF));
  }
  REQUIRE(f.good());
}

/// Writes NaN into the first element of the model's `fc.weight` and saves it with save_checkpoint (a correct CRC).
void write_nan_weight(const fs::path& file) {
  trainer::Checkpoint c = trainer::load_checkpoint(file);
  c.model.at("fc.weight").view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  trainer::save_checkpoint(c, file);
}

}  // namespace

TEST_CASE("a corrupt checkpoint (zip CRC, NaN weights) is refused by eval, export, predict and --resume, naming the "
          "file", "[trainer][integrity][checkpoint]") {
  const fs::path good = good_checkpoint();
  TempDir d;
  const bool nan = GENERATE(false, true);
  CAPTURE(nan);
  const fs::path run = d / "run";
  fs::create_directories(run / "checkpoints");
  fs::copy_file(shared().run / "config.json", run / "config.json");
  fs::copy_file(shared().run / "metrics.jsonl", run / "metrics.jsonl");
  const fs::path bad = run / "checkpoints" / "last.pt";
  fs::copy_file(good, bad);
  if (nan)
    write_nan_weight(bad);
  else
    flip_weight_bytes(bad);
  const fs::path wav = shared().dir / "in-3x4" / "class0" / "f0.wav";
  REQUIRE(fs::exists(wav));
  const std::vector<std::vector<std::string>> commands = {
      {"melforge-train", "eval", "--checkpoint", bad.string(), "--data", shared().data.string()},
      {"melforge-train", "export", "--checkpoint", bad.string(), "--out", (d / "w.pt").string()},
      {"melforge-train", "predict", "--checkpoint", bad.string(), wav.string()},
      {"melforge-train", "train", "--resume", run.string(), "--epochs", "2", "--log-level", "warn"},
  };
  for (const auto& args : commands) {
    const auto [code, output] = run_in_process(args);
    INFO(args[1] << ": " << output);
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains(bad.string()));
    CHECK_THAT(output, nan ? Catch::Contains("'model.fc.weight' holds NaN") : Catch::Contains("CRC-32"));
    CHECK_THAT(output, !Catch::Contains("nan,") && !Catch::Contains("-nan"));
  }
  CHECK_FALSE(fs::exists(d / "w.pt"));
}

TEST_CASE("a folder given as --checkpoint is named as a folder, a run folder with its checkpoint files",
          "[trainer][integrity][checkpoint]") {
  const fs::path good = good_checkpoint();
  TempDir d;
  const bool run_folder = GENERATE(false, true);
  const fs::path folder = run_folder ? shared().run : d.path();
  const auto [code, output] =
      run_in_process({"melforge-train", "eval", "--checkpoint", folder.string(), "--data", shared().data.string()});
  INFO(output);
  CHECK(code == 1);
  CHECK_THAT(output, Catch::Contains("'" + folder.string() + "' is a folder, not a checkpoint file"));
  CHECK_THAT(output, !Catch::Contains("basic_filebuf"));
  if (run_folder) CHECK_THAT(output, Catch::Contains(good.string()));
}

}  // namespace melforge_test_trainer_integrity
