// One engine per CUDA device, without a device: the engine plan for a device query (and make_engine on this
// machine, whatever its query says), the deal of segments to engines in whole device batches, and the multi-engine
// over CPU engines computing exactly what one engine computes.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge_test_multi_engine {

using namespace melforge;
using namespace melforge::mel;

namespace {

EngineConfig small_config(DType dtype) {
  EngineConfig c;
  c.mel.sample_rate = 8000;
  c.mel.n_fft = 256;
  c.mel.win_length = 256;
  c.mel.hop_length = 64;
  c.mel.n_mels = 32;
  c.segment_samples = 2000;
  c.dtype = dtype;
  c.threads = 1;
  return c;
}

std::vector<float> signal(int64_t n) {
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    s[static_cast<size_t>(i)] = 0.5f * std::sin(0.013f * static_cast<float>(i)) + 0.001f * static_cast<float>(i % 7);
  return s;
}

/// An engine that counts the segments it computed on a thread of its own, or throws on its first call.
class FakeEngine final : public MelEngine {
 public:
  FakeEngine(const MelLayout& layout, bool fail) : layout_(layout), fail_(fail) {}
  void compute(const float*, std::span<const int64_t> offsets, void* out) override {
    if (fail_) throw CudaError("fake device failed");
    threads_.push_back(std::this_thread::get_id());
    segments_ += static_cast<int64_t>(offsets.size());
    std::memset(out, 1, static_cast<size_t>(offsets.size()) * static_cast<size_t>(layout_.out_bytes_per_segment()));
  }
  void compute_clips(const float*, const ClipBatch& batch, void* out) override {
    if (fail_) throw CudaError("fake device failed");
    threads_.push_back(std::this_thread::get_id());
    clips_ += batch.clips();
    std::memset(out, 1, static_cast<size_t>(batch.out_bytes()));
  }
  std::string name() const override { return "fake"; }
  EngineTimes times() const override { return {1, 2, 3}; }
  int64_t device_bytes() const override { return 100; }
  int64_t host_bytes() const override { return 10; }
  const MelLayout& layout() const override { return layout_; }
  int64_t segments() const { return segments_; }
  int64_t clips() const { return clips_; }
  const std::vector<std::thread::id>& threads() const { return threads_; }

 private:
  MelLayout layout_;
  bool fail_;
  int64_t segments_ = 0;
  int64_t clips_ = 0;
  std::vector<std::thread::id> threads_;
};

}  // namespace

namespace {

CudaDeviceQuery devices_found(int count) {
  CudaDeviceQuery q;
  q.built_with_cuda = true;
  q.count = count;
  q.driver_version = 13000;
  q.runtime_version = 13000;
  return q;
}

CudaDeviceQuery insufficient_driver() {
  CudaDeviceQuery q;
  q.built_with_cuda = true;
  q.error_code = 35;
  q.error_name = "cudaErrorInsufficientDriver";
  q.error_message = "CUDA driver version is insufficient for CUDA runtime version";
  q.runtime_version = 13000;
  return q;
}

CudaDeviceSupport unsupported(int device) {
  CudaDeviceSupport s;
  s.device = device;
  s.cc_major = 11;
  s.name = "Fake Thor";
  s.problem = no_kernel_image_message(11, 0, "75-real,120-virtual");
  return s;
}

}  // namespace

TEST_CASE("plan_engines: one CPU engine, or one CUDA engine per usable device", "[multi_engine]") {
  const int devices = GENERATE(1, 2, 8);
  CAPTURE(devices);
  const CudaDeviceQuery q = devices_found(devices);
  std::vector<int> all(static_cast<size_t>(devices));
  std::iota(all.begin(), all.end(), 0);
  const EnginePlan cpu = plan_engines(Device::cpu, q, {});
  CHECK_FALSE(cpu.cuda);
  CHECK(cpu.engines() == 1);
  CHECK(cpu.cuda_query.empty());
  for (const Device d : {Device::auto_select, Device::cuda}) {
    const EnginePlan p = plan_engines(d, q, {});
    CHECK(p.cuda);
    CHECK(p.devices == all);
    CHECK(p.engines() == devices);
    CHECK(p.error.empty());
    CHECK(p.fallback_reason.empty());
    CHECK(p.cuda_query == q.describe());
  }
}

