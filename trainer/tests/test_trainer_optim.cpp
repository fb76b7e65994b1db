// The optimizer side: AdamW (fused and foreach) against a naive scalar AdamW, the cosine schedule against its
// formula, clipping against a naive norm, and the GradScaler's skip/backoff/growth behaviour.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include "catch_torch.h"
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "test_skip.h"
#include "train/optim.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_optim {

using namespace melforge;
using trainer::AdamW;
using trainer::CosineSchedule;
using trainer::GradScaler;
using trainer::OptimOptions;

namespace {

/// Naive AdamW state of one parameter, in double, element by element (torch.optim.AdamW's documented algorithm).
struct NaiveAdamW {
  std::vector<double> p, m, v;
  int64_t t = 0;

  explicit NaiveAdamW(const at::Tensor& param) {
    const at::Tensor c = param.detach().to(torch::kDouble).contiguous().flatten();
    p.assign(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    m.assign(p.size(), 0.0);
    v.assign(p.size(), 0.0);
  }

  void step(const at::Tensor& grad, double lr, const OptimOptions& o) {
    const at::Tensor gc = grad.to(torch::kDouble).contiguous().flatten();
    const double* g = gc.data_ptr<double>();
    ++t;
    const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
      const double m_hat = m[i] / bc1;
      const double v_hat = v[i] / bc2;
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
};

void check_close(const at::Tensor& actual, const std::vector<double>& expected, double rtol, double atol) {
  const at::Tensor a = actual.detach().to(torch::kDouble).contiguous().flatten();
  REQUIRE(static_cast<std::size_t>(a.numel()) == expected.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(a.data_ptr<double>()[i] - expected[i]) - rtol * std::abs(expected[i]);
    worst = std::max(worst, err);
  }
  CHECK(worst <= atol);
}

std::vector<at::Tensor> make_params(const std::vector<std::vector<int64_t>>& shapes, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> params;
  for (const auto& s : shapes) params.push_back(torch::randn(s).requires_grad_(true));
  return params;
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

/// Deterministic gradients for step `k` (a new generator per step, so any two optimizers see the same ones).
std::vector<at::Tensor> grads_for(const std::vector<at::Tensor>& params, int k) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + k);
  std::vector<at::Tensor> g;
  for (const auto& p : params) g.push_back(torch::randn(p.sizes(), gen) * (0.5 + k));
  return g;
}

void set_grads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    p.mutable_grad() = grads[i].clone();
  }
}

OptimOptions options(const std::string& impl, double lr, double wd) {
  OptimOptions o;
  o.adamw_impl = impl;
  o.lr = lr;
  o.weight_decay = wd;
  return o;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i].detach(), b[i].detach())) return false;
  return true;
}

