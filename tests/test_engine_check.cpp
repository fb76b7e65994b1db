// The engine check of issue 27 on a machine without a GPU: the test hook (BuildConfig::engine_check.fault) makes the
// CPU engine and the CPU augmenter act as the device and perturbs their result, so the check runs between the CPU
// engine and a perturbed CPU engine: a mismatch stops a "cuda" build naming where it was, and an "auto" build falls
// back to the CPU twin and writes exactly what a CPU build writes. Also the mel tolerance (mel::compare_mel), the
// flag, and the --max-ram sizing of the CUDA augmenter (issue 27, section 3) with a host stand-in for the device
// augmenter that checks each call against its capacity as the CUDA augmenter does.
#include <catch2/catch.hpp>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>

#include "augment/augment_cuda.h"
#include "augment_build_fixture.h"
#include "augment_stage.h"
#include "batch_runner.h"
#include "build_cli.h"
#include "build_fixture.h"
#include "build_state.h"
#include "engine_check.h"
#include "engine_check_fixture.h"
#include "mel/half.h"
#include "mel/mel_compare.h"
#include "melforge/common/h5.h"
#include "pipeline.h"
#include "plan.h"
#include "test_util.h"

namespace melforge_test_engine_check {

using namespace melforge;
using melforge::test::require_same_splits;
using melforge::test::TempDir;
namespace fs = std::filesystem;
namespace cuda = melforge::augment::cuda;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

/// `values` as the bytes of `dtype` elements (float16 as half bits).
std::vector<uint8_t> encode(const std::vector<float>& values, mel::DType dtype) {
  std::vector<uint8_t> out(values.size() * (dtype == mel::DType::float16 ? 2 : 4));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == mel::DType::float16) {
      const uint16_t h = mel::float_to_half_bits(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    }
  }
  return out;
}

/// Three segments of 4 bands x 5 frames of log-mel-like dB values: band 0 loud, the others 40 to 90 dB below.
std::vector<float> db_values() {
  std::vector<float> v;
  for (int s = 0; s < 3; ++s)
    for (int m = 0; m < 4; ++m)
      for (int t = 0; t < 5; ++t) v.push_back(m == 0 ? 20.0f + t + s : -20.0f - 17.0f * m - t);
  return v;
}

mel::MelArgs db_args() {
  mel::MelArgs a;
  a.log = mel::LogMode::db;
  return a;
}

/// The tone build of `in` into `out` whose engine check runs with the CPU engine acting as a device of `as`, the
/// device's spectrograms of the first compared batch off by `mel_offset` at element `element`.
builder::BuildConfig hooked(const fs::path& in, const fs::path& out, mel::Device as, float mel_offset = 0,
                            int64_t element = 0) {
  auto c = test::tone_build_config(in, out);
  c.engine_check.fault.cpu_acts_as = as;
  c.engine_check.fault.mel_offset = mel_offset;
  c.engine_check.fault.mel_element = element;
  return c;
}

/// The message of the EngineCheckError `config`'s build throws; fails the test when it throws nothing or another
/// type.
std::string check_error_of(const builder::BuildConfig& config) {
  try {
    builder::run_build(config);
  } catch (const builder::EngineCheckError& e) {
    return e.what();
  }
  FAIL("the build did not stop with EngineCheckError");
  return "";
}

/// A state planned as run_build plans it, up to init_engine (plan stages, banks and the CPU engine).
struct PlannedBuild {
  explicit PlannedBuild(const builder::BuildConfig& c) : config(c), state(config) {
    config.validate();
    builder::scan_corpus(state);
    builder::select_shard(state);
    builder::label_files(state);
    builder::init_augment(state);
    builder::probe_files(state, false);
    builder::plan_clip_files(state);
    builder::init_engine(state);
  }
  builder::BuildConfig config;
  builder::BuildState state;
};

