// `--model cnn`: shapes, parameter count, wiring against a functional reference (both time poolings), in-place ReLU,
// seeding, gradients, checkpoints from before the time pooling (time_pool flatten).
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include "catch_torch.h"

#include <string>

#include "melforge/common/errors.h"
#include "models/cnn.h"
#include "models/model.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_model {

using namespace melforge;
using trainer::CnnConfig;
using trainer::CnnNet;

namespace {

CnnConfig config(int64_t n_mels, int64_t n_frames, int64_t classes, const std::string& time_pool = "mean_max") {
  CnnConfig c;
  c.n_mels = n_mels;
  c.n_frames = n_frames;
  c.num_classes = classes;
  c.time_pool = time_pool;
  return c;
}

/// Parameters of the CNN counted by hand: three 3x3 convolutions, the hidden layer and the two heads.
int64_t expected_parameters(const CnnConfig& c) {
  const auto& ch = c.channels;
  const int64_t conv = (1 * 9 + 1) * ch[0] + (ch[0] * 9 + 1) * ch[1] + (ch[1] * 9 + 1) * ch[2];
  const int64_t flat = c.time_pool == "flatten" ? ch[2] * (c.n_mels / 4) * (c.n_frames / 4) : 2 * ch[2] * (c.n_mels / 4);
  return conv + (flat + 1) * c.hidden + (c.hidden + 1) * c.num_classes + (c.hidden + 1);
}

int64_t count_parameters(CnnNet& net) {
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  return n;
}

/// `h` [B, C, M, T] with the steps from `real` on set to 0.
at::Tensor zero_after(const at::Tensor& h, int64_t real) {
  at::Tensor out = h.clone();
  out.narrow(3, real, h.size(3) - real).zero_();
  return out;
}

/// The forward pass written out with functional ops on the module's own weights, for inputs whose rows are all real.
/// mean_max: the time axis padded with zeros to a multiple of 4, the pooled steps after the first ceil(T / 2) and
/// ceil(T / 4) zeroed before the next convolution, mean and maximum over the first ceil(T / 4) steps.
std::pair<at::Tensor, at::Tensor> reference_forward(CnnNet& net, const at::Tensor& x) {
  auto p = net->named_parameters();
  const bool flatten = net->config().time_pool == "flatten";
  const int64_t t = x.size(-1), padded = flatten ? t : (t + 3) / 4 * 4;
  at::Tensor h = at::constant_pad_nd(x.unsqueeze(1), {0, padded - t});
  h = at::max_pool2d(at::relu(at::conv2d(h, p["conv1.weight"], p["conv1.bias"], 1, 1)), 2);
  if (!flatten) h = zero_after(h, (t + 1) / 2);
  h = at::max_pool2d(at::relu(at::conv2d(h, p["conv2.weight"], p["conv2.bias"], 1, 1)), 2);
  if (!flatten) h = zero_after(h, (t + 3) / 4);
  h = at::relu(at::conv2d(h, p["conv3.weight"], p["conv3.bias"], 1, 1));
  at::Tensor features = h.flatten(1);
  if (!flatten) {
    const at::Tensor real = h.narrow(3, 0, (t + 3) / 4);
    features = at::cat({real.mean(3).flatten(1), std::get<0>(real.max(3)).flatten(1)}, 1);
  }
  h = at::relu(at::linear(features, p["fc.weight"], p["fc.bias"]));
  return {at::linear(h, p["class_head.weight"], p["class_head.bias"]),
          at::linear(h, p["detect_head.weight"], p["detect_head.bias"]).squeeze(1)};
}

}  // namespace