std::vector<at::Tensor> snapshot(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("AdamW follows the naive AdamW over several steps", "[trainer][optim]") {
  const std::string impl = GENERATE("fused", "foreach");
  const double lr = GENERATE(1e-3, 3e-2);
  const double wd = GENERATE(0.0, 0.1);
  const auto shapes = GENERATE(std::vector<std::vector<int64_t>>{{7}},
                               std::vector<std::vector<int64_t>>{{3, 5}, {1}, {2, 3, 4}},
                               std::vector<std::vector<int64_t>>{{16, 1, 3, 3}, {16}});
  const bool tensor_lr = GENERATE(false, true);
  CAPTURE(impl, lr, wd, shapes.size(), tensor_lr);
  std::vector<at::Tensor> params = make_params(shapes, 5);
  OptimOptions o = options(impl, lr, wd);
  o.beta2 = 0.99;
  AdamW opt(params, o);
  CHECK(opt.implementation() == impl);
  std::vector<NaiveAdamW> ref;
  for (const auto& p : params) ref.emplace_back(p);
  for (int k = 0; k < 6; ++k) {
    const double step_lr = lr * (1.0 - 0.1 * k);
    const auto g = grads_for(params, k);
    set_grads(params, g);
    if (tensor_lr)
      opt.step(torch::tensor(step_lr, torch::kFloat));
    else
      opt.step(step_lr);
    for (std::size_t i = 0; i < params.size(); ++i) ref[i].step(g[i], step_lr, o);
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    check_close(params[i], ref[i].p, 1e-5, 1e-6);
    const auto state = opt.state_dict();
    check_close(state.at("exp_avg." + std::to_string(i)), ref[i].m, 1e-5, 1e-7);
    check_close(state.at("exp_avg_sq." + std::to_string(i)), ref[i].v, 1e-5, 1e-8);
    CHECK(state.at("step." + std::to_string(i)).item<float>() == 6.0f);
    CHECK(state.at("step." + std::to_string(i)).scalar_type() == torch::kFloat);
  }
}

TEST_CASE("fused and foreach AdamW agree, and auto picks fused on the CPU", "[trainer][optim]") {
  const double wd = GENERATE(0.0, 0.05);
  std::vector<at::Tensor> a = make_params({{4, 6}, {6}, {3}}, 11);
  std::vector<at::Tensor> b = clone_params(a);
  AdamW fused(a, options("fused", 1e-2, wd));
  AdamW foreach_(b, options("foreach", 1e-2, wd));
  for (int k = 0; k < 8; ++k) {
    set_grads(a, grads_for(a, k));
    set_grads(b, grads_for(b, k));
    fused.step(1e-2);
    foreach_.step(1e-2);
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double diff = (a[i] - b[i]).abs().max().item<double>();
    CAPTURE(i, diff);
    CHECK(diff <= 1e-6);
  }
  CHECK(AdamW(clone_params(a), options("auto", 1e-3, 0.0)).implementation() == "fused");
  CHECK(trainer::fused_adamw_available(torch::kCPU, torch::kFloat));
  CHECK_FALSE(trainer::fused_adamw_available(torch::kCPU, torch::kInt));
}

TEST_CASE("AdamW state_dict round trip continues identically", "[trainer][optim]") {
  const std::string impl = GENERATE("fused", "foreach");
  CAPTURE(impl);
  std::vector<at::Tensor> a = make_params({{5, 3}, {3}}, 21);
  AdamW opt_a(a, options(impl, 5e-3, 0.01));
  for (int k = 0; k < 3; ++k) {
    set_grads(a, grads_for(a, k));
    opt_a.step(5e-3);
  }
  std::vector<at::Tensor> b = clone_params(a);
  AdamW opt_b(b, options(impl, 5e-3, 0.01));
  opt_b.load_state_dict(opt_a.state_dict());
  for (int k = 3; k < 6; ++k) {
    set_grads(a, grads_for(a, k));
    set_grads(b, grads_for(b, k));
    opt_a.step(5e-3);
    opt_b.step(5e-3);
  }
  CHECK(all_equal(a, b));

  auto state = opt_a.state_dict();
  CHECK(state.size() == 6);
  auto missing = state;
  missing.erase("exp_avg_sq.1");
  CHECK_THROWS_AS(opt_b.load_state_dict(missing), FormatError);
  auto wrong = state;
  wrong["exp_avg.0"] = torch::zeros({3, 5});
  CHECK_THROWS_AS(opt_b.load_state_dict(wrong), FormatError);
}

TEST_CASE("AdamW leaves parameters without a gradient untouched", "[trainer][optim]") {
  const std::string impl = GENERATE("fused", "foreach");
  CAPTURE(impl);
  std::vector<at::Tensor> params = make_params({{4}, {3, 3}, {2}}, 31);
  AdamW opt(params, options(impl, 1e-2, 0.5));
  const auto before = snapshot(params);
  for (int k = 0; k < 3; ++k) {
    auto g = grads_for(params, k);
    set_grads(params, g);
    params[1].mutable_grad().reset();
    opt.step(1e-2);
  }
  CHECK(torch::equal(params[1].detach(), before[1]));
  CHECK_FALSE(torch::equal(params[0].detach(), before[0]));
  CHECK_FALSE(torch::equal(params[2].detach(), before[2]));
  const auto state = opt.state_dict();
  CHECK(state.at("step.1").item<float>() == 0.0f);
  CHECK(state.at("step.0").item<float>() == 3.0f);
  CHECK(state.at("exp_avg.1").abs().sum().item<float>() == 0.0f);

  opt.zero_grad();
  for (const auto& p : params) CHECK_FALSE(p.grad().defined());
  opt.step(1e-2);
  CHECK(opt.state_dict().at("step.0").item<float>() == 3.0f);
}

TEST_CASE("AdamW with found_inf set changes nothing, and grad_scale unscales inside the step", "[trainer][optim]") {
  const std::string impl = GENERATE("fused", "foreach");
  const bool poison = GENERATE(false, true);
  CAPTURE(impl, poison);
  std::vector<at::Tensor> a = make_params({{6}, {2, 5}}, 41);
  std::vector<at::Tensor> b = clone_params(a);
  AdamW opt_a(a, options(impl, 1e-2, 0.1));
  AdamW opt_b(b, options(impl, 1e-2, 0.1));
  const float scale = 1024.0f;
  const at::Tensor grad_scale = torch::full({1}, scale);
  for (int k = 0; k < 2; ++k) {
    set_grads(a, grads_for(a, k));
    opt_a.step(1e-2);
    auto g = grads_for(b, k);
    for (auto& t : g) t = t * scale;
    set_grads(b, g);
    opt_b.step(1e-2, grad_scale, torch::zeros({1}));
  }
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::allclose(a[i], b[i], 1e-6, 1e-7));

  const auto params_before = snapshot(b);
  const auto state_before = opt_b.state_dict();
  auto g = grads_for(b, 7);
  if (poison) {
    g[0][2] = std::numeric_limits<float>::quiet_NaN();
    g[1][0][1] = std::numeric_limits<float>::infinity();
  }
  set_grads(b, g);
  opt_b.step(1e-2, grad_scale, torch::ones({1}));
  CHECK(all_equal(b, params_before));
  for (const auto& [key, value] : opt_b.state_dict()) {
    CAPTURE(key);
    CHECK(torch::equal(value, state_before.at(key)));
  }
}

