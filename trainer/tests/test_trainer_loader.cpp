// BatchLoader on hand-made splits of clips of different lengths whose every frame holds its own row index: which
// examples an epoch visits (tiles and crops views), in which order, with and without the prefetch thread, padded
// with the split's pad value and carrying each row's real length and clip.
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
#include "views/view.h"
#include "views/view_options.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_loader {

using namespace melforge;
using trainer::Batch;
using trainer::BatchLoader;
using trainer::LoaderOptions;
using trainer::Split;

namespace {

/// Mel bands of the hand-made splits; a frame rate of 100 frames a second (sample rate 100, hop 1), so 0.04 s is 4
/// frames.
constexpr int64_t kM = 5;

/// A schema-3 split of clips of `clip_frames[c]` frames; every value of frame row r (of the whole split) is r, and
/// clip c has label c % 3.
Split make_split(const std::vector<int64_t>& clip_frames) {
  Split s;
  s.name = "train";
  s.info.n_mels = kM;
  s.info.sample_rate = 100;
  s.info.hop_length = 1;
  s.info.n_fft = 4;
  s.info.win_length = 4;
  s.info.window = "hann";
  s.info.center = 1;
  s.info.pad_mode = "reflect";
  s.info.power = 2.0;
  s.info.f_max = 50.0;
  s.info.mel_scale = "htk";
  s.info.mel_norm = "none";
  s.info.log = "db";
  s.info.amin = 1e-10;
  s.info.log_eps = 1e-6;
  s.info.dtype = "float32";
  s.info.short_seconds = 0.04;
  s.info.n_frames = 4;
  s.meta.schema_version = 3;
  s.meta.frame_offset.assign(1, 0);
  std::vector<int64_t> labels;
  for (std::size_t c = 0; c < clip_frames.size(); ++c) {
    s.meta.frame_offset.push_back(s.meta.frame_offset.back() + clip_frames[c]);
    labels.push_back(static_cast<int64_t>(c) % 3);
    s.paths.push_back("c" + std::to_string(c) + ".wav");
  }
  s.meta.paths = s.paths;
  s.meta.labels = labels;
  const int64_t n = s.meta.frame_offset.back();
  s.frames = at::arange(n, at::kFloat).view({n, 1}).expand({n, kM}).contiguous();
  s.label = at::tensor(labels, at::kLong);
  return s;
}

/// The view of `name` ("tiles": tiles of 4 frames every 4 frames, min_real 0.5; "crops": crops of 4 frames).
std::unique_ptr<data::views::View> make_view(const std::string& name, double min_real = 0.5) {
  data::views::ViewOptions o;
  o.view = name;
  o.tile_seconds = 0.04;
  o.crop_seconds = 0.04;
  o.min_real = min_real;
  return data::views::make_view(o, {100, 1});
}

/// The id of each example of a batch: the split row of its first frame. Checks every position against the split
/// (naive): position k < lengths[i] holds row id + k (a repeated example wraps within its clip), every other the
/// pad value; y is the clip's label and clip the clip whose rows they are.
std::vector<int64_t> ids_of(const Batch& b, const Split& split) {
  std::vector<int64_t> ids;
  const at::Tensor x = b.x.cpu().contiguous();
  const at::Tensor y = b.y.cpu(), len = b.lengths.cpu(), clip = b.clip.cpu();
  REQUIRE(x.dim() == 3);
  REQUIRE(x.size(1) == kM);
  const float pad = split.pad_value();
  const auto& off = split.meta.frame_offset;
  for (int64_t i = 0; i < x.size(0); ++i) {
    const int64_t c = clip[i].item<int64_t>(), real = len[i].item<int64_t>();
    REQUIRE(c >= 0);
    REQUIRE(c < split.files());
    REQUIRE(real >= 1);
    REQUIRE(real <= x.size(2));
    CHECK(y[i].item<int64_t>() == c % 3);
    const auto id = static_cast<int64_t>(x[i][0][0].item<float>());
    const int64_t first = off[static_cast<std::size_t>(c)], frames = off[static_cast<std::size_t>(c) + 1] - first;
    REQUIRE(id >= first);
    REQUIRE(id < first + frames);
    for (int64_t k = 0; k < x.size(2); ++k) {
      const float want = k < real ? static_cast<float>(first + (id - first + k) % frames) : pad;
      REQUIRE(x[i].select(1, k).eq(want).all().item<bool>());
    }
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

std::vector<int64_t> epoch_ids(BatchLoader& loader, const Split& split, int64_t epoch) {
  std::vector<int64_t> ids;
  for (const Batch& b : epoch_batches(loader, epoch)) {
    const auto v = ids_of(b, split);
    ids.insert(ids.end(), v.begin(), v.end());
  }
  return ids;
}

/// Clip lengths in frames: with tiles of 4 (min_real 0.5) they give 1 + 1 + 2 + 3 + 1 + 1 + 2 = 11 tiles; the
/// 1-frame clip is one tile that is mostly padding, the 5-frame clip drops its 1-frame last tile.
const std::vector<int64_t> kClips = {4, 1, 7, 10, 2, 5, 8};

/// The ids of `view`'s examples of epoch `epoch` by a naive loop over the clips: tiles start every 4 frames while
/// they keep at least 2 real frames (or are the clip's first).
std::vector<int64_t> naive_tile_ids(const std::vector<int64_t>& clips) {
  std::vector<int64_t> ids;
  int64_t first = 0;
  for (const int64_t n : clips) {
    for (int64_t s = 0; s < n; s += 4)
      if (s == 0 || n - s >= 2) ids.push_back(first + s);
    first += n;
  }
  return ids;
}

}  // namespace

TEST_CASE("an epoch visits every tile exactly once, padded and masked, and no tile below min_real",
          "[trainer][loader]") {
  const int64_t batch = GENERATE(1, 5, 16, 1000);
  const int64_t prefetch = GENERATE(0, 1, 3);
  CAPTURE(batch, prefetch);
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = batch;
  o.prefetch = prefetch;
  BatchLoader loader(split, *view, 4, o, 7, at::kCPU);
  std::vector<int64_t> expected = naive_tile_ids(kClips);
  const auto n = static_cast<int64_t>(expected.size());
  REQUIRE(n == 11);
  REQUIRE(loader.examples() == n);
  REQUIRE(loader.batches_per_epoch() == (n + batch - 1) / batch);
  for (int64_t epoch : {0, 1}) {
    const auto batches = epoch_batches(loader, epoch);
    REQUIRE(static_cast<int64_t>(batches.size()) == loader.batches_per_epoch());
    std::vector<int64_t> ids;
    for (std::size_t i = 0; i < batches.size(); ++i) {
      CHECK(batches[i].index == static_cast<int64_t>(i));
      const int64_t want = i + 1 < batches.size() ? batch : n - batch * static_cast<int64_t>(i);
      CHECK(batches[i].x.size(0) == want);
      CHECK(batches[i].x.size(2) == 4);
      const auto v = ids_of(batches[i], split);
      ids.insert(ids.end(), v.begin(), v.end());
    }
    std::sort(ids.begin(), ids.end());
    CHECK(ids == expected);
  }
}

TEST_CASE("a clip shorter than a tile is one example of its real frames, the rest padding", "[trainer][loader]") {
  const Split split = make_split({1, 4});
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = 2;
  o.prefetch = 0;
  BatchLoader loader(split, *view, 4, o, 3, at::kCPU);
  REQUIRE(loader.examples() == 2);
  const auto batches = epoch_batches(loader, 0);
  REQUIRE(batches.size() == 1);
  const Batch& b = batches[0];
  ids_of(b, split);
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t c = b.clip[i].item<int64_t>();
    CHECK(b.lengths[i].item<int64_t>() == (c == 0 ? 1 : 4));
    if (c == 0) CHECK(b.x[i].narrow(1, 1, 3).eq(split.pad_value()).all().item<bool>());
  }
}

TEST_CASE("drop_last keeps only full batches", "[trainer][loader]") {
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  const std::vector<int64_t> all = naive_tile_ids(kClips);
  const auto n = static_cast<int64_t>(all.size());
  LoaderOptions o;
  o.batch_size = GENERATE(2, 4, 7);
  o.drop_last = true;
  CAPTURE(o.batch_size, n);
  BatchLoader loader(split, *view, 4, o, 1, at::kCPU);
  REQUIRE(loader.batches_per_epoch() == n / o.batch_size);
  std::set<int64_t> seen;
  for (const Batch& b : epoch_batches(loader, 0)) {
    CHECK(b.x.size(0) == o.batch_size);
    for (int64_t id : ids_of(b, split)) {
      CHECK(std::find(all.begin(), all.end(), id) != all.end());
      CHECK(seen.insert(id).second);
    }
  }
  CHECK(static_cast<int64_t>(seen.size()) == n - n % o.batch_size);
}

TEST_CASE("an epoch's order depends only on the seed and the epoch", "[trainer][loader]") {
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = 4;
  BatchLoader a(split, *view, 4, o, 11, at::kCPU);
  BatchLoader b(split, *view, 4, o, 11, at::kCPU);
  BatchLoader other_seed(split, *view, 4, o, 12, at::kCPU);
  const auto a2 = epoch_ids(a, split, 2);
  epoch_ids(b, split, 0);
  epoch_ids(b, split, 5);
  CHECK(epoch_ids(b, split, 2) == a2);
  CHECK(epoch_ids(a, split, 2) == a2);
  CHECK(epoch_ids(a, split, 3) != a2);
  CHECK(epoch_ids(other_seed, split, 2) != a2);
  const at::Tensor order = a.epoch_order(2);
  const auto examples = a.epoch_examples(2);
  std::vector<int64_t> from_order;
  for (int64_t i = 0; i < order.size(0); ++i) {
    const auto& e = examples[static_cast<std::size_t>(order[i].item<int64_t>())];
    from_order.push_back(split.meta.frame_offset[static_cast<std::size_t>(e.clip)] + e.start);
  }
  CHECK(from_order == a2);
}

TEST_CASE("crops: two epochs see different crops, a seeded rerun the same, a resumed loader the uninterrupted one's",
          "[trainer][loader][crops]") {
  const Split split = make_split({40, 37, 60, 3, 25, 50, 44, 90});
  const auto view = make_view("crops");
  LoaderOptions o;
  o.batch_size = 3;
  o.prefetch = GENERATE(0, 2);
  CAPTURE(o.prefetch);
  BatchLoader a(split, *view, 4, o, 21, at::kCPU);
  REQUIRE(a.examples() == 8);
  const auto e0 = epoch_ids(a, split, 0);
  const auto e1 = epoch_ids(a, split, 1);
  std::vector<int64_t> s0 = e0, s1 = e1;
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  CHECK(s0 != s1);
  BatchLoader rerun(split, *view, 4, o, 21, at::kCPU);
  CHECK(epoch_ids(rerun, split, 0) == e0);
  CHECK(epoch_ids(rerun, split, 1) == e1);
  BatchLoader resumed(split, *view, 4, o, 21, at::kCPU);
  const auto r1 = epoch_batches(resumed, 1);
  const auto u1 = epoch_batches(a, 1);
  REQUIRE(r1.size() == u1.size());
  for (std::size_t i = 0; i < r1.size(); ++i) {
    CHECK(at::equal(r1[i].x, u1[i].x));
    CHECK(at::equal(r1[i].lengths, u1[i].lengths));
    CHECK(at::equal(r1[i].clip, u1[i].clip));
  }
  BatchLoader other_seed(split, *view, 4, o, 22, at::kCPU);
  CHECK(epoch_ids(other_seed, split, 0) != e0);
  std::set<int64_t> clips;
  for (const Batch& b : u1)
    for (int64_t i = 0; i < b.clip.size(0); ++i) clips.insert(b.clip[i].item<int64_t>());
  CHECK(clips.size() == 8);
}

TEST_CASE("the prefetch thread delivers the batches synchronous gathering makes", "[trainer][loader]") {
  const Split split = make_split(kClips);
  const std::string name = GENERATE(std::string("tiles"), std::string("crops"));
  CAPTURE(name);
  const auto view = make_view(name);
  LoaderOptions sync_opts;
  sync_opts.batch_size = 3;
  sync_opts.prefetch = 0;
  LoaderOptions prefetch_opts = sync_opts;
  prefetch_opts.prefetch = GENERATE(1, 2, 8);
  BatchLoader sync(split, *view, 4, sync_opts, 5, at::kCPU);
  BatchLoader pre(split, *view, 4, prefetch_opts, 5, at::kCPU);
  const auto s = epoch_batches(sync, 4);
  const auto p = epoch_batches(pre, 4);
  REQUIRE(s.size() == p.size());
  const at::Tensor order = sync.epoch_order(4);
  for (std::size_t i = 0; i < s.size(); ++i) {
    CHECK(at::equal(s[i].x, p[i].x));
    CHECK(at::equal(s[i].y, p[i].y));
    CHECK(at::equal(s[i].lengths, p[i].lengths));
    CHECK(at::equal(s[i].clip, p[i].clip));
    const int64_t start = static_cast<int64_t>(i) * 3;
    const Batch g = sync.gather(order.narrow(0, start, std::min<int64_t>(3, order.size(0) - start)), 0, 4);
    CHECK(at::equal(g.x, s[i].x));
    CHECK(at::equal(g.lengths, s[i].lengths));
  }
}

TEST_CASE("an example length of 0 pads each batch to its longest example", "[trainer][loader]") {
  const Split split = make_split(kClips);
  data::views::ViewOptions vo;
  vo.view = "clips";
  const auto view = data::views::make_view(vo, {100, 1});
  LoaderOptions o;
  o.batch_size = 3;
  BatchLoader loader(split, *view, 0, o, 5, at::kCPU);
  REQUIRE(loader.examples() == static_cast<int64_t>(kClips.size()));
  std::vector<int64_t> ids;
  for (const Batch& b : epoch_batches(loader, 0)) {
    const auto v = ids_of(b, split);
    ids.insert(ids.end(), v.begin(), v.end());
    CHECK(b.x.size(2) == b.lengths.max().item<int64_t>());
    for (int64_t i = 0; i < b.clip.size(0); ++i)
      CHECK(b.lengths[i].item<int64_t>() == kClips[static_cast<std::size_t>(b.clip[i].item<int64_t>())]);
  }
  CHECK(ids.size() == kClips.size());
}

TEST_CASE("a loader stops cleanly in the middle of an epoch", "[trainer][loader]") {
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = 2;
  o.prefetch = 2;
  {
    BatchLoader loader(split, *view, 4, o, 3, at::kCPU);
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());
  }
  BatchLoader loader(split, *view, 4, o, 3, at::kCPU);
  const auto full = epoch_ids(loader, split, 1);
  loader.start_epoch(1);
  REQUIRE(loader.next().has_value());
  REQUIRE(loader.next().has_value());
  CHECK(epoch_ids(loader, split, 1) == full);
  loader.start_epoch(1);
  loader.next();
  loader.stop();
  loader.stop();
  CHECK_THROWS_AS(loader.next(), InvalidArgument);
  CHECK(loader.wait_seconds() >= 0.0);
}

