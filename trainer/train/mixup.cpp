#include "train/mixup.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_sample_dirichlet.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/randperm.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <string>

#include "melforge/common/errors.h"
#include "train/rng_state.h"

namespace po = boost::program_options;

namespace melforge::trainer {

void MixupOptions::validate() const {
  if (!(alpha >= 0.0) || !std::isfinite(alpha))
    throw InvalidArgument("--mixup must be a finite number >= 0 (0: off), got " + std::to_string(alpha));
}

void add_options(po::options_description& desc, MixupOptions& opts) {
  desc.add_options()("mixup", po::value(&opts.alpha)->default_value(opts.alpha)->value_name("ALPHA"),
                     "mixup of the training batches: lambda ~ Beta(ALPHA, ALPHA) per batch, spectrograms and labels "
                     "mixed with a permutation of the batch (0: off)");
}

MixupDraw draw_mixup(int64_t batch, double alpha, at::Device device, at::Generator* gen) {
  if (!(alpha > 0.0) || !std::isfinite(alpha))
    throw InvalidArgument("draw_mixup: alpha must be a finite number > 0, got " + std::to_string(alpha));
  if (batch < 0) throw InvalidArgument("draw_mixup: negative batch size " + std::to_string(batch));
  const at::Generator g = gen ? *gen : default_generator(device);
  const at::TensorOptions on = at::TensorOptions().device(device);
  const at::Tensor concentration = at::full({2}, alpha, on.dtype(at::kDouble));
  MixupDraw d;
  d.lambda = at::_sample_dirichlet(concentration, g).select(0, 0).to(at::kFloat);
  d.perm = at::randperm(batch, g, on.dtype(at::kLong));
  return d;
}

at::Tensor mix_batch(const at::Tensor& x, const MixupDraw& draw) {
  const at::Tensor lam = draw.lambda.to(x.scalar_type());
  return x * lam + x.index_select(0, draw.perm) * (1 - lam);
}

at::Tensor mix_losses(const at::Tensor& own, const at::Tensor& partner, const MixupDraw& draw) {
  return own * draw.lambda + partner * (1 - draw.lambda);
}

at::Tensor mix_lengths(const at::Tensor& lengths, const MixupDraw& draw) {
  return at::maximum(lengths, lengths.index_select(0, draw.perm.to(lengths.device())));
}

at::Tensor mix_targets(const at::Tensor& targets, const MixupDraw& draw) {
  const at::Tensor t = targets.to(at::kFloat);
  return t * draw.lambda + t.index_select(0, draw.perm.to(t.device())) * (1 - draw.lambda);
}

}  // namespace melforge::trainer