TEST_CASE("AdamW options are validated", "[trainer][optim]") {
  OptimOptions o;
  CHECK_NOTHROW(o.validate());
  const auto bad = [](auto change) {
    OptimOptions x;
    change(x);
    return x;
  };
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.lr = 0; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.weight_decay = -1; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.beta1 = 1.0; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.beta2 = -0.1; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.eps = 0; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.warmup = 1.0; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.min_lr_ratio = 1.5; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.clip_norm = -1; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.accumulate = 0; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(bad([](OptimOptions& x) { x.adamw_impl = "sgd"; }).validate(), InvalidArgument);
  CHECK_THROWS_AS(AdamW(make_params({{3}}, 1), bad([](OptimOptions& x) { x.lr = -1; })), InvalidArgument);
  std::vector<at::Tensor> ints{torch::zeros({3}, torch::kInt)};
  CHECK_THROWS_AS(AdamW(ints, OptimOptions{}), InvalidArgument);
}

TEST_CASE("cosine schedule: linear warmup, cosine decay, constant after the end", "[trainer][optim]") {
  const double base = GENERATE(1e-3, 0.5);
  const double r = GENERATE(0.0, 0.1);
  const int64_t total = GENERATE(100, 37);
  const int64_t warmup = GENERATE(0, 10);
  CAPTURE(base, r, total, warmup);
  const CosineSchedule s(base, total, warmup, r);
  const auto formula = [&](int64_t step) {
    if (step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
    const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
    return base * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
  };
  if (warmup > 0) {
    CHECK(s.lr(0) == Approx(base / static_cast<double>(warmup)));
    CHECK(s.lr(warmup - 1) == Approx(base));
  } else {
    CHECK(s.lr(0) == Approx(base));
  }
  CHECK(s.lr(warmup) == Approx(base));
  if ((total - warmup) % 2 == 0) CHECK(s.lr(warmup + (total - warmup) / 2) == Approx(base * (1.0 + r) / 2.0));
  CHECK(s.lr(total) == Approx(base * r).margin(1e-15));
  CHECK(s.lr(total + 1000) == Approx(base * r).margin(1e-15));
  for (int64_t k = 0; k <= total + 3; ++k) {
    CAPTURE(k);
    CHECK(s.lr(k) == Approx(formula(k)).margin(1e-15));
    if (k > warmup && k <= total) CHECK(s.lr(k) <= s.lr(k - 1));
  }
  const auto j = s.to_json();
  CHECK(j.at("base_lr").get<double>() == base);
  CHECK(j.at("total_steps").get<int64_t>() == total);
  CHECK(j.at("warmup_steps").get<int64_t>() == warmup);
  CHECK(j.at("min_lr_ratio").get<double>() == r);

  CHECK_THROWS_AS(CosineSchedule(1e-3, 0, 0), InvalidArgument);
  CHECK_THROWS_AS(CosineSchedule(1e-3, 10, 11), InvalidArgument);
  CHECK_THROWS_AS(CosineSchedule(1e-3, 10, -1), InvalidArgument);
}

TEST_CASE("clip_grad_norm scales to max_norm and returns the norm before clipping", "[trainer][optim]") {
  const double max_norm = GENERATE(0.5, 1.0, 1e6, 0.0);
  CAPTURE(max_norm);
  std::vector<at::Tensor> params = make_params({{10}, {3, 4}, {2}, {5}}, 51);
  auto g = grads_for(params, 2);
  set_grads(params, g);
  params[3].mutable_grad().reset();
  double sq = 0.0;
  for (std::size_t i = 0; i < 3; ++i) {
    const at::Tensor gd = g[i].to(torch::kDouble).flatten();
    for (int64_t k = 0; k < gd.numel(); ++k) sq += gd[k].item<double>() * gd[k].item<double>();
  }
  const double naive = std::sqrt(sq);
  const at::Tensor norm = trainer::clip_grad_norm(params, max_norm);
  CHECK(norm.dim() == 0);
  CHECK(norm.scalar_type() == torch::kFloat);
  CHECK(norm.item<double>() == Approx(naive).epsilon(1e-6));
  const bool clips = max_norm > 0.0 && naive > max_norm;
  const double factor = clips ? max_norm / (naive + 1e-6) : 1.0;
  for (std::size_t i = 0; i < 3; ++i) {
    if (clips)
      CHECK(torch::allclose(params[i].grad(), g[i] * factor, 1e-6, 1e-8));
    else
      CHECK(torch::equal(params[i].grad(), g[i]));
  }
  CHECK_FALSE(params[3].grad().defined());
  double after = 0.0;
  for (std::size_t i = 0; i < 3; ++i) after += params[i].grad().to(torch::kDouble).pow(2).sum().item<double>();
  if (clips) CHECK(std::sqrt(after) == Approx(max_norm).epsilon(1e-5));

  std::vector<at::Tensor> none = make_params({{3}}, 1);
  CHECK(trainer::clip_grad_norm(none, 1.0).item<float>() == 0.0f);
}

TEST_CASE("GradScaler skips the step and backs off on inf or NaN gradients", "[trainer][optim]") {
  const std::string impl = GENERATE("fused", "foreach");
  const float bad = GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN());
  CAPTURE(impl, bad);
  std::vector<at::Tensor> params = make_params({{4}, {3, 2}}, 61);
  AdamW opt(params, options(impl, 1e-2, 0.1));
  GradScaler scaler(true, torch::kCPU, 256.0, 2.0, 0.25, 100);
  set_grads(params, grads_for(params, 0));
  scaler.step(opt, 1e-2, params);
  CHECK(scaler.scale_tensor().item<float>() == 256.0f);
  CHECK(scaler.found_inf().item<float>() == 0.0f);

  const auto before = snapshot(params);
  const auto state_before = opt.state_dict();
  auto g = grads_for(params, 1);
  g[1][2][1] = bad;
  set_grads(params, g);
  scaler.step(opt, 1e-2, params);
  CHECK(scaler.found_inf().item<float>() == 1.0f);
  CHECK(all_equal(params, before));
  for (const auto& [key, value] : opt.state_dict()) {
    CAPTURE(key);
    CHECK(torch::equal(value, state_before.at(key)));
  }
  CHECK(scaler.scale_tensor().item<float>() == 64.0f);
  CHECK(scaler.state_dict().at("growth_tracker").item<int>() == 0);
}

