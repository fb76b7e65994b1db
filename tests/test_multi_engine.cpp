// One engine per CUDA device, without a device: the engine plan for a device count, the round-robin deal of
// segments to engines, and the multi-engine over CPU engines computing exactly what one engine computes.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

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
  std::string name() const override { return "fake"; }
  EngineTimes times() const override { return {1, 2, 3}; }
  int64_t device_bytes() const override { return 100; }
  const MelLayout& layout() const override { return layout_; }
  int64_t segments() const { return segments_; }
  const std::vector<std::thread::id>& threads() const { return threads_; }

 private:
  MelLayout layout_;
  bool fail_;
  int64_t segments_ = 0;
  std::vector<std::thread::id> threads_;
};

}  // namespace

TEST_CASE("plan_engines: one CPU engine, or one CUDA engine per device", "[multi_engine]") {
  const int devices = GENERATE(0, 1, 2, 8);
  CAPTURE(devices);
  CHECK_FALSE(plan_engines(Device::cpu, devices).cuda);
  CHECK(plan_engines(Device::cpu, devices).engines == 1);
  CHECK(plan_engines(Device::auto_select, devices).cuda == (devices > 0));
  CHECK(plan_engines(Device::auto_select, devices).engines == std::max(devices, 1));
  CHECK(plan_engines(Device::cuda, devices).cuda);
  CHECK(plan_engines(Device::cuda, devices).engines == std::max(devices, 1));
}

TEST_CASE("deal_round_robin gives every segment to exactly one engine, batch b to engine b % N", "[multi_engine]") {
  const int64_t count = GENERATE(0, 1, 5, 100, 4097);
  const int64_t max_batch = GENERATE(1, 7, 4096);
  const int engines = GENERATE(1, 2, 3, 8);
  CAPTURE(count, max_batch, engines);
  const auto dealt = deal_round_robin(count, max_batch, engines);
  REQUIRE(dealt.size() == static_cast<size_t>(engines));
  std::vector<DealtBatch> all;
  for (size_t e = 0; e < dealt.size(); ++e)
    for (size_t j = 0; j < dealt[e].size(); ++j) {
      const DealtBatch& b = dealt[e][j];
      CHECK(b.count >= 1);
      CHECK(b.count <= max_batch);
      const int64_t size = std::max<int64_t>(1, std::min(max_batch, (count + engines - 1) / engines));
      CHECK(b.first % size == 0);
      CHECK((b.first / size) % engines == static_cast<int64_t>(e));
      all.push_back(b);
    }
  std::sort(all.begin(), all.end(), [](const DealtBatch& a, const DealtBatch& b) { return a.first < b.first; });
  int64_t next = 0;
  for (const DealtBatch& b : all) {
    CHECK(b.first == next);
    next = b.first + b.count;
  }
  CHECK(next == count);
  if (count >= engines && max_batch * engines >= count)
    for (const auto& e : dealt) CHECK(e.size() == 1);
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
  CHECK(fakes[1]->segments() == 10);
  CHECK(fakes[2]->segments() == 8);
  CHECK(fakes[0]->threads().front() != fakes[1]->threads().front());
  CHECK(fakes[1]->threads().front() != fakes[2]->threads().front());
  CHECK(multi->device_bytes() == 300);
  CHECK(multi->times().d2h_s == 9.0);

  std::vector<std::unique_ptr<MelEngine>> failing;
  failing.push_back(std::make_unique<FakeEngine>(layout, false));
  failing.push_back(std::make_unique<FakeEngine>(layout, true));
  auto bad = make_multi_engine(std::move(failing), 4);
  CHECK_THROWS_WITH(bad->compute(nullptr, offsets, out.data()), Catch::Contains("fake device failed"));

  std::vector<std::unique_ptr<MelEngine>> mixed;
  mixed.push_back(make_cpu_engine(small_config(DType::float16)));
  mixed.push_back(make_cpu_engine(small_config(DType::float32)));
  CHECK_THROWS_AS(make_multi_engine(std::move(mixed), 4), InvalidArgument);
  CHECK_THROWS_AS(make_multi_engine({}, 4), InvalidArgument);
}