TEST_CASE("plan_engines: a failed device query makes auto use the CPU with a reason and cuda an error",
          "[multi_engine]") {
  const CudaDeviceQuery q = GENERATE(insufficient_driver(), CudaDeviceQuery{}, devices_found(0));
  CAPTURE(q.describe());
  const EnginePlan a = plan_engines(Device::auto_select, q, {});
  CHECK_FALSE(a.cuda);
  CHECK(a.engines() == 1);
  CHECK(a.error.empty());
  CHECK_THAT(a.fallback_reason, Catch::Contains(q.describe()));
  const EnginePlan c = plan_engines(Device::cuda, q, {});
  CHECK(c.cuda);
  CHECK(c.devices.empty());
  CHECK(c.engines() == 0);
  CHECK_THAT(c.error, Catch::Contains(q.describe()));
  if (q.error_code == 35) {
    CHECK_THAT(c.error, Catch::Contains("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA "
                                        "runtime version"));
    CHECK_THAT(a.fallback_reason, Catch::Contains("cudaErrorInsufficientDriver"));
  }
  if (!q.built_with_cuda) CHECK_THAT(c.error, Catch::Contains("built without CUDA"));
}

TEST_CASE("plan_engines: a device without a kernel image is left out by auto and refused by cuda", "[multi_engine]") {
  const CudaDeviceQuery q = devices_found(3);
  CudaDeviceSupport ok0;
  ok0.device = 0;
  CudaDeviceSupport ok2;
  ok2.device = 2;
  const std::vector<CudaDeviceSupport> mixed = {ok0, unsupported(1), ok2};
  const EnginePlan a = plan_engines(Device::auto_select, q, mixed);
  CHECK(a.cuda);
  CHECK(a.devices == std::vector<int>{0, 2});
  CHECK_THAT(a.fallback_reason, Catch::Contains("CUDA device 1 (Fake Thor, compute capability 11.0)") &&
                                    Catch::Contains("no kernel image for compute capability 11.0"));
  const EnginePlan c = plan_engines(Device::cuda, q, mixed);
  CHECK(c.devices.empty());
  CHECK_THAT(c.error, Catch::Contains("no kernel image for compute capability 11.0") &&
                          Catch::Contains("CUDA_VISIBLE_DEVICES"));

  const std::vector<CudaDeviceSupport> none = {unsupported(0), unsupported(1), unsupported(2)};
  const EnginePlan a0 = plan_engines(Device::auto_select, q, none);
  CHECK_FALSE(a0.cuda);
  CHECK(a0.engines() == 1);
  CHECK_THAT(a0.fallback_reason, Catch::Contains("no supported CUDA device") && Catch::Contains("CUDA device 2"));
  CHECK_FALSE(plan_engines(Device::cuda, q, none).error.empty());
}

TEST_CASE("make_engine on this machine follows the CUDA device query under auto and cuda", "[multi_engine]") {
  const CudaDeviceQuery q = query_cuda_devices();
  INFO("device query: " << q.describe());
  CHECK(cuda_device_count() == q.count);
  CHECK(cuda_available() == q.usable());
  const EngineConfig config = small_config(DType::float16);
  EnginePlan plan;
  const auto engine = make_engine(Device::auto_select, config, &plan);
  CHECK(plan.cuda_query == q.describe());
  if (!q.usable()) {
    CHECK(engine->name() == "cpu-fftw");
    CHECK_FALSE(plan.cuda);
    CHECK_THAT(plan.fallback_reason, Catch::Contains(q.describe()));
    const std::string cause = q.built_with_cuda ? q.error_name : "built without CUDA";
    if (q.built_with_cuda) CHECK(q.error_code != 0);
    CHECK_FALSE(cause.empty());
    CHECK_THROWS_AS(make_engine(Device::cuda, config), CudaError);
    CHECK_THROWS_WITH(make_engine(Device::cuda, config), Catch::Contains(cause));
    CHECK_THROWS_AS(make_cuda_engine(config), CudaError);
    CHECK_THROWS_WITH(make_cuda_engine(config), Catch::Contains(cause));
    return;
  }
  const EnginePlan cuda = choose_engines(Device::cuda);
  if (cuda.error.empty()) {
    CHECK(plan.cuda);
    CHECK(static_cast<int>(plan.devices.size()) == q.count);
    CHECK(plan.fallback_reason.empty());
    CHECK_THAT(engine->name(), Catch::StartsWith("cuda-cufft"));
    CHECK_NOTHROW(make_engine(Device::cuda, config));
  } else {
    CHECK_FALSE(plan.fallback_reason.empty());
    CHECK_THROWS_AS(make_engine(Device::cuda, config), CudaError);
  }
}