TEST_CASE("the loader refuses bad options, splits without frames or examples, and examples too long",
          "[trainer][loader]") {
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = 0;
  CHECK_THROWS_AS(BatchLoader(split, *view, 4, o, 1, at::kCPU), InvalidArgument);
  o.batch_size = 4;
  o.prefetch = -1;
  CHECK_THROWS_AS(BatchLoader(split, *view, 4, o, 1, at::kCPU), InvalidArgument);
  o.prefetch = 1;
  CHECK_THROWS_AS(BatchLoader(split, *view, 3, o, 1, at::kCPU), InvalidArgument);
  Split no_frames = make_split(kClips);
  no_frames.frames = at::Tensor();
  CHECK_THROWS_AS(BatchLoader(no_frames, *view, 4, o, 1, at::kCPU), InvalidArgument);
  Split empty = make_split({});
  CHECK_THROWS_AS(BatchLoader(empty, *view, 4, o, 1, at::kCPU), FormatError);
  BatchLoader never_started(split, *view, 4, o, 1, at::kCPU);
  CHECK_THROWS_AS(never_started.next(), InvalidArgument);
}

/// The example ids of each batch of an epoch.
using BatchIds = std::vector<std::vector<int64_t>>;

TEST_CASE("pausing the prefetch thread changes neither the batches nor their order", "[trainer][loader]") {
  const int64_t prefetch = GENERATE(1, 3);
  const int64_t pause_after = GENERATE(0, 1, 2, 3);
  CAPTURE(prefetch, pause_after);
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = 3;
  o.prefetch = 0;
  BatchLoader reference(split, *view, 4, o, 5, at::kCPU);
  BatchIds expected;
  for (const Batch& b : epoch_batches(reference, 2)) expected.push_back(ids_of(b, split));
  REQUIRE(expected.size() == 4);

  o.prefetch = prefetch;
  BatchLoader loader(split, *view, 4, o, 5, at::kCPU);
  BatchIds got;
  loader.start_epoch(2);
  for (int64_t i = 0; i < pause_after; ++i) got.push_back(ids_of(*loader.next(), split));
  {
    const trainer::LoaderPause pause(loader);
    CHECK(loader.paused());
    const int64_t ready = loader.ready();
    CHECK(ready <= prefetch);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(loader.ready() == ready);
    for (int64_t i = 0; i < ready; ++i) got.push_back(ids_of(*loader.next(), split));
    if (static_cast<std::size_t>(pause_after + ready) < expected.size()) {
      CHECK_THROWS_AS(loader.next(), InvalidArgument);
    }
  }
  CHECK_FALSE(loader.paused());
  while (auto b = loader.next()) got.push_back(ids_of(*b, split));
  CHECK(got == expected);
}

