// SpecAugment: masks are whole frame columns and mel rows filled with the example's mean, widths within bounds and
// spread over [0, width], drawn per example, reproducible from a generator; options and shapes are checked.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include "catch_torch.h"
#include <set>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "test_skip.h"
#include "train/spec_augment.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_spec_augment {

using namespace melforge;
using trainer::SpecAugmentOptions;

namespace {

SpecAugmentOptions opts(int64_t tm, int64_t tw, int64_t fm, int64_t fw) {
  SpecAugmentOptions o;
  o.time_masks = tm;
  o.time_width = tw;
  o.freq_masks = fm;
  o.freq_width = fw;
  return o;
}

/// What one example's masking looks like, read back cell by cell from input and output.
struct Masked {
  std::vector<bool> rows, cols;
  bool consistent = true;
  int64_t col_runs = 0, row_runs = 0;
};

int64_t runs(const std::vector<bool>& v) {
  int64_t n = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] && (i == 0 || !v[i - 1])) ++n;
  return n;
}

/// Cells of `y` (one example [M, T]) differ from `x` exactly where a full row or a full column is masked, and
/// every masked cell holds the mean of `x` computed here in double.
Masked read_masks(const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor xd = x.to(torch::kDouble).contiguous(), yd = y.to(torch::kDouble).contiguous();
  const int64_t m = x.size(0), t = x.size(1);
  const double* xp = xd.data_ptr<double>();
  const double* yp = yd.data_ptr<double>();
  double mean = 0.0;
  for (int64_t i = 0; i < m * t; ++i) mean += xp[i];
  mean /= static_cast<double>(m * t);
  Masked r;
  r.rows.assign(m, true);
  r.cols.assign(t, true);
  std::vector<bool> cell(m * t);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < t; ++k) {
      const double a = xp[i * t + k], b = yp[i * t + k];
      const bool changed = a != b;
      cell[i * t + k] = changed;
      if (changed && std::abs(b - mean) > 1e-5 * (1.0 + std::abs(mean))) r.consistent = false;
      if (!changed) r.rows[i] = r.cols[k] = false;
    }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < t; ++k)
      if (cell[i * t + k] != (r.rows[i] || r.cols[k])) r.consistent = false;
  r.col_runs = runs(r.cols);
  r.row_runs = runs(r.rows);
  return r;
}

int64_t count(const std::vector<bool>& v) {
  int64_t n = 0;
  for (const bool b : v) n += b;
  return n;
}

}  // namespace

TEST_CASE("spec_augment masks whole columns and rows with the example mean", "[trainer][augment]") {
  const auto [m, t] = GENERATE(std::pair<int64_t, int64_t>{32, 40}, std::pair<int64_t, int64_t>{64, 101},
                               std::pair<int64_t, int64_t>{16, 8});
  const auto o = GENERATE(opts(2, 5, 0, 0), opts(0, 0, 2, 4), opts(2, 6, 1, 5), opts(3, 1, 3, 1));
  CAPTURE(m, t, o.time_masks, o.time_width, o.freq_masks, o.freq_width);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const int64_t batch = 24;
  const at::Tensor x = torch::randn({batch, m, t}, gen) * 3.0 - 40.0;
  const at::Tensor y = trainer::spec_augment(x, o, &gen);
  REQUIRE(y.sizes() == x.sizes());
  CHECK(y.scalar_type() == x.scalar_type());
  int64_t any_masked = 0;
  for (int64_t b = 0; b < batch; ++b) {
    CAPTURE(b);
    const Masked r = read_masks(x[b], y[b]);
    CHECK(r.consistent);
    const int64_t cols = count(r.cols), rows = count(r.rows);
    if (rows < m) {
      CHECK(cols <= o.time_masks * o.time_width);
      CHECK(r.col_runs <= o.time_masks);
    }
    if (cols < t) {
      CHECK(rows <= o.freq_masks * o.freq_width);
      CHECK(r.row_runs <= o.freq_masks);
    }
    any_masked += cols + rows > 0;
  }
  CHECK(any_masked > batch / 2);
}

