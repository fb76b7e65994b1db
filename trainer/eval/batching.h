#pragma once
/// What the evaluations (evaluate, evaluate_multilabel) share: the model's training mode restored on scope exit, and
/// the packing of whole files into forward passes.
#include <torch/nn/module.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace melforge::trainer {

/// Restores the module's training mode on scope exit.
class ModeGuard {
 public:
  /// Remembers `m`'s training mode.
  explicit ModeGuard(torch::nn::Module& m) : module_(m), training_(m.is_training()) {}
  ~ModeGuard() { module_.train(training_); }
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool training_;
};

/// [first, last) ranges of `files` files (file f has valid[f] valid long segments of `per_long` short segments),
/// each holding whole files of at most `batch` short segments together, and at least one file.
inline std::vector<std::pair<int64_t, int64_t>> file_ranges(const int64_t* valid, int64_t files, int64_t per_long,
                                                            int64_t batch) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t f0 = 0; f0 < files;) {
    int64_t f1 = f0, segs = 0;
    do {
      segs += valid[f1] * per_long;
      ++f1;
    } while (f1 < files && segs + valid[f1] * per_long <= batch);
    ranges.emplace_back(f0, f1);
    f0 = f1;
  }
  return ranges;
}

}  // namespace melforge::trainer
