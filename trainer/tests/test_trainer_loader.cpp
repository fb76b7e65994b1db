// BatchLoader on hand-made splits whose every short segment holds its own flat index: which segments an epoch
// visits, in which order, with and without the prefetch thread.
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <torch/cuda.h>

#include "catch_torch.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "melforge/common/errors.h"
#include "test_skip.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_loader {

using namespace melforge;
using trainer::Batch;
using trainer::BatchLoader;
using trainer::LoaderOptions;
using trainer::Split;

namespace {

constexpr int64_t kL = 3, kS = 4, kM = 5, kT = 6;

/// A split of files with `num_valid_long[f]` valid long segments each; every value of short segment
/// (f, l, s) is its flat index (f * L + l) * S + s; file f has label f % 3.
Split make_split(const std::vector<int64_t>& num_valid_long) {
  Split s;
  s.name = "train";
  const auto files = static_cast<int64_t>(num_valid_long.size());
  s.info.num_long = kL;
  s.info.num_short = kS;
  s.info.n_mels = kM;
  s.info.n_frames = kT;
  s.mel = at::arange(files * kL * kS, at::kFloat).view({files, kL, kS, 1, 1}).expand({files, kL, kS, kM, kT}).contiguous();
  std::vector<int64_t> labels;
  for (int64_t f = 0; f < files; ++f) {
    labels.push_back(f % 3);
    s.paths.push_back("f" + std::to_string(f) + ".wav");
  }
  s.label = at::tensor(labels, at::kLong);
  s.num_valid_long = at::tensor(num_valid_long, at::kLong);
  return s;
}

/// The valid flat indices, by naive loops.
std::vector<int64_t> valid_ids(const std::vector<int64_t>& nvl) {
  std::vector<int64_t> ids;
  for (std::size_t f = 0; f < nvl.size(); ++f)
    for (int64_t l = 0; l < nvl[f]; ++l)
      for (int64_t s = 0; s < kS; ++s) ids.push_back((static_cast<int64_t>(f) * kL + l) * kS + s);
  return ids;
}

/// Segment ids of a batch (read from the data), checking that every segment is constant and its label that of
/// its file.
std::vector<int64_t> ids_of(const Batch& b) {
  std::vector<int64_t> ids;
  const at::Tensor x = b.x.cpu().contiguous();
  const at::Tensor y = b.y.cpu();
  REQUIRE(x.dim() == 3);
  REQUIRE(x.size(1) == kM);
  REQUIRE(x.size(2) == kT);
  for (int64_t i = 0; i < x.size(0); ++i) {
    const float v = x[i][0][0].item<float>();
    REQUIRE(x[i].eq(v).all().item<bool>());
    const auto id = static_cast<int64_t>(v);
    CHECK(y[i].item<int64_t>() == (id / (kL * kS)) % 3);
    ids.push_back(id);
  }
  return ids;
}

/// Every batch of one epoch.
std::vector<Batch> epoch_batches(BatchLoader& loader, int64_t epoch) {
  std::vector<Batch> out;
  loader.start_epoch(epoch);
  while (auto b = loader.next()) out.push_back(*b);
  return out;
}

std::vector<int64_t> epoch_ids(BatchLoader& loader, int64_t epoch) {
  std::vector<int64_t> ids;
  for (const Batch& b : epoch_batches(loader, epoch)) {
    const auto v = ids_of(b);
    ids.insert(ids.end(), v.begin(), v.end());
  }
  return ids;
}

const std::vector<int64_t> kValid = {3, 1, 2, 3, 1, 1, 2};

}  // namespace

