// `--model crnn`: shapes and parameters, the forward pass against a hand-written recurrence, the reused initial
// state, the JSON round trip through the factory, gradients and invalid configurations; on CUDA, the CPU's outputs
// without TF32 at float32 tolerances and with melforge-train's TF32 settings within a bound that an emulation of TF32
// on the CPU checks.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include "catch_torch.h"
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda_float32.h"
#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "models/crnn.h"
#include "models/model.h"
#include "options.h"
#include "test_skip.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_crnn {

using namespace melforge;
using trainer::CrnnConfig;
using trainer::CrnnNet;

namespace {

CrnnConfig config(int64_t n_mels, int64_t n_frames, int64_t classes, const std::string& rnn = "gru",
                  int64_t rnn_hidden = 24) {
  CrnnConfig c;
  c.n_mels = n_mels;
  c.n_frames = n_frames;
  c.num_classes = classes;
  c.rnn = rnn;
  c.rnn_hidden = rnn_hidden;
  c.hidden = 20;
  return c;
}

/// Expected parameter shapes, written from the architecture (gates: 3 for GRU, 4 for LSTM).
std::map<std::string, std::vector<int64_t>> expected_shapes(const CrnnConfig& c) {
  const int64_t g = (c.rnn == "gru" ? 3 : 4) * c.rnn_hidden;
  const int64_t features = c.channels[1] * (c.n_mels / 4);
  return {{"conv1.weight", {c.channels[0], 1, 3, 3}},
          {"conv1.bias", {c.channels[0]}},
          {"conv2.weight", {c.channels[1], c.channels[0], 3, 3}},
          {"conv2.bias", {c.channels[1]}},
          {"rnn.weight_ih_l0", {g, features}},
          {"rnn.weight_hh_l0", {g, c.rnn_hidden}},
          {"rnn.bias_ih_l0", {g}},
          {"rnn.bias_hh_l0", {g}},
          {"fc.weight", {c.hidden, c.rnn_hidden}},
          {"fc.bias", {c.hidden}},
          {"class_head.weight", {c.num_classes, c.hidden}},
          {"class_head.bias", {c.num_classes}},
          {"detect_head.weight", {1, c.hidden}},
          {"detect_head.bias", {1}}};
}

/// An operand of a product as TF32 tensor cores read it when the conversion truncates: the 13 low mantissa bits of
/// every float32 cleared, 10 kept (rounding to nearest errs half as much).
at::Tensor tf32_truncate(const at::Tensor& t) {
  return at::bitwise_and(t.contiguous().view(at::kInt), static_cast<int64_t>(~int32_t{0x1FFF})).view(at::kFloat);
}

/// The forward pass (eval mode; every frame real, an odd T padded with one zero frame after the normalisation) with
/// functional ops on the module's weights and the recurrence written step by step
/// from the GRU (r, z, n) and LSTM (i, f, g, o) equations. `operand` is applied to both operands of every product
/// (convolutions and linear maps; biases are added in float32, as the GPU's accumulators do).
std::pair<at::Tensor, at::Tensor> reference_forward(
    CrnnNet& net, const at::Tensor& x,
    const std::function<at::Tensor(const at::Tensor&)>& operand = [](const at::Tensor& t) { return t; }) {
  auto p = net->named_parameters();
  const CrnnConfig& c = net->config();
  auto buffers = net->named_buffers();
  const auto conv = [&](const at::Tensor& in, const std::string& name) {
    return at::conv2d(operand(in), operand(p[name + ".weight"]), p[name + ".bias"], 1, 1);
  };
  const auto linear = [&](const at::Tensor& in, const at::Tensor& w, const at::Tensor& b) {
    return at::linear(operand(in), operand(w), b);
  };
  at::Tensor h = (x.unsqueeze(1) - buffers["input_mean"]) / buffers["input_std"];
  h = at::constant_pad_nd(h, {0, h.size(3) % 2});
  h = at::max_pool2d(at::relu(conv(h, "conv1")), {2, 2});
  h = at::max_pool2d(at::relu(conv(h, "conv2")), {2, 1});
  const int64_t batch = h.size(0), channels = h.size(1), rows = h.size(2), steps = h.size(3);
  const int64_t hid = c.rnn_hidden;
  const at::Tensor w_ih = p["rnn.weight_ih_l0"], w_hh = p["rnn.weight_hh_l0"];
  const at::Tensor b_ih = p["rnn.bias_ih_l0"], b_hh = p["rnn.bias_hh_l0"];
  at::Tensor state = torch::zeros({batch, hid});
  at::Tensor cell = torch::zeros({batch, hid});
  at::Tensor sum = torch::zeros({batch, hid});
  for (int64_t t = 0; t < steps; ++t) {
    at::Tensor in = torch::empty({batch, channels * rows});
    for (int64_t ch = 0; ch < channels; ++ch)
      for (int64_t m = 0; m < rows; ++m) in.select(1, ch * rows + m).copy_(h.select(3, t).select(2, m).select(1, ch));
    const at::Tensor gi = linear(in, w_ih, b_ih);
    const at::Tensor gh = linear(state, w_hh, b_hh);
    if (c.rnn == "gru") {
      const at::Tensor r = at::sigmoid(gi.narrow(1, 0, hid) + gh.narrow(1, 0, hid));
      const at::Tensor z = at::sigmoid(gi.narrow(1, hid, hid) + gh.narrow(1, hid, hid));
      const at::Tensor n = at::tanh(gi.narrow(1, 2 * hid, hid) + r * gh.narrow(1, 2 * hid, hid));
      state = (1 - z) * n + z * state;
    } else {
      const at::Tensor g = gi + gh;
      const at::Tensor i = at::sigmoid(g.narrow(1, 0, hid));
      const at::Tensor f = at::sigmoid(g.narrow(1, hid, hid));
      const at::Tensor gg = at::tanh(g.narrow(1, 2 * hid, hid));
      const at::Tensor o = at::sigmoid(g.narrow(1, 3 * hid, hid));
      cell = f * cell + i * gg;
      state = o * at::tanh(cell);
    }
    sum = sum + state;
  }
  const at::Tensor pooled = sum / static_cast<double>(steps);
  const at::Tensor hidden = at::relu(linear(pooled, p["fc.weight"], p["fc.bias"]));
  return {linear(hidden, p["class_head.weight"], p["class_head.bias"]),
          linear(hidden, p["detect_head.weight"], p["detect_head.bias"]).squeeze(1)};
}

/// The network and input of the CUDA comparison: config(32, 24, 4, rnn), seed 13, in eval mode; x [5, 32, 24].
std::pair<CrnnNet, at::Tensor> cuda_case(const std::string& rnn) {
  torch::manual_seed(13);
  CrnnNet net(config(32, 24, 4, rnn));
  net->eval();
  return {net, torch::randn({5, 32, 24})};
}

/// The largest |a - b|.
double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

/// How far an output computed on CUDA with TF32 may be from the float32 `cpu` one. TF32 keeps 10 of float32's 23
/// mantissa bits: each operand of a product is off by up to 2^-10 of itself (truncated; 2^-11 rounded), a product by
/// up to 2^-9 ~ 2e-3, and a dot product by up to 2e-3 of the sum of its terms' magnitudes (accumulation stays
/// float32). That bounds an error by the scale of a layer's terms, not of its result, which cancellation can make far
/// smaller, so the bound is on the outputs' scale, not per element: the crnn chains 5 such products to an output
/// (conv1, conv2, the recurrent input and hidden products, fc, the head; the gates' sigmoid and tanh and the time mean
/// do not amplify an error), each adding up to 2e-3 of its terms' scale, about 1e-2 in all; the terms are of order 1
/// (a normalized input, weights of PyTorch's default initialization), or of the outputs' order when those are larger:
/// |cuda - cpu| <= 1e-2 * (max |cpu| + 1). The emulation of TF32 on the CPU (a test below) checks that the bound holds
/// with room to spare.
double tf32_bound(const at::Tensor& cpu) { return 1e-2 * (cpu.abs().max().item<double>() + 1.0); }

}  // namespace

