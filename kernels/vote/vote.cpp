#include "vote/vote.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "melforge/common/errors.h"

namespace melforge::vote {

namespace {

void check_inputs(std::span<const float> probs, std::span<const float> det_probs,
                  std::span<const int64_t> num_valid_long, const VoteShape& s, double threshold) {
  if (s.files < 0 || s.num_long < 1 || s.num_short < 1 || s.num_classes < 1)
    throw InvalidArgument("aggregate_files: shape [F, L, S, C] = [" + std::to_string(s.files) + ", " +
                          std::to_string(s.num_long) + ", " + std::to_string(s.num_short) + ", " +
                          std::to_string(s.num_classes) + "] needs F >= 0 and L, S, C >= 1");
  const auto segs = static_cast<std::size_t>(s.files * s.num_long * s.num_short);
  if (probs.size() != segs * static_cast<std::size_t>(s.num_classes) || det_probs.size() != segs ||
      num_valid_long.size() != static_cast<std::size_t>(s.files))
    throw InvalidArgument("aggregate_files: expected probs [F, L, S, C], det_probs [F, L, S], num_valid_long [F] "
                          "with [F, L, S, C] = [" + std::to_string(s.files) + ", " + std::to_string(s.num_long) +
                          ", " + std::to_string(s.num_short) + ", " + std::to_string(s.num_classes) + "]");
  for (std::size_t f = 0; f < num_valid_long.size(); ++f)
    if (num_valid_long[f] < 1 || num_valid_long[f] > s.num_long)
      throw InvalidArgument("aggregate_files: num_valid_long[" + std::to_string(f) + "] = " +
                            std::to_string(num_valid_long[f]) + " is outside [1, " + std::to_string(s.num_long) +
                            "]");
  if (!std::isfinite(threshold))
    throw InvalidArgument("aggregate_files: the threshold must be finite");
}

/// Index of the first maximal element of v[0, n).
int64_t first_argmax(const double* v, int64_t n) {
  int64_t best = 0;
  for (int64_t c = 1; c < n; ++c)
    if (v[c] > v[best]) best = c;
  return best;
}

/// The units (examples, or long segments) of one clip, added one at a time, and the vote over them.
class Tally {
 public:
  explicit Tally(int64_t num_classes)
      : mean_(static_cast<std::size_t>(num_classes), 0.0), votes_(static_cast<std::size_t>(num_classes), 0.0) {}

  /// Adds a unit of class probabilities `p` [C] and detection probability `d`.
  void add(const double* p, double d, double threshold) {
    const auto C = static_cast<int64_t>(mean_.size());
    for (int64_t c = 0; c < C; ++c) mean_[static_cast<std::size_t>(c)] += p[c];
    votes_[static_cast<std::size_t>(first_argmax(p, C))] += 1.0;
    det_sum_ += d;
    det_votes_ += d >= threshold ? 1.0 : 0.0;
    ++n_;
  }
  int64_t units() const { return n_; }

  /// The vote over the units added (at least one) into the clip's outputs.
  void finish(Vote vote, double threshold, float* class_probs, int64_t& predicted, float& score,
              uint8_t& detected) const {
    const auto C = static_cast<int64_t>(mean_.size());
    const double nd = static_cast<double>(n_);
    std::vector<double> mean(mean_);
    for (auto& m : mean) m /= nd;
    if (vote == Vote::mean) {
      for (int64_t c = 0; c < C; ++c) class_probs[c] = static_cast<float>(mean[static_cast<std::size_t>(c)]);
      predicted = first_argmax(mean.data(), C);
      score = static_cast<float>(det_sum_ / nd);
      detected = det_sum_ / nd >= threshold ? 1 : 0;
      return;
    }
    int64_t best = 0;
    for (int64_t c = 1; c < C; ++c) {
      const auto k = static_cast<std::size_t>(c), b = static_cast<std::size_t>(best);
      if (votes_[k] > votes_[b] || (votes_[k] == votes_[b] && mean[k] > mean[b])) best = c;
    }
    for (int64_t c = 0; c < C; ++c) class_probs[c] = static_cast<float>(votes_[static_cast<std::size_t>(c)] / nd);
    predicted = best;
    score = static_cast<float>(det_votes_ / nd);
    detected = det_votes_ / nd > 0.5 ? 1 : 0;
  }

