// --mixup: the mixed batch, the mixed losses and the mixed multi-label targets against naive references for a fixed
// lambda and permutation; the Beta draws (reproducible by seed, moments of Beta(a, a)); validation before any work;
// alpha 0 bit-exact with no mixup; resume bit-exact with mixup; the flag refused when resuming with another value.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/tensor.h>

#include <boost/program_options.hpp>
#include "catch_torch.h"
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "melforge/common/errors.h"
#include "models/model.h"
#include "test_util.h"
#include "train/config.h"
#include "train/mixup.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_mixup {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A draw with a chosen lambda and permutation, on the CPU.
trainer::MixupDraw fixed_draw(float lambda, const std::vector<int64_t>& perm) {
  trainer::MixupDraw d;
  d.lambda = at::tensor(lambda);
  d.perm = at::tensor(perm, at::kLong);
  return d;
}

/// The values of a tensor as doubles (CPU, contiguous).
std::vector<double> values(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

/// A permutation of [0, n) that moves every element (a rotation by `shift`, 0 < shift < n).
std::vector<int64_t> rotation(int64_t n, int64_t shift) {
  std::vector<int64_t> p(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = (i + shift) % n;
  return p;
}

double log_sigmoid(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

/// Naive mixup loss of one batch in double: lambda (CE(y) + w BCE(y == pos)) + (1 - lambda) (the same for y[perm]),
/// with the BCE's positive term weighted by pw.
double naive_mixed_loss(const std::vector<double>& logits, const std::vector<double>& det,
                        const std::vector<int64_t>& y, const std::vector<int64_t>& perm, int64_t classes, double lambda,
                        int64_t pos, double w, double pw) {
  const auto one = [&](int64_t b, int64_t label) {
    double mx = -1e300, sum = 0;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, logits[b * classes + c]);
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(logits[b * classes + c] - mx);
    const double ce = std::log(sum) + mx - logits[b * classes + label];
    if (pos < 0) return ce;
    const double t = label == pos ? 1.0 : 0.0, z = det[b];
    return ce + w * -(pw * t * log_sigmoid(z) + (1 - t) * log_sigmoid(-z));
  };
  const int64_t n = static_cast<int64_t>(y.size());
  double own = 0, partner = 0;
  for (int64_t b = 0; b < n; ++b) {
    own += one(b, y[b]);
    partner += one(b, y[perm[b]]);
  }
  return (lambda * own + (1 - lambda) * partner) / static_cast<double>(n);
}

}  // namespace

TEST_CASE("mix_batch is lambda x + (1 - lambda) x[perm] for a fixed lambda and permutation", "[trainer][mixup]") {
  using Shape = std::tuple<int64_t, int64_t, int64_t>;
  const auto [b, m, t] = GENERATE(Shape{2, 4, 5}, Shape{7, 32, 16}, Shape{16, 8, 3});
  const float lambda = GENERATE(0.0f, 0.3f, 0.85f, 1.0f);
  const bool four_d = GENERATE(false, true);
  CAPTURE(b, m, t, lambda, four_d);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = four_d ? at::randn({b, 1, m, t}, gen) : at::randn({b, m, t}, gen);
  const std::vector<int64_t> perm = rotation(b, 1 + b / 3);
  const at::Tensor mixed = trainer::mix_batch(x, fixed_draw(lambda, perm));
  REQUIRE(mixed.sizes() == x.sizes());
  CHECK(mixed.scalar_type() == x.scalar_type());
  const std::vector<double> xv = values(x), yv = values(mixed);
  const int64_t cells = x.numel() / b;
  double worst = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t k = 0; k < cells; ++k) {
      const double want = lambda * xv[i * cells + k] + (1.0 - lambda) * xv[perm[i] * cells + k];
      worst = std::max(worst, std::abs(yv[i * cells + k] - want));
    }
  CHECK(worst < 1e-5);
  if (lambda == 1.0f) CHECK(at::equal(mixed, x));
}

TEST_CASE("the mixed multiclass loss equals a naive lambda CE(y) + (1 - lambda) CE(y[perm]) with the detection BCE",
          "[trainer][mixup]") {
  const int64_t b = GENERATE(3, 16);
  const int64_t classes = GENERATE(2, 5);
  const int64_t pos = GENERATE(-1, 1);
  const double pw = GENERATE(1.0, 3.5);
  const float lambda = GENERATE(0.2f, 0.7f);
  CAPTURE(b, classes, pos, pw, lambda);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  trainer::ModelOutput out;
  out.logits = at::randn({b, classes}, gen) * 2.0;
  out.detection = at::randn({b}, gen);
  const at::Tensor y = at::randint(0, classes, {b}, gen, at::kLong);
  const std::vector<int64_t> perm = rotation(b, 2);
  const trainer::MixupDraw draw = fixed_draw(lambda, perm);
  const double w = 0.5;
  const at::Tensor pwt = pw == 1.0 ? at::Tensor() : at::tensor(static_cast<float>(pw));
  const at::Tensor own = trainer::combined_loss(out, y, pos, w, pwt);
  const at::Tensor partner = trainer::combined_loss(out, y.index_select(0, draw.perm), pos, w, pwt);
  const double got = trainer::mix_losses(own, partner, draw).item<double>();
  const std::vector<double> yd = values(y);
  const std::vector<int64_t> yl(yd.begin(), yd.end());
  const double want =
      naive_mixed_loss(values(out.logits), values(out.detection), yl, perm, classes, lambda, pos, w, pw);
  CHECK(got == Approx(want).epsilon(1e-5));
}