TEST_CASE("deal_round_robin deals contiguous chunks of whole device batches, at most one per engine",
          "[multi_engine]") {
  const int64_t count = GENERATE(0, 1, 5, 100, 4097, 3 * 4096 + 5);
  const int64_t unit = GENERATE(1, 7, 4096);
  const int engines = GENERATE(1, 2, 3, 8);
  CAPTURE(count, unit, engines);
  const auto dealt = deal_round_robin(count, unit, engines);
  REQUIRE(dealt.size() == static_cast<size_t>(engines));
  const int64_t units = (count + unit - 1) / unit;
  const int64_t share = (units + engines - 1) / engines;
  int64_t next = 0;
  int64_t busy = 0;
  for (const auto& chunks : dealt) {
    REQUIRE(chunks.size() <= 1);
    if (chunks.empty()) {
      CHECK(next == count);
      continue;
    }
    ++busy;
    const DealtBatch& b = chunks.front();
    CHECK(b.first == next);
    CHECK(b.count >= 1);
    CHECK(b.first % unit == 0);
    CHECK(b.count <= share * unit);
    if (b.first + b.count < count) {
      CHECK(b.count % unit == 0);
      CHECK(b.count == share * unit);
    }
    next = b.first + b.count;
  }
  CHECK(next == count);
  CHECK(busy == (count == 0 ? 0 : (units + share - 1) / share));
}

TEST_CASE("a multi-engine over CPU engines computes exactly what one engine computes", "[multi_engine]") {
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const int engines = GENERATE(1, 2, 3);
  const int64_t deal = GENERATE(1, 4, 4096);
  const int64_t count = GENERATE(0, 1, 2, 37);
  CAPTURE(engines, deal, count);
  const EngineConfig config = small_config(dtype);
  auto single = make_cpu_engine(config);
  std::vector<std::unique_ptr<MelEngine>> parts;
  for (int e = 0; e < engines; ++e) parts.push_back(make_cpu_engine(config));
  auto multi = make_multi_engine(std::move(parts), deal);
  CHECK(multi->name() == "cpu-fftw x" + std::to_string(engines));
  const std::vector<float> base = signal(40000);
  std::vector<int64_t> offsets;
  for (int64_t i = 0; i < count; ++i) offsets.push_back((i * 977) % (40000 - 2000));
  const auto bytes = static_cast<size_t>(count * single->layout().out_bytes_per_segment());
  std::vector<unsigned char> want(bytes + 1, 0xAB), got(bytes + 1, 0xCD);
  single->compute(base.data(), offsets, want.data());
  multi->compute(base.data(), offsets, got.data());
  CHECK(std::memcmp(want.data(), got.data(), bytes) == 0);
  CHECK(got[bytes] == 0xCD);
}

TEST_CASE("deal_clips splits clips into contiguous ranges of about equal frames", "[multi_engine]") {
  MelArgs a = small_config(DType::float32).mel;
  const std::vector<int64_t> offsets = {0, 6400, 6400 + 64, 6400 + 128, 6400 + 192, 12800 + 192, 12800 + 256};
  const ClipBatch batch = plan_clips(a, DType::float32, offsets);
  for (const int engines : {1, 2, 3, 4, 9}) {
    CAPTURE(engines);
    const auto ranges = deal_clips(batch, engines);
    REQUIRE(!ranges.empty());
    CHECK(static_cast<int>(ranges.size()) <= engines);
    int64_t next = 0;
    for (const auto& [first, last] : ranges) {
      CHECK(first == next);
      CHECK(last > first);
      next = last;
    }
    CHECK(next == batch.clips());
  }
  const auto two = deal_clips(batch, 2);
  REQUIRE(two.size() == 2);
  CHECK(two[0] == std::pair<int64_t, int64_t>{0, 3});  // frames 101, 2, 2 of 210: the first boundary at 105
  CHECK(two[1] == std::pair<int64_t, int64_t>{3, 6});
  CHECK(deal_clips(plan_clips(a, DType::float32, std::vector<int64_t>{5}), 3).empty());
}