/// The CUDA augmenter's accounting and capacity check on the host: host_bytes are the pinned bytes of its buffer
/// sizes, item_bytes its per-item table bytes, and apply() refuses a call beyond its capacity (cuda::check_items,
/// as CudaAugmenter::apply does) before the CPU augmenter applies the recipes. Records the largest call.
class HostDeviceAugmenter final : public augment::Augmenter {
 public:
  HostDeviceAugmenter(const augment::Bank& noise, const augment::Bank& rir, int sample_rate, int64_t capacity)
      : cpu_(augment::make_cpu_augmenter(noise, rir, sample_rate)),
        layout_(cuda::bank_layout(noise, rir)),
        sizes_(cuda::augment_buffer_sizes(layout_.noise_lengths, layout_.rir_lengths, sample_rate, capacity)) {}
  void apply(std::span<Item> items) override {
    cuda::check_items(items, layout_.noise_lengths, std::ssize(layout_.rirs), sizes_);
    int64_t samples = 0;
    for (const Item& item : items) samples += std::ssize(item.samples);
    largest_call = std::max(largest_call, samples);
    cpu_->apply(items);
  }
  std::string name() const override { return "host-device"; }
  int64_t item_bytes(int64_t frames) const override {
    return cuda::device_item_bytes(frames, cuda::smallest_hop(layout_.rir_lengths));
  }
  int64_t device_bytes() const override { return 0; }
  int64_t host_bytes() const override { return sizes_.pinned_bytes(); }
  int64_t largest_call = 0;

 private:
  std::unique_ptr<augment::Augmenter> cpu_;
  cuda::BankLayout layout_;
  cuda::AugmentBufferSizes sizes_;
};

}  // namespace

TEST_CASE("compare_mel: equal outputs agree, one element off is found with its values", "[engine_check]") {
  const mel::DType dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  const std::vector<float> cpu = db_values();
  std::vector<float> device = cpu;
  const auto same = mel::compare_mel(encode(cpu, dtype).data(), encode(device, dtype).data(), 3, 4, 5, dtype,
                                     db_args());
  CHECK(same.passed());
  CHECK(same.max_abs_diff == 0);
  CHECK(same.elements == 60);
  CHECK(same.tolerance.rel == (dtype == mel::DType::float16 ? 2e-3 : 2e-4));
  CHECK(same.tolerance.abs == 5e-3);
  const int64_t at = 20 + 0 * 5 + 2;  // segment 1, band 0 (the loud one), frame 2
  device[at] += 0.5f;
  const auto off = mel::compare_mel(encode(cpu, dtype).data(), encode(device, dtype).data(), 3, 4, 5, dtype,
                                    db_args());
  CHECK_FALSE(off.passed());
  CHECK(off.outside == 1);
  CHECK(off.worst.index == at);
  CHECK(off.worst.cpu == Approx(cpu[at]));
  CHECK(off.worst.device == Approx(cpu[at] + 0.5f).margin(0.02));
  CHECK(off.max_abs_diff == Approx(0.5).margin(0.02));
}

TEST_CASE("compare_mel: differences within the bound, or tiny against the frame's loudest band, agree",
          "[engine_check]") {
  const std::vector<float> cpu = db_values();
  std::vector<float> device = cpu;
  device[7] += 0.004f;                  // band 1 of segment 0: within 5e-3 dB
  device[3 * 5 + 1] += 1.0f;            // band 3, 71 dB below its frame's peak: 1 dB is < 1e-6 of the peak's power
  const auto d = mel::compare_mel(encode(cpu, mel::DType::float32).data(), encode(device, mel::DType::float32).data(),
                                  3, 4, 5, mel::DType::float32, db_args());
  CHECK(d.passed());
  CHECK(d.max_abs_diff == Approx(1.0));
  CHECK(d.worst.index == 3 * 5 + 1);
  device[1 * 5 + 1] += 10.0f;           // band 1, 59 dB below: 10 dB more is more than 1e-6 of the peak's power
  const auto e = mel::compare_mel(encode(cpu, mel::DType::float32).data(), encode(device, mel::DType::float32).data(),
                                  3, 4, 5, mel::DType::float32, db_args());
  CHECK(e.outside == 1);
  CHECK(e.worst.index == 1 * 5 + 1);
}