TEST_CASE("cnn output shapes and parameter count follow the input shape", "[trainer][model]") {
  const auto [n_mels, n_frames] = GENERATE(std::pair<int64_t, int64_t>{32, 32}, std::pair<int64_t, int64_t>{64, 17},
                                           std::pair<int64_t, int64_t>{4, 4}, std::pair<int64_t, int64_t>{40, 101});
  const int64_t classes = GENERATE(2, 5);
  const int64_t batch = GENERATE(1, 3);
  const std::string pool = GENERATE("mean_max", "flatten");
  CAPTURE(n_mels, n_frames, classes, batch, pool);
  const CnnConfig c = config(n_mels, n_frames, classes, pool);
  torch::manual_seed(1);
  CnnNet net(c);
  net->eval();
  CHECK(c.flat_features() == (pool == "flatten" ? 64 * (n_mels / 4) * (n_frames / 4) : 2 * 64 * (n_mels / 4)));
  CHECK(net->fixed_frames() == (pool == "flatten" ? n_frames : 0));
  CHECK(net->named_parameters()["fc.weight"].sizes().vec() == std::vector<int64_t>{128, c.flat_features()});
  CHECK(count_parameters(net) == expected_parameters(c));

  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({batch, n_mels, n_frames});
  const auto y = net->forward(x);
  CHECK(y.logits.sizes().vec() == std::vector<int64_t>{batch, classes});
  CHECK(y.detection.sizes().vec() == std::vector<int64_t>{batch});
  const auto y4 = net->forward(x.unsqueeze(1));
  CHECK(torch::equal(y.logits, y4.logits));
  CHECK(torch::equal(y.detection, y4.detection));
}

TEST_CASE("cnn computes conv-relu-pool x2, conv-relu, time pooling, fc-relu and two heads", "[trainer][model]") {
  const CnnConfig c = config(GENERATE(16, 20), GENERATE(12, 33), 4, GENERATE("mean_max", "flatten"));
  CAPTURE(c.n_mels, c.n_frames, c.time_pool);
  torch::manual_seed(3);
  CnnNet net(c);
  net->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({5, c.n_mels, c.n_frames});
  const auto y = net->forward(x);
  const auto [logits, detection] = reference_forward(net, x);
  CHECK(torch::allclose(y.logits, logits, 1e-5, 1e-6));
  CHECK(torch::allclose(y.detection, detection, 1e-5, 1e-6));
}

TEST_CASE("cnn has three convolutions, one max-pool used twice and an in-place ReLU", "[trainer][model]") {
  CnnNet net(config(32, 32, 3));
  int convs = 0;
  int pools = 0;
  for (const auto& m : net->modules(false)) {
    if (m->as<torch::nn::Conv2d>()) ++convs;
    if (m->as<torch::nn::MaxPool2d>()) ++pools;
  }
  CHECK(convs == 3);
  CHECK(pools == 1);
  auto relu = net->named_children()["relu"];
  REQUIRE(relu->as<torch::nn::ReLU>());
  CHECK(relu->as<torch::nn::ReLU>()->options.inplace());
  const at::Tensor t = torch::tensor({-1.0f, 2.0f});
  relu->as<torch::nn::ReLU>()->forward(t);
  CHECK(t[0].item<float>() == 0.0f);
}

TEST_CASE("cnn initialisation is seeded", "[trainer][model]") {
  auto params = [](uint64_t seed) {
    torch::manual_seed(seed);
    CnnNet net(config(32, 32, 3));
    std::vector<at::Tensor> out;
    for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
    return out;
  };
  const auto a = params(11);
  const auto b = params(11);
  const auto c = params(12);
  REQUIRE(a.size() == b.size());
  bool all_equal = true;
  bool any_differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    all_equal = all_equal && torch::equal(a[i], b[i]);
    any_differs = any_differs || !torch::equal(a[i], c[i]);
  }
  CHECK(all_equal);
  CHECK(any_differs);
}

TEST_CASE("dropout is active in training mode only", "[trainer][model]") {
  CnnConfig c = config(32, 32, 3);
  c.dropout = 0.5;
  torch::manual_seed(5);
  CnnNet net(c);
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({8, 32, 32});
  net->eval();
  CHECK(torch::equal(net->forward(x).logits, net->forward(x).logits));
  net->train();
  CHECK_FALSE(torch::equal(net->forward(x).logits, net->forward(x).logits));
}