TEST_CASE("a paused prefetch thread starts no batch, and pause() waits for the one it is gathering",
          "[trainer][loader]") {
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions o;
  o.batch_size = 1;
  o.prefetch = 64;
  BatchLoader loader(split, *view, 4, o, 5, at::kCPU);
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
  BatchLoader synchronous(split, *view, 4, o, 5, at::kCPU);
  synchronous.start_epoch(0);
  const trainer::LoaderPause pause(synchronous);
  CHECK(synchronous.next().has_value());
  CHECK(synchronous.ready() == 0);
}

TEST_CASE("a split within the --gpu-mem budget is gathered on the device", "[trainer][loader][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  const Split split = make_split(kClips);
  const std::string name = GENERATE(std::string("tiles"), std::string("crops"));
  CAPTURE(name);
  const auto view = make_view(name);
  LoaderOptions o;
  o.batch_size = 5;
  BatchLoader host(split, *view, 4, o, 9, at::kCPU);
  LoaderOptions r = o;
  r.gpu_mem = 1;
  BatchLoader resident(split, *view, 4, r, 9, at::Device(at::kCUDA, 0));
  REQUIRE(resident.device_resident());
  BatchLoader pinned(split, *view, 4, o, 9, at::Device(at::kCUDA, 0));
  CHECK_FALSE(pinned.device_resident());
  for (int64_t epoch : {0, 2}) {
    const auto h = epoch_batches(host, epoch);
    const auto d = epoch_batches(resident, epoch);
    const auto p = epoch_batches(pinned, epoch);
    REQUIRE(h.size() == d.size());
    REQUIRE(h.size() == p.size());
    for (std::size_t i = 0; i < h.size(); ++i) {
      CHECK(d[i].x.is_cuda());
      CHECK(p[i].x.is_cuda());
      CHECK(at::equal(h[i].x, d[i].x.cpu()));
      CHECK(at::equal(h[i].y, d[i].y.cpu()));
      CHECK(at::equal(h[i].lengths, d[i].lengths.cpu()));
      CHECK(at::equal(h[i].clip, d[i].clip.cpu()));
      CHECK(at::equal(h[i].x, p[i].x.cpu()));
      CHECK(at::equal(h[i].lengths, p[i].lengths.cpu()));
    }
  }
}