TEST_CASE("compare_mel: a NaN on one side is outside, and log none scales abs by the largest value",
          "[engine_check]") {
  const std::vector<float> cpu = db_values();
  std::vector<float> device = cpu;
  device[11] = std::numeric_limits<float>::quiet_NaN();
  const auto d = mel::compare_mel(encode(cpu, mel::DType::float32).data(), encode(device, mel::DType::float32).data(),
                                  3, 4, 5, mel::DType::float32, db_args());
  CHECK(d.outside == 1);
  CHECK(d.worst.index == 11);
  CHECK(std::isinf(d.max_abs_diff));
  mel::MelArgs linear;
  linear.log = mel::LogMode::none;
  const auto t = mel::mel_tolerance(mel::DType::float32, mel::LogMode::none, 400.0);
  CHECK(t.abs == Approx(4e-3));
  CHECK_THROWS_AS(mel::compare_mel(cpu.data(), cpu.data(), 1, 0, 5, mel::DType::float32, linear), InvalidArgument);
}

TEST_CASE("the engine check does not apply to the CPU engine and --no-engine-check skips it", "[engine_check][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const auto cpu = builder::run_build(test::tone_build_config(d / "in", d / "cpu")).report["engine_check"];
  CHECK(cpu["result"] == "not_applicable");
  CHECK(cpu["ran"] == false);
  CHECK(cpu["engine"] == "cpu-fftw");
  CHECK(cpu["max_abs_diff"].is_null());
  auto skipped = hooked(d / "in", d / "skipped", mel::Device::cuda, 100.0f);
  skipped.engine_check.skip = true;
  const auto r = builder::run_build(skipped).report["engine_check"];
  CHECK(r["result"] == "skipped");
  CHECK(r["reason"] == "--no-engine-check");
  CHECK(r["ran"] == false);
  require_same_splits(d / "cpu", d / "skipped");
}

TEST_CASE("the engine check passes between two CPU engines and reports its figures", "[engine_check][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  builder::run_build(test::tone_build_config(d / "in", d / "cpu"));
  const auto report = builder::run_build(hooked(d / "in", d / "hooked", mel::Device::cuda)).report;
  const auto& c = report["engine_check"];
  CHECK(c["ran"] == true);
  CHECK(c["result"] == "passed");
  CHECK(c["engine"] == "cpu-fftw");
  CHECK(c["batches_compared"] == 1);
  CHECK(c["frames_compared"].get<int64_t>() > 0);
  CHECK(c["augmented_compared"] == 0);
  CHECK(c["max_abs_diff"] == 0.0);
  CHECK(c["fallback"] == false);
  CHECK(c["tolerance"]["mel"]["rel"] == 2e-3);
  CHECK(c["where"]["stage"] == "mel");
  CHECK(c["where"]["split"] == "train");
  CHECK(report["times_s"].contains("engine_check"));
  require_same_splits(d / "cpu", d / "hooked");
}

TEST_CASE("a wrong device spectrogram stops a cuda build naming the file, frame, band and both values",
          "[engine_check][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const auto config = hooked(d / "in", d / "out", mel::Device::cuda, 3.0f, 3 * 32);
  const std::string message = check_error_of(config);
  CAPTURE(message);
  builder::run_build(test::tone_build_config(d / "in", d / "cpu"));
  const std::string first = test::read_split(d / "cpu" / "train.h5").path.at(0);
  CHECK(message.find("engine check failed: the spectrograms of batch 1 (train)") != std::string::npos);
  CHECK(message.find(first + " (copy 0), frame 3, mel band 0: device ") !=
        std::string::npos);
  CHECK(message.find("--device auto falls back") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "out" / "train.h5"));
  CHECK_FALSE(fs::exists(d / "out" / "build_report.json"));
  // main exits 1 for a melforge::Error that is neither InvalidArgument (2) nor StrictError (3).
  STATIC_REQUIRE(std::is_base_of_v<Error, builder::EngineCheckError>);
  STATIC_REQUIRE_FALSE(std::is_base_of_v<InvalidArgument, builder::EngineCheckError>);
  STATIC_REQUIRE_FALSE(std::is_base_of_v<StrictError, builder::EngineCheckError>);
}