TEST_CASE("crnn output shapes and parameters follow the configuration", "[trainer][crnn]") {
  const auto [n_mels, n_frames] = GENERATE(std::pair<int64_t, int64_t>{32, 32}, std::pair<int64_t, int64_t>{64, 17},
                                           std::pair<int64_t, int64_t>{4, 2}, std::pair<int64_t, int64_t>{40, 101});
  const int64_t classes = GENERATE(2, 5);
  const std::string rnn = GENERATE("gru", "lstm");
  const int64_t batch = GENERATE(1, 3);
  CAPTURE(n_mels, n_frames, classes, rnn, batch);
  const CrnnConfig c = config(n_mels, n_frames, classes, rnn);
  CHECK(c.rnn_steps() == (n_frames + 1) / 2);
  CHECK(c.rnn_features() == 32 * (n_mels / 4));
  torch::manual_seed(1);
  CrnnNet net(c);
  net->eval();
  const auto expected = expected_shapes(c);
  const auto named = net->named_parameters();
  CHECK(named.size() == expected.size());
  for (const auto& [name, shape] : expected) {
    CAPTURE(name);
    REQUIRE(named.contains(name));
    CHECK(named[name].sizes().vec() == shape);
  }
  CHECK(net->named_buffers().keys() == std::vector<std::string>{"input_mean", "input_std"});

  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({batch, n_mels, n_frames});
  const auto y = net->forward(x);
  CHECK(y.logits.sizes().vec() == std::vector<int64_t>{batch, classes});
  CHECK(y.detection.sizes().vec() == std::vector<int64_t>{batch});
  const auto y4 = net->forward(x.unsqueeze(1));
  CHECK(torch::equal(y.logits, y4.logits));
  CHECK(torch::equal(y.detection, y4.detection));
}