TEST_CASE("an epoch visits every valid segment exactly once and no invalid one", "[trainer][loader]") {
  const int64_t batch = GENERATE(1, 5, 16, 1000);
  const int64_t prefetch = GENERATE(0, 1, 3);
  CAPTURE(batch, prefetch);
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = batch;
  o.prefetch = prefetch;
  BatchLoader loader(split, o, 7, at::kCPU);
  std::vector<int64_t> expected = valid_ids(kValid);
  const auto n = static_cast<int64_t>(expected.size());
  REQUIRE(loader.segments() == n);
  REQUIRE(loader.batches_per_epoch() == (n + batch - 1) / batch);
  for (int64_t epoch : {0, 1}) {
    const auto batches = epoch_batches(loader, epoch);
    REQUIRE(static_cast<int64_t>(batches.size()) == loader.batches_per_epoch());
    std::vector<int64_t> ids;
    for (std::size_t i = 0; i < batches.size(); ++i) {
      CHECK(batches[i].index == static_cast<int64_t>(i));
      const int64_t want = i + 1 < batches.size() ? batch : n - batch * static_cast<int64_t>(i);
      CHECK(batches[i].x.size(0) == want);
      const auto v = ids_of(batches[i]);
      ids.insert(ids.end(), v.begin(), v.end());
    }
    std::sort(ids.begin(), ids.end());
    CHECK(ids == expected);
  }
}

TEST_CASE("drop_last keeps only full batches", "[trainer][loader]") {
  const Split split = make_split(kValid);
  const std::vector<int64_t> all = valid_ids(kValid);
  const auto n = static_cast<int64_t>(all.size());
  LoaderOptions o;
  o.batch_size = GENERATE(4, 7, 13);
  o.drop_last = true;
  CAPTURE(o.batch_size, n);
  BatchLoader loader(split, o, 1, at::kCPU);
  REQUIRE(loader.batches_per_epoch() == n / o.batch_size);
  std::set<int64_t> seen;
  for (const Batch& b : epoch_batches(loader, 0)) {
    CHECK(b.x.size(0) == o.batch_size);
    for (int64_t id : ids_of(b)) {
      CHECK(std::find(all.begin(), all.end(), id) != all.end());
      CHECK(seen.insert(id).second);
    }
  }
  CHECK(static_cast<int64_t>(seen.size()) == n - n % o.batch_size);
}

TEST_CASE("an epoch's order depends only on the seed and the epoch", "[trainer][loader]") {
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = 4;
  BatchLoader a(split, o, 11, at::kCPU);
  BatchLoader b(split, o, 11, at::kCPU);
  BatchLoader other_seed(split, o, 12, at::kCPU);
  const auto a2 = epoch_ids(a, 2);
  epoch_ids(b, 0);
  epoch_ids(b, 5);
  CHECK(epoch_ids(b, 2) == a2);
  CHECK(epoch_ids(a, 2) == a2);
  CHECK(epoch_ids(a, 3) != a2);
  CHECK(epoch_ids(other_seed, 2) != a2);
  const at::Tensor order = a.epoch_order(2);
  std::vector<int64_t> from_order;
  for (int64_t i = 0; i < order.size(0); ++i)
    from_order.push_back(a.segment_index()[order[i].item<int64_t>()].item<int64_t>());
  CHECK(from_order == a2);
}

TEST_CASE("the prefetch thread delivers the batches synchronous gathering makes", "[trainer][loader]") {
  const Split split = make_split(kValid);
  LoaderOptions sync_opts;
  sync_opts.batch_size = 3;
  sync_opts.prefetch = 0;
  LoaderOptions prefetch_opts = sync_opts;
  prefetch_opts.prefetch = GENERATE(1, 2, 8);
  BatchLoader sync(split, sync_opts, 5, at::kCPU);
  BatchLoader pre(split, prefetch_opts, 5, at::kCPU);
  const auto s = epoch_batches(sync, 4);
  const auto p = epoch_batches(pre, 4);
  REQUIRE(s.size() == p.size());
  const at::Tensor order = sync.epoch_order(4);
  for (std::size_t i = 0; i < s.size(); ++i) {
    CHECK(at::equal(s[i].x, p[i].x));
    CHECK(at::equal(s[i].y, p[i].y));
    const int64_t start = static_cast<int64_t>(i) * 3;
    const Batch g = sync.gather(order.narrow(0, start, std::min<int64_t>(3, order.size(0) - start)), 0);
    CHECK(at::equal(g.x, s[i].x));
  }
}

