#include <algorithm>
#include <cmath>
#include <functional>

#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "verification/verification.h"

namespace melforge::verification {

namespace {

void check_shape(int64_t rows, int64_t dim, const char* what) {
  if (rows <= 0 || dim <= 0)
    throw InvalidArgument(std::string(what) + ": embeddings must have rows and dim > 0, got [" +
                          std::to_string(rows) + ", " + std::to_string(dim) + "]");
}

void check_indices(const std::vector<Trial>& trials, int64_t rows) {
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const Trial& t = trials[i];
    if (t.enroll < 0 || t.enroll >= rows || t.test < 0 || t.test >= rows)
      throw InvalidArgument("trial " + std::to_string(i) + " (" + std::to_string(t.enroll) + ", " +
                            std::to_string(t.test) + ") refers to a row outside the " + std::to_string(rows) +
                            " embeddings");
  }
}

double dot(const float* a, const float* b, int64_t dim) {
  double s = 0;
  for (int64_t k = 0; k < dim; ++k) s += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  return s;
}

/// Euclidean norm of row `r`; throws InvalidArgument naming `what` and the row when it is zero or not finite.
double row_norm(const float* data, int64_t r, int64_t dim, const char* what) {
  const float* row = data + r * dim;
  const double n = std::sqrt(dot(row, row, dim));
  if (!(n > 0) || !std::isfinite(n))
    throw InvalidArgument(std::string(what) + " row " + std::to_string(r) +
                          " has a zero or non-finite norm: its cosine similarity is undefined");
  return n;
}

/// Norms of the rows that `trials` use (0 for the others).
std::vector<double> used_norms(const float* embeddings, int64_t rows, int64_t dim, const std::vector<Trial>& trials) {
  std::vector<double> norms(static_cast<std::size_t>(rows), 0.0);
  for (const Trial& t : trials)
    for (const int64_t r : {t.enroll, t.test})
      if (norms[static_cast<std::size_t>(r)] == 0) norms[static_cast<std::size_t>(r)] = row_norm(embeddings, r, dim,
                                                                                                   "embedding");
  return norms;
}

double cosine(const float* embeddings, int64_t dim, const std::vector<double>& norms, const Trial& t) {
  return dot(embeddings + t.enroll * dim, embeddings + t.test * dim, dim) /
         (norms[static_cast<std::size_t>(t.enroll)] * norms[static_cast<std::size_t>(t.test)]);
}

struct TopKStats {
  double mean = 0, sd = 0;
};

/// Mean and population standard deviation of the top_k largest cosine scores of `row` (norm `norm`) against the
/// cohort.
TopKStats cohort_stats(const float* row, double norm, const float* cohort, const std::vector<double>& cohort_norms,
                       int64_t dim, int64_t top_k, std::vector<double>& scratch) {
  scratch.resize(cohort_norms.size());
  for (std::size_t c = 0; c < cohort_norms.size(); ++c)
    scratch[c] = dot(row, cohort + static_cast<int64_t>(c) * dim, dim) / (norm * cohort_norms[c]);
  std::nth_element(scratch.begin(), scratch.begin() + (top_k - 1), scratch.end(), std::greater<>());
  double sum = 0;
  for (int64_t k = 0; k < top_k; ++k) sum += scratch[static_cast<std::size_t>(k)];
  const double mean = sum / static_cast<double>(top_k);
  double var = 0;
  for (int64_t k = 0; k < top_k; ++k) var += (scratch[static_cast<std::size_t>(k)] - mean) *
                                             (scratch[static_cast<std::size_t>(k)] - mean);
  return {mean, std::sqrt(var / static_cast<double>(top_k))};
}

}  // namespace

std::vector<float> cosine_scores(const float* embeddings, int64_t rows, int64_t dim, const std::vector<Trial>& trials) {
  check_shape(rows, dim, "cosine_scores");
  check_indices(trials, rows);
  const std::vector<double> norms = used_norms(embeddings, rows, dim, trials);
  std::vector<float> out;
  out.reserve(trials.size());
  for (const Trial& t : trials) out.push_back(static_cast<float>(cosine(embeddings, dim, norms, t)));
  return out;
}

std::vector<float> as_norm(const float* embeddings, int64_t rows, int64_t dim, const std::vector<Trial>& trials,
                           const float* cohort, int64_t cohort_rows, int64_t top_k, int threads) {
  check_shape(rows, dim, "as_norm");
  if (cohort_rows < 2)
    throw InvalidArgument("as_norm: the cohort needs at least 2 embeddings, got " + std::to_string(cohort_rows));
  if (top_k < 2) throw InvalidArgument("as_norm: top_k must be >= 2, got " + std::to_string(top_k));
  top_k = std::min(top_k, cohort_rows);
  check_indices(trials, rows);
  const std::vector<double> norms = used_norms(embeddings, rows, dim, trials);
  std::vector<double> cohort_norms(static_cast<std::size_t>(cohort_rows));
  for (int64_t c = 0; c < cohort_rows; ++c)
    cohort_norms[static_cast<std::size_t>(c)] = row_norm(cohort, c, dim, "cohort");
  std::vector<int64_t> used;
  for (int64_t r = 0; r < rows; ++r)
    if (norms[static_cast<std::size_t>(r)] > 0) used.push_back(r);
  std::vector<TopKStats> stats(static_cast<std::size_t>(rows));
  parallel_ranges(static_cast<int64_t>(used.size()), resolve_threads(threads), [&](int, int64_t begin, int64_t end) {
    std::vector<double> scratch;
    for (int64_t i = begin; i < end; ++i) {
      const auto r = static_cast<std::size_t>(used[static_cast<std::size_t>(i)]);
      stats[r] = cohort_stats(embeddings + static_cast<int64_t>(r) * dim, norms[r], cohort, cohort_norms, dim, top_k,
                              scratch);
      if (!(stats[r].sd > 0))
        throw InvalidArgument("as_norm: the top " + std::to_string(top_k) + " cohort scores of row " +
                              std::to_string(r) + " are all equal, so they cannot normalise its scores");
    }
  });
  std::vector<float> out;
  out.reserve(trials.size());
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const double s = cosine(embeddings, dim, norms, trials[i]);
    const TopKStats& e = stats[static_cast<std::size_t>(trials[i].enroll)];
    const TopKStats& t = stats[static_cast<std::size_t>(trials[i].test)];
    out.push_back(static_cast<float>(0.5 * ((s - e.mean) / e.sd + (s - t.mean) / t.sd)));
  }
  return out;
}

}  // namespace melforge::verification
