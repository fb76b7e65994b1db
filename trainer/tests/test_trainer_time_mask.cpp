// Inputs of any length with padding: every model (cnn, crnn, resnet-se, ecapa) gives a padded row the output of the
// row alone at its real length whatever the padding holds; the time-mask helpers and the input statistics over real
// frames against naive loops. About 2 s of CI in all.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include "catch_torch.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "models/input_statistics.h"
#include "models/model.h"
#include "models/time_mask.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_time_mask {

using namespace melforge;
using namespace melforge::trainer;

namespace {

constexpr int64_t kMels = 16;

/// The models under test: small widths of each architecture (kMels mel bands, 4 classes).
nlohmann::json model_config(const std::string& name) {
  const nlohmann::json shape = {{"n_mels", kMels}, {"n_frames", 24}, {"num_classes", 4}};
  nlohmann::json j = shape;
  if (name == "cnn") {
    j.update({{"model", "cnn"}, {"channels", {4, 6, 8}}, {"hidden", 12}, {"dropout", 0.3}, {"time_pool", "mean_max"}});
  } else if (name == "crnn-gru" || name == "crnn-lstm") {
    j.update({{"model", "crnn"}, {"channels", {4, 6}}, {"rnn", name == "crnn-gru" ? "gru" : "lstm"},
              {"rnn_hidden", 10}, {"hidden", 12}, {"dropout", 0.3}});
  } else if (name == "resnet-se") {
    j.update({{"model", "resnet-se"}, {"width", "quarter"}, {"embedding_dim", 8}});
  } else {
    j.update({{"model", "ecapa"}, {"channels", 16}, {"embedding_dim", 8}});
  }
  return j;
}

/// The model of `name`, seeded, in eval mode, with an input normalisation and batch-norm statistics and affine
/// parameters away from their identity defaults (so that padding turned into zeros would not stay zeros through them).
std::shared_ptr<Classifier> eval_model(const std::string& name) {
  at::manual_seed(31);
  auto model = make_model_from_json(model_config(name), /*any_task=*/true);
  model->set_input_normalization(-30.0, 8.0);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_buffers()) {
    if (item.key().ends_with("running_mean")) item.value().normal_(0.0, 0.5);
    if (item.key().ends_with("running_var")) item.value().uniform_(0.5, 2.0);
  }
  for (auto& item : model->named_parameters())
    if (item.key().find("bn") != std::string::npos || item.key().find("downsample.1") != std::string::npos)
      item.value().normal_(item.key().ends_with("weight") ? 1.0 : 0.0, 0.3);
  model->eval();
  return model;
}

/// The output a model gives a row: its class logits, then its detection logit or embedding.
at::Tensor outputs(const ModelOutput& y) {
  return at::cat({y.logits, y.detection.defined() ? y.detection.unsqueeze(1) : y.embedding}, 1);
}

/// `x` [B, M, T] with every frame t >= lengths[b] replaced by `fill` (a tensor of x's shape).
at::Tensor with_padding(const at::Tensor& x, const std::vector<int64_t>& lengths, const at::Tensor& fill) {
  at::Tensor out = x.clone();
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const auto row = static_cast<int64_t>(b);
    const int64_t t = x.size(2) - lengths[b];
    out[row].narrow(1, lengths[b], t).copy_(fill[row].narrow(1, lengths[b], t));
  }
  return out;
}

}  // namespace

