#include "vote/vote.h"

#include <cmath>

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

/// One file: `p` [L, S, C], `d` [L, S], `n` valid long segments.
void vote_file(const float* p, const float* d, int64_t n, const VoteShape& s, Vote vote, double threshold,
               float* class_probs, int64_t& predicted, float& score, uint8_t& detected) {
  const int64_t S = s.num_short, C = s.num_classes;
  std::vector<double> long_p(static_cast<std::size_t>(C)), mean(static_cast<std::size_t>(C), 0.0),
      votes(static_cast<std::size_t>(C), 0.0);
  double det_sum = 0, det_votes = 0;
  for (int64_t l = 0; l < n; ++l) {
    std::fill(long_p.begin(), long_p.end(), 0.0);
    double long_d = 0;
    for (int64_t k = 0; k < S; ++k) {
      for (int64_t c = 0; c < C; ++c) long_p[c] += p[(l * S + k) * C + c];
      long_d += d[l * S + k];
    }
    for (int64_t c = 0; c < C; ++c) {
      long_p[c] /= static_cast<double>(S);
      mean[c] += long_p[c];
    }
    long_d /= static_cast<double>(S);
    det_sum += long_d;
    det_votes += long_d >= threshold ? 1.0 : 0.0;
    votes[static_cast<std::size_t>(first_argmax(long_p.data(), C))] += 1.0;
  }
  const double nd = static_cast<double>(n);
  for (auto& m : mean) m /= nd;
  if (vote == Vote::mean) {
    for (int64_t c = 0; c < C; ++c) class_probs[c] = static_cast<float>(mean[c]);
    predicted = first_argmax(mean.data(), C);
    score = static_cast<float>(det_sum / nd);
    detected = det_sum / nd >= threshold ? 1 : 0;
    return;
  }
  int64_t best = 0;
  for (int64_t c = 1; c < C; ++c)
    if (votes[c] > votes[best] || (votes[c] == votes[best] && mean[c] > mean[best])) best = c;
  for (int64_t c = 0; c < C; ++c) class_probs[c] = static_cast<float>(votes[c] / nd);
  predicted = best;
  score = static_cast<float>(det_votes / nd);
  detected = det_votes / nd > 0.5 ? 1 : 0;
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
  FileVotes out;
  out.class_probs.resize(static_cast<std::size_t>(F * C));
  out.predicted.resize(static_cast<std::size_t>(F));
  out.detection_score.resize(static_cast<std::size_t>(F));
  out.detected.resize(static_cast<std::size_t>(F));
  for (int64_t f = 0; f < F; ++f)
    vote_file(probs.data() + f * L * S * C, det_probs.data() + f * L * S, num_valid_long[f], shape, vote, threshold,
              out.class_probs.data() + f * C, out.predicted[f], out.detection_score[f], out.detected[f]);
  return out;
}

}  // namespace melforge::vote