TEST_CASE("GradScaler unscales exactly and grows the scale after growth_interval clean steps", "[trainer][optim]") {
  const std::string impl = GENERATE("fused", "foreach");
  CAPTURE(impl);
  std::vector<at::Tensor> a = make_params({{8}, {2, 3}}, 71);
  std::vector<at::Tensor> b = clone_params(a);
  AdamW opt_a(a, options(impl, 1e-2, 0.01));
  AdamW opt_b(b, options(impl, 1e-2, 0.01));
  GradScaler scaler(true, torch::kCPU, 1024.0, 2.0, 0.5, 3);
  float scale = 1024.0f;
  for (int k = 0; k < 7; ++k) {
    CAPTURE(k);
    const auto g = grads_for(a, k);
    set_grads(a, g);
    opt_a.step(1e-2);
    for (std::size_t i = 0; i < b.size(); ++i) b[i].mutable_grad() = g[i] * scale;
    scaler.unscale(b);
    for (std::size_t i = 0; i < b.size(); ++i) CHECK(torch::equal(b[i].grad(), g[i]));
    scaler.step(opt_b, 1e-2, b);
    if (k % 3 == 2) scale *= 2.0f;
    CHECK(scaler.scale_tensor().item<float>() == scale);
    CHECK(scaler.state_dict().at("growth_tracker").item<int>() == (k + 1) % 3);
  }
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::allclose(a[i], b[i], 1e-6, 1e-7));

  torch::Tensor w = torch::tensor({1.0f, -2.0f}).requires_grad_(true);
  const at::Tensor x = torch::tensor({3.0f, 0.5f});
  const at::Tensor loss = (w * x).sum();
  const at::Tensor scaled = scaler.scale(loss);
  CHECK(scaled.sizes() == loss.sizes());
  CHECK(scaled.item<float>() == loss.item<float>() * scale);
  scaled.backward();
  CHECK(torch::equal(w.grad(), x * scale));
}

