#include "train/spec_augment.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <optional>
#include <string>

#include "melforge/common/errors.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

/// [B, axis] bool: true inside any of `count` bands per row; row b's bands lie within its first sizes[b] positions
/// (`sizes`: int64 [B, 1, 1], each in [1, axis]), widths uniform in [0, min(width, sizes[b])], starts uniform in
/// [0, sizes[b] - w].
at::Tensor band_mask(int64_t batch, int64_t axis, const at::Tensor& sizes, int64_t count, int64_t width,
                     const std::optional<at::Generator>& gen, const at::TensorOptions& on) {
  const at::Tensor w_max = sizes.clamp_max(width);
  const at::Tensor w = (at::rand({batch, count, 1}, gen, on.dtype(at::kFloat)) * (w_max + 1).to(at::kFloat))
                           .floor_().to(at::kLong).minimum(w_max);
  const at::Tensor room = (sizes - w + 1).to(at::kFloat);
  const at::Tensor s = (at::rand({batch, count, 1}, gen, on.dtype(at::kFloat)) * room).floor_().to(at::kLong)
                           .minimum(sizes - w);
  const at::Tensor idx = at::arange(axis, on.dtype(at::kLong));
  return ((idx >= s) & (idx < s + w)).any(1);
}

}  // namespace

void SpecAugmentOptions::validate() const {
  const auto check = [](int64_t v, const char* flag) {
    if (v < 0) throw InvalidArgument(std::string(flag) + " must be >= 0, got " + std::to_string(v));
  };
  check(time_masks, "--spec-time-masks");
  check(time_width, "--spec-time-width");
  check(freq_masks, "--spec-freq-masks");
  check(freq_width, "--spec-freq-width");
}

void add_options(po::options_description& desc, SpecAugmentOptions& opts) {
  desc.add_options()(
      "spec-time-masks", po::value(&opts.time_masks)->default_value(opts.time_masks)->value_name("N"),
      "SpecAugment: time masks per training example (0: none)")(
      "spec-time-width", po::value(&opts.time_width)->default_value(opts.time_width)->value_name("FRAMES"),
      "SpecAugment: maximum width of a time mask; widths are uniform in [0, FRAMES]")(
      "spec-freq-masks", po::value(&opts.freq_masks)->default_value(opts.freq_masks)->value_name("N"),
      "SpecAugment: frequency masks per training example (0: none)")(
      "spec-freq-width", po::value(&opts.freq_width)->default_value(opts.freq_width)->value_name("BANDS"),
      "SpecAugment: maximum width of a frequency mask; widths are uniform in [0, BANDS]");
}

at::Tensor spec_augment(const at::Tensor& x, const SpecAugmentOptions& opts, at::Generator* gen,
                        const at::Tensor& lengths) {
  opts.validate();
  const bool ok = x.defined() && (x.dim() == 3 || (x.dim() == 4 && x.size(1) == 1)) && x.is_floating_point();
  if (!ok) throw InvalidArgument("spec_augment: expected a float tensor [B, M, T] or [B, 1, M, T]");
  if (!opts.enabled() || x.numel() == 0) return x;
  const int64_t b = x.size(0), m = x.size(-2), t = x.size(-1);
  if (lengths.defined() && (lengths.dim() != 1 || lengths.size(0) != b))
    throw InvalidArgument("spec_augment: lengths must be int64 [B] with B = " + std::to_string(b));
  const std::optional<at::Generator> g = gen ? std::optional<at::Generator>(*gen) : std::nullopt;
  const at::TensorOptions on = at::TensorOptions().device(x.device());
  const at::Tensor len = lengths.defined() ? lengths.to(x.device(), at::kLong).clamp(1, t)
                                           : at::full({b}, t, on.dtype(at::kLong));
  const at::Tensor x3 = x.reshape({b, m, t});
  const at::Tensor real = at::arange(t, on.dtype(at::kLong)).lt(len.unsqueeze(1)).unsqueeze(1);  // [B, 1, T]
  at::Tensor mask = at::zeros_like(x3, at::TensorOptions().dtype(at::kBool));
  if (opts.time_masks > 0 && opts.time_width > 0)
    mask = mask | band_mask(b, t, len.view({b, 1, 1}), opts.time_masks, opts.time_width, g, on).unsqueeze(1);
  if (opts.freq_masks > 0 && opts.freq_width > 0)
    mask = mask | (band_mask(b, m, at::full({b, 1, 1}, m, on.dtype(at::kLong)), opts.freq_masks, opts.freq_width, g,
                             on).unsqueeze(2) & real);
  const at::Tensor real_f = real.to(at::kFloat);
  const at::Tensor fill = ((x3.to(at::kFloat) * real_f).sum({1, 2}, true) / (real_f.sum({1, 2}, true) * m))
                              .to(x.scalar_type());
  return at::where(mask, fill, x3).view(x.sizes());
}

}  // namespace melforge::trainer