TEST_CASE("crnn computes conv front end, recurrence over time, time mean, fc and two heads", "[trainer][crnn]") {
  const std::string rnn = GENERATE("gru", "lstm");
  const auto [n_mels, n_frames] =
      GENERATE(std::pair<int64_t, int64_t>{16, 12}, std::pair<int64_t, int64_t>{22, 9});
  CAPTURE(rnn, n_mels, n_frames);
  torch::manual_seed(3);
  CrnnNet net(config(n_mels, n_frames, 4, rnn, 8));
  net->set_input_normalization(-3.0, 2.5);
  net->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({3, n_mels, n_frames});
  const auto y = net->forward(x);
  const auto [logits, detection] = reference_forward(net, x);
  CHECK(torch::allclose(y.logits, logits, 1e-5, 1e-6));
  CHECK(torch::allclose(y.detection, detection, 1e-5, 1e-6));
}

TEST_CASE("crnn allocates its initial state once and reuses it for smaller batches", "[trainer][crnn]") {
  const std::string rnn = GENERATE("gru", "lstm");
  CAPTURE(rnn);
  torch::manual_seed(5);
  CrnnNet net(config(16, 16, 3, rnn, 12));
  net->eval();
  torch::NoGradGuard no_grad;
  CHECK_FALSE(net->initial_state().defined());
  const at::Tensor x = torch::randn({6, 16, 16});
  const auto y4 = net->forward(x.narrow(0, 0, 4));
  const at::Tensor h0 = net->initial_state();
  REQUIRE(h0.defined());
  CHECK(h0.sizes().vec() == std::vector<int64_t>{1, 4, 12});
  const void* storage = h0.data_ptr();
  const auto y2 = net->forward(x.narrow(0, 0, 2));
  CHECK(net->initial_state().data_ptr() == storage);
  CHECK(torch::allclose(y2.logits, y4.logits.narrow(0, 0, 2), 1e-6, 1e-7));
  net->forward(x.narrow(0, 0, 4));
  CHECK(net->initial_state().data_ptr() == storage);
  CHECK(net->initial_state().abs().sum().item<float>() == 0.0f);

  const auto y6 = net->forward(x);
  CHECK(net->initial_state().size(1) == 6);
  const void* bigger = net->initial_state().data_ptr();
  net->forward(x.narrow(0, 0, 1));
  net->forward(x.narrow(0, 0, 5));
  CHECK(net->initial_state().data_ptr() == bigger);
  CHECK(torch::allclose(y6.logits.narrow(0, 0, 4), y4.logits, 1e-6, 1e-7));

  for (const auto& item : net->named_buffers()) CHECK_FALSE(item.value().is_same(net->initial_state()));
  CHECK(net->named_buffers().size() == 2);
}

