// The file-level vote (kernels/vote) against a naive loop written here, on hand-made ties and boundaries and on
// random inputs over GENERATE'd shapes; the clip vote (vote_clips: examples in any order, any number per clip)
// against its own naive loop and against the dense vote; and the file-level metrics (kernels/metrics) on a hand-counted case.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "melforge/common/errors.h"
#include "metrics/metrics.h"
#include "vote/vote.h"

namespace melforge_test_vote {

using namespace melforge;
using namespace melforge::vote;

namespace {

struct Naive {
  std::vector<std::vector<double>> class_probs;
  std::vector<int64_t> predicted;
  std::vector<double> score;
  std::vector<bool> detected;
};

/// The documented semantics as plain loops: index arithmetic on the flat arrays, divisions per term.
Naive naive_vote(const std::vector<float>& p, const std::vector<float>& d, const std::vector<int64_t>& nvl,
                 const VoteShape& s, Vote vote, double threshold) {
  const int64_t L = s.num_long, S = s.num_short, C = s.num_classes;
  Naive out;
  for (int64_t f = 0; f < s.files; ++f) {
    std::vector<double> mean(C, 0.0), votes(C, 0.0);
    double det_mean = 0, det_votes = 0;
    const double n = static_cast<double>(nvl[f]);
    for (int64_t l = 0; l < nvl[f]; ++l) {
      std::vector<double> lp(C, 0.0);
      double ld = 0;
      for (int64_t k = 0; k < S; ++k) {
        for (int64_t c = 0; c < C; ++c) lp[c] += p[((f * L + l) * S + k) * C + c] / static_cast<double>(S);
        ld += d[(f * L + l) * S + k] / static_cast<double>(S);
      }
      int64_t best = 0;
      for (int64_t c = 1; c < C; ++c)
        if (lp[c] > lp[best]) best = c;
      votes[best] += 1;
      for (int64_t c = 0; c < C; ++c) mean[c] += lp[c] / n;
      det_mean += ld / n;
      det_votes += ld >= threshold ? 1 : 0;
    }
    int64_t pred = 0;
    if (vote == Vote::mean) {
      for (int64_t c = 1; c < C; ++c)
        if (mean[c] > mean[pred]) pred = c;
      out.class_probs.push_back(mean);
      out.score.push_back(det_mean);
      out.detected.push_back(det_mean >= threshold);
    } else {
      for (int64_t c = 1; c < C; ++c)
        if (votes[c] > votes[pred] || (votes[c] == votes[pred] && mean[c] > mean[pred])) pred = c;
      for (auto& v : votes) v /= n;
      out.class_probs.push_back(votes);
      out.score.push_back(det_votes / n);
      out.detected.push_back(det_votes / n > 0.5);
    }
    out.predicted.push_back(pred);
  }
  return out;
}

FileVotes run(const std::vector<float>& p, const std::vector<float>& d, const std::vector<int64_t>& nvl,
              const VoteShape& s, Vote v, double threshold) {
  return aggregate_files(p, d, nvl, s, v, threshold);
}

}  // namespace

TEST_CASE("vote: names", "[vote]") {
  CHECK(parse_vote("mean") == Vote::mean);
  CHECK(parse_vote("majority") == Vote::majority);
  CHECK(to_string(Vote::mean) == "mean");
  CHECK(to_string(Vote::majority) == "majority");
  CHECK_THROWS_AS(parse_vote("Median"), InvalidArgument);
}

TEST_CASE("vote: equals a naive loop on random inputs", "[vote]") {
  const int64_t F = GENERATE(0, 1, 9);
  const int64_t L = GENERATE(1, 3);
  const int64_t S = GENERATE(1, 4);
  const int64_t C = GENERATE(1, 2, 6);
  const Vote v = GENERATE(Vote::mean, Vote::majority);
  const double threshold = GENERATE(0.25, 0.5);
  CAPTURE(F, L, S, C, to_string(v), threshold);
  std::mt19937 rng(static_cast<uint32_t>(F * 1000 + L * 100 + S * 10 + C));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p(static_cast<std::size_t>(F * L * S * C)), d(static_cast<std::size_t>(F * L * S));
  for (auto& x : p) x = u(rng);
  for (auto& x : d) x = u(rng);
  std::vector<int64_t> nvl(static_cast<std::size_t>(F));
  for (auto& n : nvl) n = std::uniform_int_distribution<int64_t>(1, L)(rng);
  const VoteShape shape{F, L, S, C};
  const FileVotes got = run(p, d, nvl, shape, v, threshold);
  const Naive ref = naive_vote(p, d, nvl, shape, v, threshold);
  REQUIRE(got.class_probs.size() == static_cast<std::size_t>(F * C));
  REQUIRE(got.predicted.size() == static_cast<std::size_t>(F));
  for (int64_t f = 0; f < F; ++f) {
    CAPTURE(f, nvl[f]);
    CHECK(got.predicted[f] == ref.predicted[f]);
    CHECK(got.detection_score[f] == Approx(ref.score[f]).margin(1e-6));
    CHECK((got.detected[f] != 0) == ref.detected[f]);
    for (int64_t c = 0; c < C; ++c) CHECK(got.class_probs[f * C + c] == Approx(ref.class_probs[f][c]).margin(1e-6));
  }
}

TEST_CASE("vote: ties, padding and threshold boundaries", "[vote]") {
  // One file, L = 3 with 2 valid long segments (S = 1): segment 0 votes class 0 (0.55), segment 1 votes class 1
  // (0.9); the invalid segment 2 would make class 0 win if it were counted.
  const std::vector<float> p = {0.55f, 0.45f, 0.1f, 0.9f, 1.0f, 0.0f};
  const std::vector<float> d = {0.75f, 0.25f, 1.0f};
  const std::vector<int64_t> nvl = {2};
  const VoteShape shape{1, 3, 1, 2};
  const FileVotes maj = run(p, d, nvl, shape, Vote::majority, 0.5);
  CHECK(maj.predicted[0] == 1);
  CHECK(maj.class_probs == std::vector<float>{0.5f, 0.5f});
  CHECK(maj.detection_score[0] == 0.5f);
  CHECK(maj.detected[0] == 0);  // exactly half is not "more than half"
  const FileVotes mean = run(p, d, nvl, shape, Vote::mean, 0.5);
  CHECK(mean.predicted[0] == 1);
  CHECK(mean.class_probs[0] == Approx(0.325));
  CHECK(mean.detection_score[0] == 0.5f);
  CHECK(mean.detected[0] == 1);  // the mean score at the threshold is positive
  // Equal probabilities and equal votes: the first class wins in both votes.
  const std::vector<float> flat = {0.25f, 0.25f, 0.25f, 0.25f};
  CHECK(run(flat, {0.5f}, {1}, {1, 1, 1, 4}, Vote::mean, 0.5).predicted[0] == 0);
  CHECK(run(flat, {0.5f}, {1}, {1, 1, 1, 4}, Vote::majority, 0.5).predicted[0] == 0);
}

TEST_CASE("vote: bad inputs are refused", "[vote]") {
  const std::vector<float> p(12, 0.5f), d(6, 0.5f);
  const VoteShape shape{2, 3, 1, 2};
  CHECK_THROWS_AS(run(p, d, {1, 0}, shape, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(run(p, d, {1, 4}, shape, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(run(p, d, {1}, shape, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(run(p, {0.5f}, {1, 1}, shape, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(run(p, d, {1, 1}, {2, 3, 1, 0}, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(run(p, d, {1, 1}, shape, Vote::mean, std::nan("")), InvalidArgument);
  CHECK_NOTHROW(run(p, d, {1, 3}, shape, Vote::majority, 0.5));
}

namespace {

/// vote_clips' semantics as plain loops: for each clip, scan every example and keep those naming it.
Naive naive_clip_vote(const std::vector<float>& p, const std::vector<float>& d, const std::vector<int64_t>& clip,
                      int64_t clips, int64_t C, Vote vote, double threshold) {
  Naive out;
  for (int64_t f = 0; f < clips; ++f) {
    std::vector<double> mean(C, 0.0), votes(C, 0.0);
    double det_sum = 0, det_votes = 0, n = 0;
    for (std::size_t e = 0; e < clip.size(); ++e) {
      if (clip[e] != f) continue;
      int64_t best = 0;
      for (int64_t c = 0; c < C; ++c) {
        mean[c] += p[e * C + c];
        if (p[e * C + c] > p[e * C + best]) best = c;
      }
      votes[best] += 1;
      det_sum += d[e];
      det_votes += d[e] >= threshold ? 1 : 0;
      n += 1;
    }
    for (auto& m : mean) m /= n;
    int64_t pred = 0;
    for (int64_t c = 1; c < C; ++c) {
      const bool better = vote == Vote::mean ? mean[c] > mean[pred]
                                             : votes[c] > votes[pred] || (votes[c] == votes[pred] && mean[c] > mean[pred]);
      if (better) pred = c;
    }
    if (vote == Vote::majority)
      for (auto& v : votes) v /= n;
    out.class_probs.push_back(vote == Vote::mean ? mean : votes);
    out.score.push_back(vote == Vote::mean ? det_sum / n : det_votes / n);
    out.detected.push_back(vote == Vote::mean ? det_sum / n >= threshold : det_votes / n > 0.5);
    out.predicted.push_back(pred);
  }
  return out;
}

}  // namespace

TEST_CASE("vote_clips: equals a naive loop over examples in any order", "[vote]") {
  const int64_t F = GENERATE(1, 7);
  const int64_t max_per_clip = GENERATE(1, 5);
  const int64_t C = GENERATE(1, 3);
  const Vote v = GENERATE(Vote::mean, Vote::majority);
  const double threshold = GENERATE(0.25, 0.5);
  CAPTURE(F, max_per_clip, C, to_string(v), threshold);
  std::mt19937 rng(static_cast<uint32_t>(F * 100 + max_per_clip * 10 + C));
  std::vector<int64_t> clip;
  for (int64_t f = 0; f < F; ++f)
    for (int64_t k = std::uniform_int_distribution<int64_t>(1, max_per_clip)(rng); k > 0; --k) clip.push_back(f);
  std::shuffle(clip.begin(), clip.end(), rng);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p(clip.size() * static_cast<std::size_t>(C)), d(clip.size());
  for (auto& x : p) x = u(rng);
  for (auto& x : d) x = u(rng);
  const FileVotes got = vote_clips(p, d, clip, F, C, v, threshold);
  const Naive ref = naive_clip_vote(p, d, clip, F, C, v, threshold);
  for (int64_t f = 0; f < F; ++f) {
    CAPTURE(f);
    CHECK(got.predicted[f] == ref.predicted[f]);
    CHECK(got.detection_score[f] == Approx(ref.score[f]).margin(1e-6));
    CHECK((got.detected[f] != 0) == ref.detected[f]);
    for (int64_t c = 0; c < C; ++c) CHECK(got.class_probs[f * C + c] == Approx(ref.class_probs[f][c]).margin(1e-6));
  }
}

TEST_CASE("vote_clips: one example per valid long segment is the dense vote with S = 1", "[vote]") {
  const Vote v = GENERATE(Vote::mean, Vote::majority);
  const int64_t F = 5, L = 4, C = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p(F * L * C), d(F * L);
  for (auto& x : p) x = u(rng);
  for (auto& x : d) x = u(rng);
  const std::vector<int64_t> nvl = {1, 4, 2, 3, 4};
  std::vector<float> ep, ed;
  std::vector<int64_t> clip;
  for (int64_t f = 0; f < F; ++f)
    for (int64_t l = 0; l < nvl[f]; ++l) {
      ep.insert(ep.end(), p.begin() + (f * L + l) * C, p.begin() + (f * L + l + 1) * C);
      ed.push_back(d[f * L + l]);
      clip.push_back(f);
    }
  const FileVotes dense = aggregate_files(p, d, nvl, {F, L, 1, C}, v, 0.5);
  const FileVotes clips = vote_clips(ep, ed, clip, F, C, v, 0.5);
  CHECK(clips.predicted == dense.predicted);
  CHECK(clips.class_probs == dense.class_probs);
  CHECK(clips.detection_score == dense.detection_score);
  CHECK(clips.detected == dense.detected);
}

TEST_CASE("vote_clips: every clip needs an example, indices and sizes are checked", "[vote]") {
  const std::vector<float> p = {0.2f, 0.8f, 0.6f, 0.4f};
  const std::vector<float> d = {0.9f, 0.1f};
  CHECK_NOTHROW(vote_clips(p, d, std::vector<int64_t>{0, 1}, 2, 2, Vote::mean, 0.5));
  CHECK_THROWS_WITH(vote_clips(p, d, std::vector<int64_t>{0, 0}, 2, 2, Vote::mean, 0.5),
                    Catch::Contains("clip 1 has no example"));
  CHECK_THROWS_AS(vote_clips(p, d, std::vector<int64_t>{0, 2}, 2, 2, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(vote_clips(p, d, std::vector<int64_t>{0, -1}, 2, 2, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(vote_clips(p, std::vector<float>{0.5f}, std::vector<int64_t>{0, 1}, 2, 2, Vote::mean, 0.5),
                  InvalidArgument);
  CHECK_THROWS_AS(vote_clips(p, d, std::vector<int64_t>{0, 1}, 2, 3, Vote::mean, 0.5), InvalidArgument);
  CHECK_THROWS_AS(vote_clips(p, d, std::vector<int64_t>{0, 1}, 2, 2, Vote::mean, std::nan("")), InvalidArgument);
  const FileVotes none = vote_clips(p, std::span<const float>(), std::vector<int64_t>{1, 0}, 2, 2, Vote::majority, 0.5);
  CHECK(none.predicted == std::vector<int64_t>{0, 1});
  CHECK(none.detection_score == std::vector<float>{0.0f, 0.0f});
  CHECK(none.detected == std::vector<uint8_t>{0, 0});
}

TEST_CASE("file metrics: counts and scores by hand", "[vote][metrics]") {
  // Labels / predictions over 3 classes, positive class 2; detection decisions per file.
  const std::vector<int64_t> y = {0, 0, 1, 1, 2, 2, 2};
  const std::vector<int64_t> pred = {0, 1, 1, 1, 2, 0, 2};
  const std::vector<uint8_t> det = {0, 1, 0, 0, 1, 0, 1};
  const metrics::Metrics m = metrics::file_metrics(y, pred, det, 3, 2);
  CHECK(m.count == 7);
  CHECK(m.confusion == std::vector<std::vector<int64_t>>{{1, 1, 0}, {0, 2, 0}, {1, 0, 2}});
  CHECK(m.det_confusion == std::vector<std::vector<int64_t>>{{3, 1}, {1, 2}});
  CHECK(m.accuracy == Approx(5.0 / 7));
  CHECK(m.per_class[1].precision == Approx(2.0 / 3));
  CHECK(m.per_class[1].recall == Approx(1.0));
  CHECK(m.per_class[2].f1 == Approx(0.8));
  CHECK(m.det_precision == Approx(2.0 / 3));
  CHECK(m.det_recall == Approx(2.0 / 3));
  CHECK(std::isnan(m.loss));
  CHECK(m.to_json({"a", "b", "c"})["per_class"]["c"]["support"] == 3);
  CHECK_THROWS_AS(metrics::file_metrics(y, pred, det, 2, 1), InvalidArgument);
  CHECK_THROWS_AS(metrics::file_metrics(y, {0}, det, 3, 2), InvalidArgument);
}

}  // namespace melforge_test_vote