TEST_CASE("every cnn parameter receives a gradient from both heads' losses", "[trainer][model]") {
  torch::manual_seed(9);
  CnnNet net(config(32, 32, 3));
  net->train();
  const at::Tensor x = torch::randn({6, 32, 32});
  const at::Tensor label = torch::tensor({0, 1, 2, 0, 1, 2}, torch::kLong);
  const at::Tensor positive = (label == 2).to(torch::kFloat);
  const auto y = net->forward(x);
  const at::Tensor loss = torch::nn::functional::cross_entropy(y.logits, label) +
                          torch::nn::functional::binary_cross_entropy_with_logits(y.detection, positive);
  loss.backward();
  for (const auto& item : net->named_parameters()) {
    const at::Tensor& p = item.value();
    CAPTURE(item.key());
    REQUIRE(p.grad().defined());
    CHECK(torch::isfinite(p.grad()).all().item<bool>());
    CHECK(p.grad().abs().sum().item<float>() > 0.0f);
  }
}

TEST_CASE("cnn refuses bad configurations and inputs", "[trainer][model]") {
  CHECK_THROWS_AS(CnnNet(config(3, 32, 2)), InvalidArgument);
  CHECK_THROWS_AS(CnnNet(config(32, 32, 1)), InvalidArgument);
  CnnConfig c = config(32, 32, 2);
  c.dropout = 1.0;
  CHECK_THROWS_AS(CnnNet(c), InvalidArgument);
  c = config(32, 32, 2);
  c.hidden = 0;
  CHECK_THROWS_AS(CnnNet(c), InvalidArgument);

  c = config(32, 32, 2);
  c.time_pool = "mean";
  CHECK_THROWS_WITH(CnnNet(c), Catch::Contains("time_pool"));
  CHECK_NOTHROW(CnnNet(config(32, 1, 2)));
  CHECK_THROWS_AS(CnnNet(config(32, 3, 2, "flatten")), InvalidArgument);

  CnnNet net(config(32, 32, 2));
  const at::Tensor bad = GENERATE(torch::zeros({2, 31, 32}), torch::zeros({2, 2, 32, 32}), torch::zeros({32, 32}),
                                  torch::zeros({1, 2, 1, 32, 32}), torch::zeros({2, 32, 0}));
  CAPTURE(bad.sizes());
  try {
    net->forward(bad);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("expected [B, 32, T] or [B, 1, 32, T] with T >= 1"));
  }
  CnnNet old(config(32, 32, 2, "flatten"));
  try {
    old->forward(torch::zeros({2, 32, 31}));
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("expected [B, 32, 32] or [B, 1, 32, 32]"));
  }
}

TEST_CASE("a cnn configuration without time_pool is the flatten architecture of older checkpoints",
          "[trainer][model]") {
  torch::manual_seed(21);
  CnnNet fresh(config(16, 12, 3));
  nlohmann::json j = fresh->config_json();
  CHECK(j.at("time_pool") == "mean_max");
  CHECK(trainer::make_model_from_json(j)->config_json() == j);
  j.erase("time_pool");
  const auto old = trainer::make_model_from_json(j);
  CHECK(old->config_json().at("time_pool") == "flatten");
  CHECK(old->fixed_frames() == 12);
  CHECK(old->named_parameters()["fc.weight"].size(1) == 64 * 4 * 3);
  old->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({3, 16, 12});
  const auto y = old->forward(x);
  const auto full = old->forward(x, torch::full({3}, 12, torch::kLong));
  CHECK(torch::equal(y.logits, full.logits));
  CHECK_THROWS_WITH(old->forward(x, torch::tensor({12, 5, 12}, torch::kLong)),
                    Catch::Contains("cannot leave padding out"));
}

}  // namespace melforge_test_trainer_model