TEST_CASE("crnn config_json builds the same model through make_model_from_json", "[trainer][crnn]") {
  trainer::ModelOptions opts;
  opts.model = "crnn";
  opts.rnn = GENERATE("gru", "lstm");
  opts.rnn_hidden = 10;
  opts.hidden = 14;
  opts.dropout = 0.2;
  opts.seed = 77;
  CAPTURE(opts.rnn);
  trainer::MelInfo info;
  info.n_mels = 20;
  info.n_frames = 13;
  const auto model = trainer::make_model(opts, info, 3);
  CHECK(model->kind() == "crnn");
  const nlohmann::json j = model->config_json();
  CHECK(j.at("model") == "crnn");
  CHECK(j.at("n_mels") == 20);
  CHECK(j.at("n_frames") == 13);
  CHECK(j.at("num_classes") == 3);
  CHECK(j.at("rnn") == opts.rnn);
  CHECK(j.at("rnn_hidden") == 10);
  CHECK(j.at("hidden") == 14);
  CHECK(j.at("dropout").get<double>() == 0.2);
  CHECK(j.at("channels") == nlohmann::json::array({16, 32}));

  const auto again = trainer::make_model(opts, info, 3);
  const auto rebuilt = trainer::make_model_from_json(nlohmann::json::parse(j.dump()));
  CHECK(rebuilt->kind() == "crnn");
  CHECK(rebuilt->config_json() == j);
  auto src = model->named_parameters();
  auto dst = rebuilt->named_parameters();
  auto same = again->named_parameters();
  REQUIRE(src.size() == dst.size());
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : src) {
      CAPTURE(item.key());
      CHECK(torch::equal(item.value(), same[item.key()]));
      dst[item.key()].copy_(item.value());
    }
  }
  model->set_input_normalization(0.25, 1.5);
  rebuilt->set_input_normalization(0.25, 1.5);
  model->eval();
  rebuilt->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({2, 20, 13});
  CHECK(torch::equal(model->forward(x).logits, rebuilt->forward(x).logits));
  CHECK(torch::equal(model->forward(x).detection, rebuilt->forward(x).detection));
}

TEST_CASE("every crnn parameter receives a gradient from the combined loss", "[trainer][crnn]") {
  const std::string rnn = GENERATE("gru", "lstm");
  CAPTURE(rnn);
  torch::manual_seed(9);
  CrnnNet net(config(16, 20, 3, rnn));
  net->train();
  const at::Tensor x = torch::randn({6, 16, 20});
  const at::Tensor label = torch::tensor({0, 1, 2, 0, 1, 2}, torch::kLong);
  const at::Tensor loss = trainer::combined_loss(net->forward(x), label, 2, 1.0);
  loss.backward();
  for (const auto& item : net->named_parameters()) {
    const at::Tensor& p = item.value();
    CAPTURE(item.key());
    REQUIRE(p.grad().defined());
    CHECK(torch::isfinite(p.grad()).all().item<bool>());
    CHECK(p.grad().abs().sum().item<float>() > 0.0f);
  }
  CHECK_FALSE(net->initial_state().requires_grad());
}

TEST_CASE("crnn refuses bad configurations, JSON and inputs", "[trainer][crnn]") {
  CHECK_THROWS_AS(CrnnNet(config(3, 32, 2)), InvalidArgument);
  CHECK_THROWS_AS(CrnnNet(config(32, 1, 2)), InvalidArgument);
  CHECK_THROWS_AS(CrnnNet(config(32, 32, 1)), InvalidArgument);
  CHECK_THROWS_AS(CrnnNet(config(32, 32, 2, "rnn")), InvalidArgument);
  CHECK_THROWS_AS(CrnnNet(config(32, 32, 2, "gru", 0)), InvalidArgument);
  CrnnConfig c = config(32, 32, 2);
  c.dropout = 1.0;
  CHECK_THROWS_AS(CrnnNet(c), InvalidArgument);
  c = config(32, 32, 2);
  c.hidden = 0;
  CHECK_THROWS_AS(CrnnNet(c), InvalidArgument);
  c = config(32, 32, 2);
  c.channels = {16, 0};
  CHECK_THROWS_AS(CrnnNet(c), InvalidArgument);

  CrnnNet net(config(32, 32, 2));
  nlohmann::json j = net->config_json();
  j.erase("rnn_hidden");
  CHECK_THROWS_AS(trainer::make_model_from_json(j), FormatError);
  j = net->config_json();
  j["channels"] = {16, 32, 64};
  CHECK_THROWS_AS(trainer::make_model_from_json(j), FormatError);
  j = net->config_json();
  j["model"] = "crnn2";
  CHECK_THROWS_AS(trainer::make_model_from_json(j), FormatError);

  const at::Tensor bad = GENERATE(torch::zeros({2, 31, 32}), torch::zeros({2, 2, 32, 32}), torch::zeros({32, 32}),
                                  torch::zeros({2, 32, 0}));
  CAPTURE(bad.sizes());
  try {
    net->forward(bad);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("expected [B, 32, T] or [B, 1, 32, T] with T >= 1"));
  }
}