TEST_CASE("a wrong device spectrogram under auto falls back to the CPU twin, whose result is written",
          "[engine_check][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  builder::run_build(test::tone_build_config(d / "in", d / "cpu"));
  const test::SplitData cpu = test::read_split(d / "cpu" / "train.h5");
  const int64_t element = (cpu.clips.frame_offset[1] + 4) * 32 + 9;  // clip 1, frame 4, band 9 ([frames][32])
  const auto report = builder::run_build(hooked(d / "in", d / "auto", mel::Device::auto_select, -4.0f, element)).report;
  const auto& c = report["engine_check"];
  CHECK(c["result"] == "failed");
  CHECK(c["fallback"] == true);
  CHECK(c["fallback_batch"] == 1);
  CHECK(c["max_abs_diff"].get<double>() == Approx(4.0).margin(0.01));
  const auto& w = c["where"];
  CHECK(w["stage"] == "mel");
  CHECK(w["path"] == cpu.path.at(1));
  CHECK(w["mel_band"] == 9);
  CHECK(w["frame"] == 4);
  CHECK(w["device"].get<double>() - w["cpu"].get<double>() == Approx(-4.0).margin(0.01));
  CHECK(report["engine"] == "cpu-fftw");
  CHECK(report["engine_choice"]["fallback_reason"].get<std::string>().find("engine check failed") == 0);
  require_same_splits(d / "cpu", d / "auto");
}

TEST_CASE("a wrong augmented waveform stops a cuda build, and under auto the CPU augmenter's rows are written",
          "[engine_check][augment][e2e]") {
  using namespace melforge::test::augment_fixture;
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  write_banks(d / "banks");
  auto cuda = augment_config(d / "in", d / "banks", d / "cuda");
  cuda.engine_check.fault.cpu_acts_as = mel::Device::cuda;
  cuda.engine_check.fault.augment_offset = 0.25f;
  cuda.engine_check.fault.augment_sample = 100;
  const std::string message = check_error_of(cuda);
  CAPTURE(message);
  CHECK(message.find("the augmented waveforms of batch 1 (train)") != std::string::npos);
  CHECK(message.find("sample 100 (0.0125 s)") != std::string::npos);

  builder::run_build(augment_config(d / "in", d / "banks", d / "cpu"));
  auto passing = cuda;
  passing.build.output = d / "passing";
  passing.engine_check.fault.augment_offset = 0;
  const auto p = builder::run_build(passing).report["engine_check"];
  CHECK(p["result"] == "passed");
  CHECK(p["augmenter"] == "cpu-fftw");
  CHECK(p["augmented_compared"].get<int64_t>() > 0);
  CHECK(p["augment_max_abs_diff"] == 0.0);

  auto fallback = cuda;
  fallback.build.output = d / "auto";
  fallback.engine_check.fault.cpu_acts_as = mel::Device::auto_select;
  const auto c = builder::run_build(fallback).report["engine_check"];
  CHECK(c["result"] == "failed");
  CHECK(c["fallback"] == true);
  CHECK(c["where"]["stage"] == "augment");
  CHECK(c["where"]["sample"] == 100);
  CHECK(c["where"]["copy"].get<int>() > 0);
  CHECK(c["augment_max_abs_diff"].get<double>() == Approx(0.25).margin(1e-3));
  require_same_splits(d / "cpu", d / "auto");
  require_same_splits(d / "cpu", d / "passing");
}

TEST_CASE("the first augmented batch is compared even when it comes after the first batch",
          "[engine_check][augment]") {
  using namespace melforge::test::augment_fixture;
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  write_banks(d / "banks");
  auto base = augment_config(d / "in", d / "banks", d / "cpu");
  base.augment.splits = "val";
  builder::run_build(base);
  auto c = base;
  c.build.output = d / "auto";
  c.engine_check.fault.cpu_acts_as = mel::Device::auto_select;
  c.engine_check.fault.augment_offset = -0.5f;
  const auto report = builder::run_build(c).report;
  const auto& check = report["engine_check"];
  CHECK(check["batches_compared"] == 2);
  CHECK(check["result"] == "failed");
  CHECK(check["where"]["split"] == "val");
  CHECK(check["fallback_batch"].get<int64_t>() > 1);
  require_same_splits(d / "cpu", d / "auto");
}