TEST_CASE("every model gives a padded row the output of the row alone, whatever the padding holds",
          "[trainer][model][mask]") {
  const std::string name = GENERATE("cnn", "crnn-gru", "crnn-lstm", "resnet-se", "ecapa");
  const int64_t frames = GENERATE(40, 37);
  CAPTURE(name, frames);
  const auto model = eval_model(name);
  torch::NoGradGuard no_grad;
  // Full, odd, even, a clip that is mostly padding (3 and 1 real frames of 40), and one real step after 8x pooling.
  const std::vector<int64_t> lengths = {frames, 17, 22, 3, 1, 9};
  const auto b = static_cast<int64_t>(lengths.size());
  at::manual_seed(5);
  const at::Tensor x = at::randn({b, kMels, frames}) * 8.0 - 30.0;
  const at::Tensor len = torch::tensor(lengths, torch::kLong);
  const at::Tensor garbage = with_padding(x, lengths, at::randn({b, kMels, frames}) * 1000.0);
  const at::Tensor batch = outputs(model->forward(garbage, len));
  REQUIRE(batch.size(0) == b);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t n = lengths[static_cast<std::size_t>(r)];
    CAPTURE(r, n);
    const at::Tensor alone = outputs(model->forward(x[r].narrow(1, 0, n).unsqueeze(0)));
    CHECK(at::allclose(batch[r], alone[0], 1e-4, 1e-4));
    CHECK(at::isfinite(batch[r]).all().item<bool>());
  }
  at::Tensor other = at::full({b, kMels, frames}, std::numeric_limits<float>::quiet_NaN());
  other.narrow(2, 0, 2).fill_(std::numeric_limits<float>::infinity());
  CHECK(at::equal(outputs(model->forward(with_padding(x, lengths, other), len)), batch));
  CHECK(at::equal(outputs(model->forward(with_padding(x, lengths, at::zeros_like(x)), len)), batch));
  // The comparison can fail: the same batch without its lengths pools over the garbage.
  const at::Tensor unmasked = outputs(model->forward(garbage));
  CHECK_FALSE(at::allclose(unmasked[3], batch[3], 1e-2, 1e-2));
  // Full lengths are the same as none.
  const at::Tensor full = outputs(model->forward(x, at::full({b}, frames, torch::kLong)));
  CHECK(at::allclose(full, outputs(model->forward(x)), 1e-4, 1e-5));
}

TEST_CASE("models check lengths: int64, one per row, within 1 and the frames", "[trainer][model][mask]") {
  const std::string name = GENERATE("cnn", "crnn-gru", "resnet-se", "ecapa");
  CAPTURE(name);
  const auto model = eval_model(name);
  torch::NoGradGuard no_grad;
  const at::Tensor x = at::zeros({2, kMels, 12});
  const at::Tensor bad = GENERATE(torch::tensor({12, 5}, torch::kInt), torch::tensor({12}, torch::kLong),
                                  torch::tensor({{12, 5}}, torch::kLong), torch::tensor({12, 0}, torch::kLong),
                                  torch::tensor({13, 5}, torch::kLong), torch::tensor({-1, 5}, torch::kLong));
  CAPTURE(bad);
  CHECK_THROWS_WITH(model->forward(x, bad), Catch::Contains(model->kind() + ": lengths"));
  CHECK_NOTHROW(model->forward(x, torch::tensor({12, 1}, torch::kLong)));
}