TEST_CASE("a disabled GradScaler is the identity", "[trainer][optim]") {
  std::vector<at::Tensor> a = make_params({{5}}, 81);
  std::vector<at::Tensor> b = clone_params(a);
  AdamW opt_a(a, options("fused", 1e-2, 0.0));
  AdamW opt_b(b, options("fused", 1e-2, 0.0));
  GradScaler scaler(false, torch::kCPU);
  CHECK_FALSE(scaler.enabled());
  CHECK(scaler.scale_tensor().item<float>() == 1.0f);
  const at::Tensor loss = torch::tensor(3.5f);
  CHECK(torch::equal(scaler.scale(loss), loss));
  for (int k = 0; k < 3; ++k) {
    const auto g = grads_for(a, k);
    set_grads(a, g);
    set_grads(b, g);
    opt_a.step(1e-2);
    scaler.unscale(b);
    CHECK(torch::equal(b[0].grad(), g[0]));
    scaler.step(opt_b, 1e-2, b);
  }
  CHECK(all_equal(a, b));
  CHECK(scaler.scale_tensor().item<float>() == 1.0f);
}

TEST_CASE("GradScaler state_dict round trip", "[trainer][optim]") {
  std::vector<at::Tensor> a = make_params({{4}}, 91);
  AdamW opt(a, options("foreach", 1e-2, 0.0));
  GradScaler scaler(true, torch::kCPU, 512.0, 2.0, 0.5, 4);
  for (int k = 0; k < 2; ++k) {
    set_grads(a, grads_for(a, k));
    scaler.step(opt, 1e-2, a);
  }
  auto g = grads_for(a, 2);
  g[0][0] = std::numeric_limits<float>::infinity();
  set_grads(a, g);
  scaler.step(opt, 1e-2, a);
  set_grads(a, grads_for(a, 3));
  scaler.step(opt, 1e-2, a);
  const auto state = scaler.state_dict();
  CHECK(state.at("scale").item<float>() == 256.0f);
  CHECK(state.at("growth_tracker").item<int>() == 1);

  GradScaler other(true, torch::kCPU, 512.0, 2.0, 0.5, 4);
  other.load_state_dict(state);
  CHECK(torch::equal(other.scale_tensor(), scaler.scale_tensor()));
  for (int k = 4; k < 8; ++k) {
    set_grads(a, grads_for(a, k));
    scaler.step(opt, 1e-2, a);
    set_grads(a, grads_for(a, k));
    other.step(opt, 1e-2, a);
  }
  CHECK(torch::equal(other.scale_tensor(), scaler.scale_tensor()));
  CHECK(other.scale_tensor().item<float>() == 512.0f);
  CHECK(torch::equal(other.state_dict().at("growth_tracker"), scaler.state_dict().at("growth_tracker")));
  auto missing = state;
  missing.erase("growth_tracker");
  CHECK_THROWS_AS(other.load_state_dict(missing), FormatError);
}