TEST_CASE("mixed multi-label targets are lambda t + (1 - lambda) t[perm]", "[trainer][mixup]") {
  const int64_t b = GENERATE(2, 9), c = GENERATE(1, 4);
  const float lambda = GENERATE(0.25f, 0.5f);
  CAPTURE(b, c, lambda);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor t = at::randint(0, 2, {b, c}, gen, at::kByte);
  const std::vector<int64_t> perm = rotation(b, 1);
  const at::Tensor mixed = trainer::mix_targets(t, fixed_draw(lambda, perm));
  REQUIRE(mixed.sizes() == t.sizes());
  CHECK(mixed.scalar_type() == at::kFloat);
  const std::vector<double> tv = values(t), mv = values(mixed);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t k = 0; k < c; ++k) {
      CAPTURE(i, k);
      CHECK(mv[i * c + k] == Approx(lambda * tv[i * c + k] + (1 - lambda) * tv[perm[i] * c + k]).margin(1e-6));
    }
}

TEST_CASE("mixed lengths are the union of the two rows' real frames", "[trainer][mixup]") {
  const int64_t b = GENERATE(1, 4, 9);
  const int64_t shift = b > 1 ? GENERATE_COPY(range<int64_t>(1, b)) : 0;
  CAPTURE(b, shift);
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < b; ++i) lengths.push_back(1 + (i * 7) % 13);
  const std::vector<int64_t> perm = rotation(b, std::max<int64_t>(shift, 1) % std::max<int64_t>(b, 1));
  const at::Tensor mixed = trainer::mix_lengths(at::tensor(lengths, at::kLong), fixed_draw(0.3f, perm));
  REQUIRE(mixed.scalar_type() == at::kLong);
  for (int64_t i = 0; i < b; ++i)
    CHECK(mixed[i].item<int64_t>() == std::max(lengths[static_cast<std::size_t>(i)],
                                               lengths[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])]));
}

TEST_CASE("draw_mixup is reproducible by seed, draws a permutation and Beta(alpha, alpha) weights",
          "[trainer][mixup]") {
  const double alpha = GENERATE(0.05, 0.4, 2.0);
  CAPTURE(alpha);
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(7), g2 = at::make_generator<at::CPUGeneratorImpl>(7);
  auto g3 = at::make_generator<at::CPUGeneratorImpl>(8);
  const trainer::MixupDraw a = trainer::draw_mixup(12, alpha, at::kCPU, &g1);
  const trainer::MixupDraw b = trainer::draw_mixup(12, alpha, at::kCPU, &g2);
  CHECK(at::equal(a.lambda, b.lambda));
  CHECK(at::equal(a.perm, b.perm));
  CHECK(at::equal(std::get<0>(at::sort(a.perm)), at::arange(12, at::kLong)));
  const trainer::MixupDraw c = trainer::draw_mixup(12, alpha, at::kCPU, &g3);
  CHECK_FALSE((at::equal(a.lambda, c.lambda) && at::equal(a.perm, c.perm)));

  const int n = 20000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double l = trainer::draw_mixup(1, alpha, at::kCPU, &g1).lambda.item<double>();
    REQUIRE(l >= 0.0);
    REQUIRE(l <= 1.0);
    sum += l;
    sum2 += l * l;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  const double want_var = 1.0 / (4.0 * (2.0 * alpha + 1.0));
  CAPTURE(mean, var, want_var);
  CHECK(std::abs(mean - 0.5) < 5.0 * std::sqrt(want_var / n));
  CHECK(var == Approx(want_var).epsilon(0.05));
  CHECK(trainer::draw_mixup(0, alpha, at::kCPU, &g1).perm.numel() == 0);
}

TEST_CASE("mixup ALPHA is validated before any work, and refused with --cuda-graph", "[trainer][mixup]") {
  const double bad = GENERATE(-0.1, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity());
  CAPTURE(bad);
  trainer::MixupOptions o;
  CHECK_NOTHROW(o.validate());
  o.alpha = bad;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("--mixup"));
  CHECK_THROWS_AS(trainer::draw_mixup(4, bad, at::kCPU), InvalidArgument);
  CHECK_THROWS_AS(trainer::draw_mixup(4, 0.0, at::kCPU), InvalidArgument);

  TempDir d;
  auto c = test::tiny_config(d / "no-such-data", d / "run", 1);
  c.mixup.alpha = bad;
  std::ostringstream log;
  CHECK_THROWS_AS(trainer::train(c, log), InvalidArgument);
  CHECK_FALSE(fs::exists(d / "run"));
  c.mixup.alpha = 0.2;
  c.train.cuda_graph = true;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("--cuda-graph") && Catch::Contains("--mixup"));

  const auto [code, out] = test::run_in_process({"melforge-train", "train", "--data", (d / "x").string(), "--out",
                                                 (d / "run").string(), "--mixup=-1"});
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("--mixup"));
  CHECK_FALSE(fs::exists(d / "run"));
}

