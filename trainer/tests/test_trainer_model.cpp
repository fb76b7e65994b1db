// `--model cnn`: shapes, parameter count, wiring against a functional reference, in-place ReLU, seeding, gradients.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include "catch_torch.h"

#include "melforge/common/errors.h"
#include "models/cnn.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_model {

using namespace melforge;
using trainer::CnnConfig;
using trainer::CnnNet;

namespace {

CnnConfig config(int64_t n_mels, int64_t n_frames, int64_t classes) {
  CnnConfig c;
  c.n_mels = n_mels;
  c.n_frames = n_frames;
  c.num_classes = classes;
  return c;
}

/// Parameters of the CNN counted by hand: three 3x3 convolutions, the hidden layer and the two heads.
int64_t expected_parameters(const CnnConfig& c) {
  const auto& ch = c.channels;
  const int64_t conv = (1 * 9 + 1) * ch[0] + (ch[0] * 9 + 1) * ch[1] + (ch[1] * 9 + 1) * ch[2];
  const int64_t flat = ch[2] * (c.n_mels / 4) * (c.n_frames / 4);
  return conv + (flat + 1) * c.hidden + (c.hidden + 1) * c.num_classes + (c.hidden + 1);
}

int64_t count_parameters(CnnNet& net) {
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  return n;
}

/// The forward pass written out with functional ops on the module's own weights.
std::pair<at::Tensor, at::Tensor> reference_forward(CnnNet& net, const at::Tensor& x) {
  auto p = net->named_parameters();
  at::Tensor h = x.unsqueeze(1);
  h = at::max_pool2d(at::relu(at::conv2d(h, p["conv1.weight"], p["conv1.bias"], 1, 1)), 2);
  h = at::max_pool2d(at::relu(at::conv2d(h, p["conv2.weight"], p["conv2.bias"], 1, 1)), 2);
  h = at::relu(at::conv2d(h, p["conv3.weight"], p["conv3.bias"], 1, 1));
  h = at::relu(at::linear(h.flatten(1), p["fc.weight"], p["fc.bias"]));
  return {at::linear(h, p["class_head.weight"], p["class_head.bias"]),
          at::linear(h, p["detect_head.weight"], p["detect_head.bias"]).squeeze(1)};
}

}  // namespace

TEST_CASE("cnn output shapes and parameter count follow the input shape", "[trainer][model]") {
  const auto [n_mels, n_frames] = GENERATE(std::pair<int64_t, int64_t>{32, 32}, std::pair<int64_t, int64_t>{64, 17},
                                           std::pair<int64_t, int64_t>{4, 4}, std::pair<int64_t, int64_t>{40, 101});
  const int64_t classes = GENERATE(2, 5);
  const int64_t batch = GENERATE(1, 3);
  CAPTURE(n_mels, n_frames, classes, batch);
  const CnnConfig c = config(n_mels, n_frames, classes);
  torch::manual_seed(1);
  CnnNet net(c);
  net->eval();
  CHECK(c.flat_features() == 64 * (n_mels / 4) * (n_frames / 4));
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

TEST_CASE("cnn computes conv-relu-pool x2, conv-relu, fc-relu and two heads", "[trainer][model]") {
  const CnnConfig c = config(GENERATE(16, 20), GENERATE(12, 33), 4);
  CAPTURE(c.n_mels, c.n_frames);
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
  CHECK_THROWS_AS(CnnNet(config(32, 3, 2)), InvalidArgument);
  CHECK_THROWS_AS(CnnNet(config(32, 32, 1)), InvalidArgument);
  CnnConfig c = config(32, 32, 2);
  c.dropout = 1.0;
  CHECK_THROWS_AS(CnnNet(c), InvalidArgument);
  c = config(32, 32, 2);
  c.hidden = 0;
  CHECK_THROWS_AS(CnnNet(c), InvalidArgument);

  CnnNet net(config(32, 32, 2));
  const at::Tensor bad = GENERATE(torch::zeros({2, 32, 31}), torch::zeros({2, 2, 32, 32}), torch::zeros({32, 32}),
                                  torch::zeros({1, 2, 1, 32, 32}));
  CAPTURE(bad.sizes());
  try {
    net->forward(bad);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("expected [B, 32, 32] or [B, 1, 32, 32]"));
  }
}

}  // namespace melforge_test_trainer_model