 private:
  std::vector<double> mean_, votes_;
  double det_sum_ = 0, det_votes_ = 0;
  int64_t n_ = 0;
};

/// One file: `p` [L, S, C], `d` [L, S], `n` valid long segments; each long segment (its short segments averaged
/// first) is a unit.
void vote_file(const float* p, const float* d, int64_t n, const VoteShape& s, Vote vote, double threshold,
               float* class_probs, int64_t& predicted, float& score, uint8_t& detected) {
  const int64_t S = s.num_short, C = s.num_classes;
  std::vector<double> long_p(static_cast<std::size_t>(C));
  Tally tally(C);
  for (int64_t l = 0; l < n; ++l) {
    std::fill(long_p.begin(), long_p.end(), 0.0);
    double long_d = 0;
    for (int64_t k = 0; k < S; ++k) {
      for (int64_t c = 0; c < C; ++c) long_p[static_cast<std::size_t>(c)] += p[(l * S + k) * C + c];
      long_d += d[l * S + k];
    }
    for (auto& v : long_p) v /= static_cast<double>(S);
    tally.add(long_p.data(), long_d / static_cast<double>(S), threshold);
  }
  tally.finish(vote, threshold, class_probs, predicted, score, detected);
}

FileVotes sized_votes(int64_t files, int64_t num_classes) {
  FileVotes out;
  out.class_probs.resize(static_cast<std::size_t>(files * num_classes));
  out.predicted.resize(static_cast<std::size_t>(files));
  out.detection_score.resize(static_cast<std::size_t>(files));
  out.detected.resize(static_cast<std::size_t>(files));
  return out;
}

void check_clip_inputs(std::span<const float> probs, std::span<const float> det_probs,
                       std::span<const int64_t> clip, int64_t clips, int64_t num_classes, double threshold) {
  if (clips < 0 || num_classes < 1)
    throw InvalidArgument("vote_clips: " + std::to_string(clips) + " clips of " + std::to_string(num_classes) +
                          " classes (needs clips >= 0 and classes >= 1)");
  const auto E = clip.size();
  if (probs.size() != E * static_cast<std::size_t>(num_classes) || (!det_probs.empty() && det_probs.size() != E))
    throw InvalidArgument("vote_clips: expected probs [E, C], det_probs [E] or none and clip [E] with E = " +
                          std::to_string(E) + ", C = " + std::to_string(num_classes) + "; got " +
                          std::to_string(probs.size()) + " probabilities and " + std::to_string(det_probs.size()) +
                          " detection probabilities");
  for (std::size_t e = 0; e < E; ++e)
    if (clip[e] < 0 || clip[e] >= clips)
      throw InvalidArgument("vote_clips: example " + std::to_string(e) + " names clip " + std::to_string(clip[e]) +
                            ", outside [0, " + std::to_string(clips) + ")");
  if (!std::isfinite(threshold)) throw InvalidArgument("vote_clips: the threshold must be finite");
}

}  // namespace

std::string to_string(Vote v) { return v == Vote::mean ? "mean" : "majority"; }

Vote parse_vote(const std::string& s) {
  if (s == "mean") return Vote::mean;
  if (s == "majority") return Vote::majority;
  throw InvalidArgument("--vote: '" + s + "' is not one of mean, majority");
}

FileVotes aggregate_files(std::span<const float> probs, std::span<const float> det_probs,
                          std::span<const int64_t> num_valid_long, const VoteShape& shape, Vote vote,
                          double threshold) {
  check_inputs(probs, det_probs, num_valid_long, shape, threshold);
  const int64_t F = shape.files, L = shape.num_long, S = shape.num_short, C = shape.num_classes;
  FileVotes out = sized_votes(F, C);
  for (int64_t f = 0; f < F; ++f)
    vote_file(probs.data() + f * L * S * C, det_probs.data() + f * L * S, num_valid_long[f], shape, vote, threshold,
              out.class_probs.data() + f * C, out.predicted[f], out.detection_score[f], out.detected[f]);
  return out;
}

FileVotes vote_clips(std::span<const float> probs, std::span<const float> det_probs, std::span<const int64_t> clip,
                     int64_t clips, int64_t num_classes, Vote vote, double threshold) {
  check_clip_inputs(probs, det_probs, clip, clips, num_classes, threshold);
  const int64_t C = num_classes;
  std::vector<Tally> tallies(static_cast<std::size_t>(clips), Tally(C));
  std::vector<double> p(static_cast<std::size_t>(C));
  for (std::size_t e = 0; e < clip.size(); ++e) {
    for (int64_t c = 0; c < C; ++c) p[static_cast<std::size_t>(c)] = probs[e * static_cast<std::size_t>(C) + c];
    tallies[static_cast<std::size_t>(clip[e])].add(p.data(), det_probs.empty() ? 0.0 : det_probs[e], threshold);
  }
  FileVotes out = sized_votes(clips, C);
  for (int64_t f = 0; f < clips; ++f) {
    const Tally& t = tallies[static_cast<std::size_t>(f)];
    if (t.units() == 0)
      throw InvalidArgument("vote_clips: clip " + std::to_string(f) + " has no example, so it cannot be scored");
    const auto k = static_cast<std::size_t>(f);
    t.finish(vote, threshold, out.class_probs.data() + f * C, out.predicted[k], out.detection_score[k],
             out.detected[k]);
  }
  if (det_probs.empty()) {
    std::fill(out.detection_score.begin(), out.detection_score.end(), 0.0f);
    std::fill(out.detected.begin(), out.detected.end(), uint8_t{0});
  }
  return out;
}

std::string to_string(Aggregate a) { return a == Aggregate::mean ? "mean" : "max"; }

Aggregate parse_aggregate(const std::string& s) {
  if (s == "mean") return Aggregate::mean;
  if (s == "max") return Aggregate::max;
  throw InvalidArgument("--aggregate: '" + s + "' is not one of mean, max");
}

ClipLabels multilabel_clips(std::span<const float> probs, std::span<const int64_t> clip, int64_t clips,
                            int64_t num_classes, Aggregate how, double threshold) {
  check_clip_inputs(probs, {}, clip, clips, num_classes, threshold);
  const auto C = static_cast<std::size_t>(num_classes), F = static_cast<std::size_t>(clips);
  std::vector<double> acc(F * C, how == Aggregate::max ? -1.0 : 0.0);
  std::vector<int64_t> units(F, 0);
  for (std::size_t e = 0; e < clip.size(); ++e) {
    const auto f = static_cast<std::size_t>(clip[e]);
    ++units[f];
    for (std::size_t c = 0; c < C; ++c) {
      const double p = probs[e * C + c];
      acc[f * C + c] = how == Aggregate::max ? std::max(acc[f * C + c], p) : acc[f * C + c] + p;
    }
  }
  ClipLabels out{std::vector<float>(F * C), std::vector<uint8_t>(F * C)};
  for (std::size_t f = 0; f < F; ++f) {
    if (units[f] == 0)
      throw InvalidArgument("multilabel_clips: clip " + std::to_string(f) + " has no example, so it cannot be scored");
    for (std::size_t c = 0; c < C; ++c) {
      const double v = how == Aggregate::max ? acc[f * C + c] : acc[f * C + c] / static_cast<double>(units[f]);
      out.scores[f * C + c] = static_cast<float>(v);
      out.labels[f * C + c] = static_cast<double>(out.scores[f * C + c]) >= threshold ? 1 : 0;
    }
  }
  return out;
}

}  // namespace melforge::vote