TEST_CASE("a loader stops cleanly in the middle of an epoch", "[trainer][loader]") {
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = 2;
  o.prefetch = 2;
  {
    BatchLoader loader(split, o, 3, at::kCPU);
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());
  }
  BatchLoader loader(split, o, 3, at::kCPU);
  const auto full = epoch_ids(loader, 1);
  loader.start_epoch(1);
  REQUIRE(loader.next().has_value());
  REQUIRE(loader.next().has_value());
  CHECK(epoch_ids(loader, 1) == full);
  loader.start_epoch(1);
  loader.next();
  loader.stop();
  loader.stop();
  CHECK_THROWS_AS(loader.next(), InvalidArgument);
  CHECK(loader.wait_seconds() >= 0.0);
}

TEST_CASE("the loader refuses bad options and splits without valid data", "[trainer][loader]") {
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = 0;
  CHECK_THROWS_AS(BatchLoader(split, o, 1, at::kCPU), InvalidArgument);
  o.batch_size = 4;
  o.prefetch = -1;
  CHECK_THROWS_AS(BatchLoader(split, o, 1, at::kCPU), InvalidArgument);
  o.prefetch = 1;
  Split no_mel = make_split(kValid);
  no_mel.mel = at::Tensor();
  CHECK_THROWS_AS(BatchLoader(no_mel, o, 1, at::kCPU), InvalidArgument);
  Split empty = make_split({});
  CHECK_THROWS_AS(BatchLoader(empty, o, 1, at::kCPU), FormatError);
  BatchLoader never_started(split, o, 1, at::kCPU);
  CHECK_THROWS_AS(never_started.next(), InvalidArgument);
}

/// The segment ids of each batch of an epoch.
using BatchIds = std::vector<std::vector<int64_t>>;

TEST_CASE("pausing the prefetch thread changes neither the batches nor their order", "[trainer][loader]") {
  const int64_t prefetch = GENERATE(1, 3);
  const int64_t pause_after = GENERATE(0, 1, 5, 17);
  CAPTURE(prefetch, pause_after);
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = 3;
  o.prefetch = 0;
  BatchLoader reference(split, o, 5, at::kCPU);
  BatchIds expected;
  for (const Batch& b : epoch_batches(reference, 2)) expected.push_back(ids_of(b));
  REQUIRE(expected.size() == 18);

  o.prefetch = prefetch;
  BatchLoader loader(split, o, 5, at::kCPU);
  BatchIds got;
  loader.start_epoch(2);
  for (int64_t i = 0; i < pause_after; ++i) got.push_back(ids_of(*loader.next()));
  {
    const trainer::LoaderPause pause(loader);
    CHECK(loader.paused());
    const int64_t ready = loader.ready();
    CHECK(ready <= prefetch);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(loader.ready() == ready);
    for (int64_t i = 0; i < ready; ++i) got.push_back(ids_of(*loader.next()));
    if (static_cast<std::size_t>(pause_after + ready) < expected.size()) {
      CHECK_THROWS_AS(loader.next(), InvalidArgument);
    }
  }
  CHECK_FALSE(loader.paused());
  while (auto b = loader.next()) got.push_back(ids_of(*b));
  CHECK(got == expected);
}