TEST_CASE("ScopedTf32 turns TF32 off or applies melforge-train's settings, and restores what it found",
          "[trainer][crnn]") {
  at::Context& ctx = at::globalContext();
  const test::ScopedTf32 outer(false);
  CHECK(ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST);
  CHECK_FALSE(ctx.allowTF32CuDNN(at::Float32Op::CONV));
  CHECK_FALSE(ctx.allowTF32CuDNN(at::Float32Op::RNN));
  const bool benchmark = ctx.benchmarkCuDNN();
  {
    const test::ScopedTf32 production(true);
    CHECK(ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::HIGH);
    CHECK(ctx.allowTF32CuDNN(at::Float32Op::CONV));
    CHECK(ctx.allowTF32CuDNN(at::Float32Op::RNN));
    CHECK(ctx.benchmarkCuDNN());
    {
      const test::ScopedTf32 off(false);
      CHECK(ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST);
      CHECK_FALSE(ctx.allowTF32CuDNN(at::Float32Op::CONV));
      CHECK_FALSE(ctx.allowTF32CuDNN(at::Float32Op::RNN));
    }
    CHECK(ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::HIGH);
    CHECK(ctx.allowTF32CuDNN(at::Float32Op::CONV));
    CHECK(ctx.allowTF32CuDNN(at::Float32Op::RNN));
    CHECK(ctx.benchmarkCuDNN());
  }
  CHECK(ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST);
  CHECK_FALSE(ctx.allowTF32CuDNN());
  CHECK(ctx.benchmarkCuDNN() == benchmark);
}

TEST_CASE("TF32 rounding moves the crnn's outputs beyond float32 tolerances, within a quarter of the CUDA bound",
          "[trainer][crnn]") {
  const std::string rnn = GENERATE("gru", "lstm");
  CAPTURE(rnn);
  auto [net, x] = cuda_case(rnn);
  torch::NoGradGuard no_grad;
  const auto [logits, detection] = reference_forward(net, x);
  const auto [logits_tf32, detection_tf32] = reference_forward(net, x, tf32_truncate);
  CHECK_FALSE(torch::allclose(logits_tf32, logits, 1e-4, 1e-5));
  CHECK(max_abs_diff(logits_tf32, logits) <= 0.25 * tf32_bound(logits));
  CHECK(max_abs_diff(detection_tf32, detection) <= 0.25 * tf32_bound(detection));
}

TEST_CASE("crnn runs on CUDA and matches the CPU", "[trainer][crnn][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  const std::string rnn = GENERATE("gru", "lstm");
  CAPTURE(rnn);
  auto [cpu, x] = cuda_case(rnn);
  CrnnNet gpu(config(32, 24, 4, rnn));
  {
    torch::NoGradGuard no_grad;
    auto dst = gpu->named_parameters();
    for (const auto& item : cpu->named_parameters()) dst[item.key()].copy_(item.value());
  }
  gpu->to(torch::kCUDA);
  gpu->eval();
  torch::NoGradGuard no_grad;
  const auto yc = cpu->forward(x);
  {
    const test::ScopedTf32 float32(false);
    const auto yg = gpu->forward(x.to(torch::kCUDA));
    CHECK(gpu->initial_state().device().is_cuda());
    CHECK(torch::allclose(yg.logits.cpu(), yc.logits, 1e-4, 1e-5));
    CHECK(torch::allclose(yg.detection.cpu(), yc.detection, 1e-4, 1e-5));
  }
  {
    const test::ScopedTf32 production(true);
    const auto yg = gpu->forward(x.to(torch::kCUDA));
    CHECK(max_abs_diff(yg.logits.cpu(), yc.logits) <= tf32_bound(yc.logits));
    CHECK(max_abs_diff(yg.detection.cpu(), yc.detection) <= tf32_bound(yc.detection));
  }
  const void* storage = gpu->initial_state().data_ptr();
  gpu->forward(x.narrow(0, 0, 3).to(torch::kCUDA));
  CHECK(gpu->initial_state().data_ptr() == storage);
}

}  // namespace melforge_test_trainer_crnn