TEST_CASE("a multi-engine over CPU engines computes exactly what one engine computes for whole clips",
          "[multi_engine]") {
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const int engines = GENERATE(1, 2, 3);
  const int64_t clips = GENERATE(0, 1, 2, 23);
  CAPTURE(engines, clips);
  const EngineConfig config = small_config(dtype);
  auto single = make_cpu_engine(config);
  std::vector<std::unique_ptr<MelEngine>> parts;
  for (int e = 0; e < engines; ++e) parts.push_back(make_cpu_engine(config));
  auto multi = make_multi_engine(std::move(parts), 4);
  const std::vector<float> base = signal(40000);
  std::vector<int64_t> offsets = {3};
  for (int64_t i = 0; i < clips; ++i) offsets.push_back(offsets.back() + (i * 977) % 1700);
  const ClipBatch batch = plan_clips(config.mel, dtype, offsets);
  const auto bytes = static_cast<size_t>(batch.out_bytes());
  std::vector<unsigned char> want(bytes + 1, 0xAB), got(bytes + 1, 0xCD);
  single->compute_clips(base.data(), batch, want.data());
  multi->compute_clips(base.data(), batch, got.data());
  CHECK(std::memcmp(want.data(), got.data(), bytes) == 0);
  CHECK(got[bytes] == 0xCD);
}

TEST_CASE("a multi-engine runs its engines on separate threads, sums their figures and rethrows an error",
          "[multi_engine]") {
  const MelLayout layout = make_layout(small_config(DType::float16));
  std::vector<std::unique_ptr<MelEngine>> parts;
  std::vector<const FakeEngine*> fakes;
  for (int e = 0; e < 3; ++e) {
    auto f = std::make_unique<FakeEngine>(layout, false);
    fakes.push_back(f.get());
    parts.push_back(std::move(f));
  }
  auto multi = make_multi_engine(std::move(parts), 4);
  const std::vector<int64_t> offsets(30, 0);
  std::vector<unsigned char> out(30 * static_cast<size_t>(layout.out_bytes_per_segment()));
  multi->compute(nullptr, offsets, out.data());
  CHECK(fakes[0]->segments() == 12);
  CHECK(fakes[1]->segments() == 12);
  CHECK(fakes[2]->segments() == 6);
  CHECK(fakes[0]->threads().front() != fakes[1]->threads().front());
  CHECK(fakes[1]->threads().front() != fakes[2]->threads().front());
  CHECK(multi->device_bytes() == 300);
  CHECK(multi->host_bytes() == 30);
  CHECK(multi->times().d2h_s == 9.0);
  std::vector<int64_t> clip_offsets(31);
  std::iota(clip_offsets.begin(), clip_offsets.end(), int64_t{0});
  for (auto& o : clip_offsets) o *= 2000;
  const ClipBatch clips = plan_clips(small_config(DType::float16).mel, DType::float16, clip_offsets);
  std::vector<unsigned char> clip_out(static_cast<size_t>(clips.out_bytes()));
  multi->compute_clips(nullptr, clips, clip_out.data());
  CHECK(fakes[0]->clips() + fakes[1]->clips() + fakes[2]->clips() == 30);
  CHECK(fakes[2]->clips() > 0);

  std::vector<std::unique_ptr<MelEngine>> failing;
  failing.push_back(std::make_unique<FakeEngine>(layout, false));
  failing.push_back(std::make_unique<FakeEngine>(layout, true));
  auto bad = make_multi_engine(std::move(failing), 4);
  CHECK_THROWS_WITH(bad->compute(nullptr, offsets, out.data()), Catch::Contains("fake device failed"));
  CHECK_THROWS_WITH(bad->compute_clips(nullptr, clips, clip_out.data()), Catch::Contains("fake device failed"));

  std::vector<std::unique_ptr<MelEngine>> mixed;
  mixed.push_back(make_cpu_engine(small_config(DType::float16)));
  mixed.push_back(make_cpu_engine(small_config(DType::float32)));
  CHECK_THROWS_AS(make_multi_engine(std::move(mixed), 4), InvalidArgument);
  CHECK_THROWS_AS(make_multi_engine({}, 4), InvalidArgument);
}

}  // namespace melforge_test_multi_engine