TEST_CASE("downsampled lengths, masks, masked means and maxima against loops", "[trainer][mask]") {
  const int64_t k = GENERATE(1, 2, 4, 8);
  const int64_t frames = GENERATE(1, 7, 16);
  CAPTURE(k, frames);
  std::vector<int64_t> lens;
  for (int64_t n = 1; n <= frames; ++n) lens.push_back(n);
  const at::Tensor len = torch::tensor(lens, torch::kLong);
  const int64_t t_out = (frames + k - 1) / k;
  const at::Tensor down = downsampled_lengths(len, k, t_out);
  for (std::size_t i = 0; i < lens.size(); ++i) {
    const int64_t want = std::max<int64_t>(1, std::min<int64_t>((lens[i] + k - 1) / k, t_out));
    CHECK(down[static_cast<int64_t>(i)].item<int64_t>() == want);
  }
  CHECK_FALSE(downsampled_lengths(at::Tensor(), k, t_out).defined());

  at::manual_seed(2);
  const auto b = static_cast<int64_t>(lens.size());
  const at::Tensor x = at::randn({b, 3, frames});
  const at::Tensor mean = masked_mean_time(x, len), max = masked_max_time(x, len), masked = mask_time(x, len);
  const at::Tensor mask = time_mask(len, frames);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      double sum = 0, top = -1e30;
      for (int64_t t = 0; t < frames; ++t) {
        const bool real = t < lens[static_cast<std::size_t>(r)];
        CHECK(mask[r][t].item<bool>() == real);
        CHECK(masked[r][c][t].item<float>() == (real ? x[r][c][t].item<float>() : 0.0f));
        if (!real) continue;
        sum += x[r][c][t].item<double>();
        top = std::max(top, x[r][c][t].item<double>());
      }
      CHECK(mean[r][c].item<double>() == Approx(sum / static_cast<double>(lens[static_cast<std::size_t>(r)])));
      CHECK(max[r][c].item<double>() == Approx(top));
    }
  CHECK(at::equal(masked_mean_time(x, at::Tensor()), x.mean(-1)));
  CHECK(at::equal(mask_time(x, at::Tensor()), x));
  const at::Tensor padded = pad_time_to_multiple(x, k);
  CHECK(padded.size(2) == t_out * k);
  CHECK(at::equal(padded.narrow(2, 0, frames), x));
  CHECK(padded.narrow(2, frames, t_out * k - frames).abs().sum().item<double>() == 0.0);
}

TEST_CASE("input statistics count the real frames only, as a naive double loop does", "[trainer][mask]") {
  const double offset = GENERATE(0.0, -1000.0);
  CAPTURE(offset);
  at::manual_seed(9);
  InputStatistics stats;
  std::vector<double> values;
  const auto add_naive = [&](const at::Tensor& x, const std::vector<int64_t>& lens) {
    for (std::size_t b = 0; b < lens.size(); ++b)
      for (int64_t m = 0; m < x.size(1); ++m)
        for (int64_t t = 0; t < lens[b]; ++t) values.push_back(x[static_cast<int64_t>(b)][m][t].item<double>());
  };
  const std::vector<std::vector<int64_t>> batches = {{9, 2, 0}, {1, 9}, {5}};
  for (const auto& lens : batches) {
    const auto b = static_cast<int64_t>(lens.size());
    const at::Tensor x = at::randn({b, 4, 9}) * 3.0 + offset;
    stats.add(with_padding(x, lens, at::full({b, 4, 9}, std::numeric_limits<float>::quiet_NaN())),
              torch::tensor(lens, torch::kLong));
    add_naive(x, lens);
  }
  const at::Tensor frames = at::randn({6, 4}) + offset;
  stats.add_frames(frames);
  add_naive(frames.t().unsqueeze(0), {6});
  const at::Tensor whole = at::randn({2, 1, 4, 3}) + offset;
  stats.add(whole);
  add_naive(whole.squeeze(1), {3, 3});
  double mean = 0, var = 0;
  for (const double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  for (const double v : values) var += (v - mean) * (v - mean);
  var /= static_cast<double>(values.size());
  CHECK(stats.count() == static_cast<double>(values.size()));
  const auto [got_mean, got_std] = stats.mean_std();
  CHECK(got_mean == Approx(mean).epsilon(1e-12));
  CHECK(got_std == Approx(std::sqrt(var)).epsilon(1e-9));

  CHECK(InputStatistics().mean_std() == std::pair<double, double>{0.0, 1.0});
  InputStatistics constant;
  constant.add_frames(at::full({3, 4}, 2.5));
  CHECK(constant.mean_std() == std::pair<double, double>{2.5, 1.0});
  CHECK_THROWS_AS(constant.add(at::zeros({2, 4, 5}), torch::tensor({6, 1}, torch::kLong)), InvalidArgument);
  CHECK_THROWS_AS(constant.add(at::zeros({4, 5})), InvalidArgument);
}

}  // namespace melforge_test_trainer_time_mask