TEST_CASE("data-parallel shards: the ranks' k-th batches together are one process's k-th global batch",
          "[trainer][loader][dist]") {
  const int64_t world = GENERATE(2, 3);
  const int64_t batch = GENERATE(1, 2, 3, 5);
  const int64_t prefetch = GENERATE(0, 2);
  CAPTURE(world, batch, prefetch);
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  LoaderOptions one_opts;
  one_opts.batch_size = batch * world;
  one_opts.prefetch = prefetch;
  BatchLoader one(split, *view, 4, one_opts, 11, at::kCPU);
  LoaderOptions rank_opts = one_opts;
  rank_opts.batch_size = batch;
  std::vector<std::unique_ptr<BatchLoader>> ranks;
  for (int64_t r = 0; r < world; ++r)
    ranks.push_back(std::make_unique<BatchLoader>(split, *view, 4, rank_opts, 11, at::kCPU, r, world));
  const int64_t n = one.examples();
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
        const auto v = ids_of(b, split);
        joined.insert(joined.end(), v.begin(), v.end());
      }
      CHECK(joined == ids_of(global[static_cast<std::size_t>(k)], split));
    }
  }
}

TEST_CASE("a loader refuses a rank outside its world", "[trainer][loader][dist]") {
  const Split split = make_split(kClips);
  const auto view = make_view("tiles");
  CHECK_THROWS_AS(BatchLoader(split, *view, 4, LoaderOptions{}, 1, at::kCPU, 2, 2), InvalidArgument);
  CHECK_THROWS_AS(BatchLoader(split, *view, 4, LoaderOptions{}, 1, at::kCPU, 0, 0), InvalidArgument);
}

}  // namespace melforge_test_trainer_loader