TEST_CASE("spec_augment widths are uniform in [0, width], starts cover the whole axis, per example",
          "[trainer][augment]") {
  const bool time_axis = GENERATE(true, false);
  const int64_t width = GENERATE(1, 7);
  CAPTURE(time_axis, width);
  const int64_t batch = 4000, m = 24, t = 30;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(123);
  const at::Tensor x = torch::randn({batch, m, t}, gen);
  const auto o = time_axis ? opts(1, width, 0, 0) : opts(0, 0, 1, width);
  const at::Tensor y = trainer::spec_augment(x, o, &gen);
  std::vector<int64_t> width_hist(width + 1, 0);
  const int64_t size = time_axis ? t : m;
  std::vector<int64_t> covered(size, 0);
  std::set<std::vector<bool>> distinct;
  for (int64_t b = 0; b < batch; ++b) {
    const Masked r = read_masks(x[b], y[b]);
    REQUIRE(r.consistent);
    const auto& band = time_axis ? r.cols : r.rows;
    const int64_t w = count(band);
    REQUIRE(w <= width);
    REQUIRE(r.col_runs + r.row_runs <= 1);
    ++width_hist[w];
    for (int64_t i = 0; i < size; ++i) covered[i] += band[i];
    distinct.insert(band);
  }
  const double expected = static_cast<double>(batch) / static_cast<double>(width + 1);
  for (int64_t w = 0; w <= width; ++w) {
    CAPTURE(w, width_hist[w]);
    CHECK(std::abs(static_cast<double>(width_hist[w]) - expected) < 5.0 * std::sqrt(expected));
  }
  CHECK(covered.front() > 0);
  CHECK(covered.back() > 0);
  CHECK(static_cast<int64_t>(distinct.size()) > std::min<int64_t>(size, 10));
}

TEST_CASE("spec_augment is reproducible from a generator and off by default", "[trainer][augment]") {
  const auto o = opts(2, 4, 2, 3);
  const at::Tensor x = torch::randn({8, 16, 20});
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(5);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(5);
  auto g3 = at::make_generator<at::CPUGeneratorImpl>(6);
  const at::Tensor a = trainer::spec_augment(x, o, &g1);
  CHECK(torch::equal(a, trainer::spec_augment(x, o, &g2)));
  CHECK_FALSE(torch::equal(a, trainer::spec_augment(x, o, &g3)));
  CHECK_FALSE(torch::equal(a, x));

  const SpecAugmentOptions off;
  CHECK_FALSE(off.enabled());
  CHECK(trainer::spec_augment(x, off).is_same(x));
  CHECK(trainer::spec_augment(x, opts(3, 0, 0, 0)).is_same(x));
  CHECK(trainer::spec_augment(x, opts(0, 0, 0, 5)).is_same(x));
  CHECK(opts(1, 1, 0, 0).enabled());
  CHECK(opts(0, 0, 1, 1).enabled());
}

TEST_CASE("spec_augment accepts [B, 1, M, T], other float types and widths beyond the axis", "[trainer][augment]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x = torch::randn({6, 1, 12, 10}, gen);
  const at::Tensor y = trainer::spec_augment(x, opts(1, 4, 1, 3), &gen);
  CHECK(y.sizes() == x.sizes());
  for (int64_t b = 0; b < 6; ++b) CHECK(read_masks(x[b][0], y[b][0]).consistent);

  const at::Tensor xd = torch::randn({4, 8, 6}, gen).to(torch::kDouble);
  const at::Tensor yd = trainer::spec_augment(xd, opts(1, 3, 1, 3), &gen);
  CHECK(yd.scalar_type() == torch::kDouble);
  const at::Tensor xh = torch::randn({4, 8, 6}, gen).to(torch::kHalf);
  CHECK(trainer::spec_augment(xh, opts(1, 3, 1, 3), &gen).scalar_type() == torch::kHalf);

  const at::Tensor small = torch::randn({200, 5, 4}, gen);
  const at::Tensor ys = trainer::spec_augment(small, opts(1, 50, 0, 0), &gen);
  bool full = false;
  for (int64_t b = 0; b < 200; ++b) {
    const Masked r = read_masks(small[b], ys[b]);
    CHECK(r.consistent);
    full = full || count(r.cols) == 4;
  }
  CHECK(full);
}