TEST_CASE("mixup ALPHA parses, shows its default in --help and is recorded in config.json", "[trainer][mixup]") {
  namespace po = boost::program_options;
  trainer::MixupOptions parsed;
  po::options_description desc;
  trainer::add_options(desc, parsed);
  const char* argv[] = {"x", "--mixup", "0.4"};
  po::variables_map vm;
  po::store(po::parse_command_line(3, argv, desc), vm);
  po::notify(vm);
  CHECK(parsed.alpha == 0.4);
  CHECK(parsed.enabled());
  const auto [code, help] = test::run_in_process({"melforge-train", "train", "--help"});
  CHECK(code == 0);
  CHECK_THAT(help, Catch::Contains("--mixup ALPHA (=0)"));

  trainer::TrainConfig c;
  c.mixup.alpha = 0.3;
  const nlohmann::json j = c.to_json();
  CHECK(j["augment"]["mixup"] == 0.3);
  CHECK(trainer::TrainConfig::from_json(j).mixup.alpha == 0.3);
  nlohmann::json old = j;
  old["augment"].erase("mixup");
  CHECK(trainer::TrainConfig::from_json(old).mixup.alpha == 0.0);
}

TEST_CASE("mixup 0 trains bit-exactly as no mixup, mixup 0.4 changes the weights and is recorded",
          "[trainer][mixup][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  const auto last_of = [&](const std::string& name, double alpha, bool set) {
    auto c = test::tiny_config(data, d / name, 2);
    if (set) c.mixup.alpha = alpha;
    trainer::train(c, log);
    return trainer::load_checkpoint(d / name / "checkpoints/last.pt");
  };
  const trainer::Checkpoint plain = last_of("plain", 0, false), zero = last_of("zero", 0.0, true);
  const trainer::Checkpoint mixed = last_of("mixed", 0.4, true);
  test::require_same_tensors(plain.model, zero.model, "model");
  test::require_same_tensors(plain.optimizer, zero.optimizer, "optimizer");
  CHECK(at::equal(plain.rng_state, zero.rng_state));
  bool differs = false;
  for (const auto& [name, t] : plain.model) differs = differs || !at::equal(t, mixed.model.at(name));
  CHECK(differs);
  CHECK(test::read_json(d / "mixed" / "config.json")["augment"]["mixup"] == 0.4);
  CHECK(test::read_json(d / "plain" / "config.json")["augment"]["mixup"] == 0.0);
  const auto lines = test::epoch_lines(d / "mixed" / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  CHECK(std::isfinite(lines.back()["train_loss"].get<double>()));
}

TEST_CASE("a run with --mixup stopped after 2 epochs and resumed ends with the weights of an uninterrupted run",
          "[trainer][mixup][train][resume]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  const int64_t accumulate = GENERATE(1, 2);
  CAPTURE(accumulate);
  auto straight = test::tiny_config(data, d / "straight", 4);
  straight.optim.accumulate = accumulate;
  straight.mixup.alpha = 0.4;
  straight.augment.time_masks = 1;
  straight.augment.time_width = 4;
  trainer::train(straight, log);

  auto first = straight;
  first.train.out = d / "pieces";
  trainer::TrainHooks stop_after_two;
  stop_after_two.on_epoch_end = [](int64_t epoch) { return epoch < 1; };
  REQUIRE(trainer::train(first, log, stop_after_two).interrupted);

  const auto resume = [&](const std::vector<std::string>& more) {
    return test::run_in_process(test::with({"melforge-train", "train", "--resume", (d / "pieces").string(),
                                            "--threads", "2", "--log-level", "warn"},
                                           more));
  };
  const auto [refused, message] = resume({"--mixup", "0.2"});
  CHECK(refused != 0);
  CHECK_THAT(message, Catch::Contains("--mixup cannot be changed") && Catch::Contains("0.4"));
  const auto [code, out] = resume({"--mixup", "0.4"});
  INFO(out);
  REQUIRE(code == 0);

  const auto a = trainer::load_checkpoint(d / "straight" / "checkpoints/last.pt");
  const auto b = trainer::load_checkpoint(d / "pieces" / "checkpoints/last.pt");
  CHECK(a.step == b.step);
  test::require_same_tensors(a.model, b.model, "model");
  test::require_same_tensors(a.optimizer, b.optimizer, "optimizer");
  CHECK(at::equal(a.rng_state, b.rng_state));
  const auto la = test::epoch_lines(d / "straight" / "metrics.jsonl");
  const auto lb = test::epoch_lines(d / "pieces" / "metrics.jsonl");
  REQUIRE(lb.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(la[i]["train_loss"] == lb[i]["train_loss"]);
}

}  // namespace melforge_test_trainer_mixup