TEST_CASE("the flag --no-engine-check, also spelled --no_engine_check, sets the switch, the hook needs --device cpu",
          "[engine_check]") {
  for (const std::string flag : {"--no-engine-check", "--no_engine_check"}) {
    builder::BuildConfig config;
    std::string config_file;
    boost::program_options::options_description all;
    builder::add_build_groups(all, config, config_file);
    std::ostringstream help;
    REQUIRE(builder::parse_build_args({"--input", "in", "--output", "out", flag}, all, help));
    CHECK(config.engine_check.skip);
  }
  builder::EngineCheckOptions o;
  o.fault.cpu_acts_as = mel::Device::cuda;
  CHECK_NOTHROW(o.validate(mel::Device::cpu));
  CHECK_THROWS_AS(o.validate(mel::Device::auto_select), InvalidArgument);
  o.fault.mel_element = -1;
  CHECK_THROWS_AS(o.validate(mel::Device::cpu), InvalidArgument);
}

TEST_CASE("check_batch_budget halves what --max-ram leaves after the reserve and the check's own bytes",
          "[engine_check][resources]") {
  CHECK(builder::check_batch_budget(100 * kMiB, 2, kMiB, 4 * kMiB, 6 * kMiB) == (100 - 64 - 2 - 4 - 6) * kMiB / 2);
  CHECK(builder::check_batch_budget(64 * kMiB, 2, kMiB, 0, 0) == 1);
  CHECK(builder::check_batch_budget(int64_t{64} << 30, 2, kMiB, 0, 0) == builder::kPipelineBatchBytes);
}

TEST_CASE("augment_capacity is the smallest capacity, at least the largest slice, that holds a quarter of its budget",
          "[augment][resources]") {
  const int64_t room = GENERATE(int64_t{0}, 3 * kMiB, 40 * kMiB, 400 * kMiB);
  const int64_t largest = GENERATE(int64_t{1000}, int64_t{200000});
  CAPTURE(room, largest);
  const auto budget = [&](int64_t c) { return std::clamp<int64_t>(room - 5 * c, 1, builder::kPipelineBatchBytes); };
  const int64_t c = builder::augment_capacity(largest, budget);
  CHECK(c >= largest);
  CHECK(c >= budget(c) / 4);
  if (c > largest) CHECK(c - 1 < budget(c - 1) / 4);
  CHECK_THROWS_AS(builder::augment_capacity(0, budget), InvalidArgument);
}

TEST_CASE("the device augmenter's capacity covers every batch of the runner, whose budget counts its pinned bytes",
          "[augment][resources]") {
  using namespace melforge::test::augment_fixture;
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 5);
  write_banks(d / "banks");
  const std::string max_ram = GENERATE("64.5M", "66M", "72M", "1G");
  CAPTURE(max_ram);
  auto config = augment_config(d / "in", d / "banks", d / "out");
  config.build.max_ram = max_ram;
  config.build.threads = 2;
  PlannedBuild b(config);
  builder::BuildState& s = b.state;
  const int64_t held_before = s.held_bytes();
  const int64_t capacity = builder::device_augment_capacity(s);
  auto device = std::make_unique<HostDeviceAugmenter>(s.augment->noise(), s.augment->rir(), s.sample_rate, capacity);
  HostDeviceAugmenter& host_device = *device;
  s.augment->use_device(std::move(device));
  CAPTURE(capacity, host_device.host_bytes());
  CHECK(host_device.host_bytes() > 4 * capacity);
  CHECK(s.held_bytes() == held_before + host_device.host_bytes());
  CHECK(builder::runner_batch_budget(s) / 4 <= capacity);
  fs::create_directories(d / "out");
  StageTimes times;
  const auto run = builder::run_batches(s, {{d / "out", 0}}, {false, false, false}, times);
  CHECK(run.stats.batches > 0);
  CHECK(host_device.largest_call > 0);
  CHECK(host_device.largest_call <= capacity);
}

}  // namespace melforge_test_engine_check