TEST_CASE("spec_augment with lengths masks real frames only, filled with the mean of the real cells",
          "[trainer][augment]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  const int64_t b = 300, m = 6, t = 12;
  const at::Tensor x = torch::randn({b, m, t}, gen);
  const at::Tensor lengths = torch::randint(1, t + 1, {b}, gen, torch::kLong);
  const at::Tensor y = trainer::spec_augment(x, opts(2, 5, 1, 3), &gen, lengths);
  int64_t masked_rows = 0, masked_cols = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = lengths[i].item<int64_t>();
    CAPTURE(i, len);
    CHECK(torch::equal(x[i].narrow(1, len, t - len), y[i].narrow(1, len, t - len)));
    const Masked r = read_masks(x[i].narrow(1, 0, len), y[i].narrow(1, 0, len));
    CHECK(r.consistent);
    CHECK(r.col_runs <= 2);
    CHECK(r.row_runs <= 1);
    masked_rows += count(r.rows) > 0 && count(r.cols) < len;
    masked_cols += count(r.cols) > 0;
  }
  CHECK(masked_rows > b / 4);
  CHECK(masked_cols > b / 4);
  CHECK_THROWS_AS(trainer::spec_augment(x, opts(1, 2, 0, 0), &gen, lengths.narrow(0, 0, 3)), InvalidArgument);
}

TEST_CASE("spec_augment with full lengths masks as without them", "[trainer][augment]") {
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(17);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(17);
  const at::Tensor x = torch::randn({8, 10, 14});
  const at::Tensor full = torch::full({8}, 14, torch::kLong);
  CHECK(torch::equal(trainer::spec_augment(x, opts(2, 4, 2, 3), &g1),
                     trainer::spec_augment(x, opts(2, 4, 2, 3), &g2, full)));
}

TEST_CASE("spec_augment refuses negative options and other shapes", "[trainer][augment]") {
  CHECK_NOTHROW(SpecAugmentOptions{}.validate());
  CHECK_THROWS_AS(opts(-1, 0, 0, 0).validate(), InvalidArgument);
  CHECK_THROWS_AS(opts(0, -1, 0, 0).validate(), InvalidArgument);
  CHECK_THROWS_AS(opts(0, 0, -1, 0).validate(), InvalidArgument);
  CHECK_THROWS_AS(opts(0, 0, 0, -2).validate(), InvalidArgument);
  const auto o = opts(1, 2, 1, 2);
  CHECK_THROWS_AS(trainer::spec_augment(torch::zeros({4, 4}), o), InvalidArgument);
  CHECK_THROWS_AS(trainer::spec_augment(torch::zeros({2, 3, 4, 4}), o), InvalidArgument);
  CHECK_THROWS_AS(trainer::spec_augment(torch::zeros({2, 4, 4}, torch::kLong), o), InvalidArgument);

  namespace po = boost::program_options;
  SpecAugmentOptions parsed;
  po::options_description desc;
  trainer::add_options(desc, parsed);
  const char* argv[] = {"x", "--spec-time-masks", "2", "--spec-time-width", "7", "--spec-freq-masks", "1",
                        "--spec-freq-width", "3"};
  po::variables_map vm;
  po::store(po::parse_command_line(9, argv, desc), vm);
  po::notify(vm);
  CHECK(parsed.time_masks == 2);
  CHECK(parsed.time_width == 7);
  CHECK(parsed.freq_masks == 1);
  CHECK(parsed.freq_width == 3);
}

TEST_CASE("spec_augment on CUDA keeps the tensor on the device with the same mask structure",
          "[trainer][augment][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  const at::Tensor x = torch::randn({32, 40, 50});
  const at::Tensor y = trainer::spec_augment(x.to(torch::kCUDA), opts(2, 8, 2, 6));
  CHECK(y.is_cuda());
  const at::Tensor yc = y.cpu();
  int64_t masked = 0;
  for (int64_t b = 0; b < 32; ++b) {
    const Masked r = read_masks(x[b], yc[b]);
    CHECK(r.consistent);
    masked += count(r.cols) + count(r.rows) > 0;
  }
  CHECK(masked > 16);
}

}  // namespace melforge_test_trainer_spec_augment