TEST_CASE("optimizer pieces on CUDA match the CPU", "[trainer][optim][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  const std::string impl = GENERATE("fused", "foreach");
  CAPTURE(impl);
  std::vector<at::Tensor> cpu = make_params({{33, 7}, {7}}, 101);
  std::vector<at::Tensor> gpu;
  for (const auto& p : cpu) gpu.push_back(p.detach().to(torch::kCUDA).requires_grad_(true));
  AdamW opt_c(cpu, options(impl, 1e-2, 0.1));
  AdamW opt_g(gpu, options(impl, 1e-2, 0.1));
  GradScaler sc(true, torch::kCPU, 128.0, 2.0, 0.5, 2);
  GradScaler sg(true, torch::kCUDA, 128.0, 2.0, 0.5, 2);
  for (int k = 0; k < 5; ++k) {
    auto g = grads_for(cpu, k);
    if (k == 2) g[0][3][4] = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      cpu[i].mutable_grad() = g[i] * sc.scale_tensor().item<float>();
      gpu[i].mutable_grad() = (g[i] * sc.scale_tensor().item<float>()).to(torch::kCUDA);
    }
    sc.unscale(cpu);
    sg.unscale(gpu);
    const at::Tensor nc = trainer::clip_grad_norm(cpu, 1.0);
    const at::Tensor ng = trainer::clip_grad_norm(gpu, 1.0);
    if (k != 2) CHECK(ng.item<float>() == Approx(nc.item<float>()).epsilon(1e-5));
    sc.step(opt_c, 1e-2, cpu);
    sg.step(opt_g, 1e-2, gpu);
    CHECK(sg.scale_tensor().item<float>() == sc.scale_tensor().item<float>());
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) CHECK(torch::allclose(gpu[i].cpu(), cpu[i], 1e-5, 1e-6));
}

}  // namespace melforge_test_trainer_optim
