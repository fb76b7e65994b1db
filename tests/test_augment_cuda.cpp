// [cuda] tests: the CUDA augmenter against the CPU augmenter. Linked with the main that exits 77 (skipped) without a
// device; each case also skips by itself when no device is usable.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "augment/augment.h"
#include "augment/augment_cuda.h"
#include "augment/augment_math.h"
#include "augment_cases.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "test_skip.h"

namespace melforge_test_augment_cuda {

using namespace melforge;
using namespace melforge::augment;
using namespace melforge::test;

TEST_CASE("CUDA augmenter matches the CPU augmenter over lengths, impulse responses, SNRs and gains", "[cuda]") {
  if (!mel::cuda_available()) MELFORGE_SKIP("no CUDA device");
  const std::vector<int64_t> rir_lengths = GENERATE(std::vector<int64_t>{1}, std::vector<int64_t>{1000},
                                                    std::vector<int64_t>{2048, 3000}, std::vector<int64_t>{20000});
  const int64_t frames = GENERATE(int64_t{1}, int64_t{3097}, int64_t{3098}, int64_t{48000}, int64_t{250000});
  const double snr = GENERATE(-5.0, 40.0);
  const double gain = GENERATE(0.0, 6.0);
  const int rir = static_cast<int>(rir_lengths.size()) - 1;
  CAPTURE(rir_lengths, frames, snr, gain);
  const Bank noise = augment_noise_bank();
  const Bank rirs = augment_rir_bank(rir_lengths);
  compare_with_cpu(noise, rirs, 16000, augment_cases(frames, rir, snr, gain), [&](AugmentBatch& got) {
    auto cuda = make_cuda_augmenter(noise, rirs, 16000, 0, got.samples + 100);
    REQUIRE(cuda->name() == "cuda-cufft");
    cuda->apply(got.items);
  });
}

TEST_CASE("one CUDA augmenter serves several calls, and a batch of mixed impulse responses", "[cuda]") {
  if (!mel::cuda_available()) MELFORGE_SKIP("no CUDA device");
  const Bank noise = augment_noise_bank();
  const Bank rirs = augment_rir_bank({1, 500, 2049, 9000});
  auto cpu = make_cpu_augmenter(noise, rirs, 22050);
  auto cuda = make_cuda_augmenter(noise, rirs, 22050, 0, 400000);
  for (const int64_t frames : {int64_t{30000}, int64_t{5}, int64_t{70000}}) {
    std::vector<AugmentCase> cases;
    for (int r = -1; r < 4; ++r) {
      cases.push_back({augment_recipe(r, r % 2 == 0 ? 0 : 1, 77 * (r + 2), 8.0 + r, r * 1.5), frames + 31 * (r + 1), 4,
                       static_cast<unsigned>(r + 10)});
    }
    CAPTURE(frames);
    AugmentBatch want = augment_batch(cases);
    AugmentBatch got = augment_batch(cases);
    const AugmentBatch clean = augment_batch(cases);
    cpu->apply(want.items);
    cuda->apply(got.items);
    require_augment_close(got, want, clean);
  }
}

TEST_CASE("CUDA augmenter: identity recipes untouched, limits refused, memory reported", "[cuda]") {
  if (!mel::cuda_available()) MELFORGE_SKIP("no CUDA device");
  const Bank noise = augment_noise_bank();
  const Bank rirs = augment_rir_bank({1000});
  const std::vector<AugmentCase> identity{{Recipe{}, 5000, 3, 1}, {augment_recipe(-1, -1, 0, 0.0, 0.0), 300, 0, 2}};
  AugmentBatch batch = augment_batch(identity);
  const AugmentBatch clean = augment_batch(identity);
  auto cuda = make_cuda_augmenter(noise, rirs, 16000, 0, batch.samples);
  cuda->apply(batch.items);
  for (size_t i = 0; i < batch.storage.size(); ++i) CHECK(batch.storage[i] == clean.storage[i]);

  const std::vector<int64_t> noise_lengths{2000, 50000};
  const std::vector<int64_t> rir_lengths{1000};
  const cuda::AugmentBufferSizes sizes = cuda::augment_buffer_sizes(noise_lengths, rir_lengths, 16000, batch.samples);
  CHECK(cuda->device_bytes() >= sizes.device_bytes());

  const std::vector<AugmentCase> over{{augment_recipe(0, 0, 0, 10.0, 0.0), batch.samples, 1, 3}};
  AugmentBatch big = augment_batch(over);
  const AugmentBatch big_clean = augment_batch(over);
  CHECK_THROWS_AS(cuda->apply(big.items), InvalidArgument);
  CHECK(big.storage[0] == big_clean.storage[0]);
  CHECK_THROWS_AS(make_cuda_augmenter(noise, rirs, 16000, 0, 0), InvalidArgument);
  CHECK_THROWS_AS(make_cuda_augmenter(noise, rirs, 16000, mel::cuda_device_count(), 100), InvalidArgument);
}

}  // namespace melforge_test_augment_cuda