TEST_CASE("a paused prefetch thread starts no batch, and pause() waits for the one it is gathering",
          "[trainer][loader]") {
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = 1;
  o.prefetch = 64;
  BatchLoader loader(split, o, 5, at::kCPU);
  for (int round = 0; round < 50; ++round) {
    CAPTURE(round);
    loader.start_epoch(round);
    loader.pause();
    const int64_t ready = loader.ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CHECK(loader.ready() == ready);
    loader.resume();
  }
  loader.pause();
  loader.start_epoch(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(loader.ready() == 0);
  CHECK_THROWS_AS(loader.next(), InvalidArgument);
  loader.pause();
  loader.resume();
  CHECK(loader.next().has_value());
  loader.stop();

  o.prefetch = 0;
  BatchLoader synchronous(split, o, 5, at::kCPU);
  synchronous.start_epoch(0);
  const trainer::LoaderPause pause(synchronous);
  CHECK(synchronous.next().has_value());
  CHECK(synchronous.ready() == 0);
}

TEST_CASE("a split within the --gpu-mem budget is sampled on the device", "[trainer][loader][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  const Split split = make_split(kValid);
  LoaderOptions o;
  o.batch_size = 5;
  BatchLoader host(split, o, 9, at::kCPU);
  LoaderOptions r = o;
  r.gpu_mem = 1;
  BatchLoader resident(split, r, 9, at::Device(at::kCUDA, 0));
  REQUIRE(resident.device_resident());
  LoaderOptions pinned = o;
  BatchLoader streamed(split, pinned, 9, at::Device(at::kCUDA, 0));
  CHECK_FALSE(streamed.device_resident());
  const auto h = epoch_batches(host, 2);
  const auto d = epoch_batches(resident, 2);
  const auto p = epoch_batches(streamed, 2);
  REQUIRE(h.size() == d.size());
  REQUIRE(h.size() == p.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    CHECK(d[i].x.is_cuda());
    CHECK(p[i].x.is_cuda());
    CHECK(at::equal(h[i].x, d[i].x.cpu()));
    CHECK(at::equal(h[i].y, d[i].y.cpu()));
    CHECK(at::equal(h[i].x, p[i].x.cpu()));
  }
}

TEST_CASE("data-parallel shards: the ranks' k-th batches together are one process's k-th global batch",
          "[trainer][loader][dist]") {
  const int64_t world = GENERATE(2, 3);
  const int64_t batch = GENERATE(1, 5, 8, 17);
  const int64_t prefetch = GENERATE(0, 2);
  CAPTURE(world, batch, prefetch);
  const Split split = make_split(kValid);
  LoaderOptions one_opts;
  one_opts.batch_size = batch * world;
  one_opts.prefetch = prefetch;
  BatchLoader one(split, one_opts, 11, at::kCPU);
  LoaderOptions rank_opts = one_opts;
  rank_opts.batch_size = batch;
  std::vector<std::unique_ptr<BatchLoader>> ranks;
  for (int64_t r = 0; r < world; ++r)
    ranks.push_back(std::make_unique<BatchLoader>(split, rank_opts, 11, at::kCPU, r, world));
  const int64_t n = one.segments();
  const int64_t tail = n % (batch * world);
  const int64_t expected_batches = n / (batch * world) + (tail >= world ? 1 : 0);
  for (const auto& r : ranks) REQUIRE(r->batches_per_epoch() == expected_batches);
  for (int64_t epoch : {0, 3}) {
    const auto global = epoch_batches(one, epoch);
    REQUIRE(static_cast<int64_t>(global.size()) == expected_batches + (tail > 0 && tail < world ? 1 : 0));
    std::vector<std::vector<Batch>> per_rank;
    for (const auto& r : ranks) per_rank.push_back(epoch_batches(*r, epoch));
    for (int64_t k = 0; k < expected_batches; ++k) {
      CAPTURE(epoch, k);
      std::vector<int64_t> joined;
      for (int64_t r = 0; r < world; ++r) {
        const Batch& b = per_rank[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
        CHECK(b.index == k);
        CHECK(b.global_size == global[static_cast<std::size_t>(k)].x.size(0));
        CHECK(b.x.size(0) >= 1);
        CHECK(std::abs(b.x.size(0) * world - b.global_size) < world);
        const auto v = ids_of(b);
        joined.insert(joined.end(), v.begin(), v.end());
      }
      CHECK(joined == ids_of(global[static_cast<std::size_t>(k)]));
    }
  }
}

TEST_CASE("a loader refuses a rank outside its world", "[trainer][loader][dist]") {
  const Split split = make_split(kValid);
  CHECK_THROWS_AS(BatchLoader(split, LoaderOptions{}, 1, at::kCPU, 2, 2), InvalidArgument);
  CHECK_THROWS_AS(BatchLoader(split, LoaderOptions{}, 1, at::kCPU, 0, 0), InvalidArgument);
}

}  // namespace melforge_test_trainer_loader
