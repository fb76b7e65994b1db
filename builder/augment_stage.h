#pragma once
/// Waveform augmentation in the build (--augment-copies; docs/FORMAT.md, "Waveform augmentation"): the plan stage
/// "augment_init" (the banks checked against --max-ram, then loaded once), the copies of each split (clean first,
/// then its K augmented copies, in scan order), the audio stage "augment" between decode and mel (the library's
/// augmenters, kernels/augment/augment.h), and what the rows, attributes and report record of it.
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "audio_stage.h"
#include "augment/augment.h"
#include "h5_writer.h"

namespace melforge::builder {

struct BuildState;
struct BatchTotals;

/// The stage "augment": applies each copy's recipe (reverberation, noise, gain; decode applied the speed) in place
/// in the arena. On the CPU per file on the worker threads (make_cpu_augmenter); after use_device, once per batch on
/// the calling thread (make_cuda_augmenter). Copy 0 and identity recipes are left untouched.
class AugmentStage final : public AudioStage {
 public:
  /// The augmentation of `args` (validated) at `sample_rate` Hz; nothing is loaded until load_banks().
  AugmentStage(const augment::AugmentArgs& args, int sample_rate) : args_(args), sample_rate_(sample_rate) {}
  /// "augment".
  std::string name() const override { return "augment"; }
  /// With the CUDA augmenter: its host bytes for the row's slice (Augmenter::item_bytes); else 0.
  int64_t batch_bytes(const PlannedCopy& row) const override;
  /// With the CPU augmenter: its scratch for the row's slice (Augmenter::item_bytes); else 0.
  int64_t worker_bytes(const PlannedCopy& row) const override;
  /// Applies file.recipe with the CPU augmenter (nothing for an identity recipe).
  void run(BatchFile& file) const override;
  /// True after use_device().
  bool batched() const override { return device_ != nullptr; }
  /// Applies the recipes of the kept, non-identity files in one call of the CUDA augmenter.
  void run_batch(std::span<BatchFile> files) const override;

  /// Loads the --noise and --rir banks (augment::load_bank with `extensions` on `threads` threads) and makes the
  /// CPU augmenter. Throws InvalidArgument naming the flag and the file that cannot be decoded.
  void load_banks(const std::vector<std::string>& extensions, int threads);
  /// Applies the recipes through `device` (the CUDA augmenter, made by init_augment_device) once per batch from now
  /// on; its host bytes count in held_bytes().
  void use_device(std::unique_ptr<augment::Augmenter> device) { device_ = std::move(device); }
  /// Frees the device augmenter, if any: the CPU augmenter applies the recipes from now on (the engine check's
  /// fallback).
  void use_cpu() { device_.reset(); }
  /// The noise bank (empty without --noise).
  const augment::Bank& noise() const { return noise_; }
  /// The impulse-response bank (empty without --rir).
  const augment::Bank& rir() const { return rir_; }
  /// Bytes of both banks in RAM.
  int64_t bank_bytes() const { return noise_.bytes() + rir_.bytes(); }
  /// Host bytes held for the whole build: bank_bytes() and the device augmenter's host bytes
  /// (Augmenter::host_bytes: the CUDA augmenter's pinned staging buffers).
  int64_t held_bytes() const { return bank_bytes() + (device_ ? device_->host_bytes() : 0); }
  /// The augmenter in use: the CUDA one after use_device(), else the CPU one; null before load_banks().
  const augment::Augmenter* augmenter() const { return device_ ? device_.get() : cpu_.get(); }
  /// The CPU augmenter (also after use_device(): the engine check's twin); null before load_banks().
  augment::Augmenter* cpu_augmenter() const { return cpu_.get(); }
  /// The options.
  const augment::AugmentArgs& args() const { return args_; }
  /// Takes `folder` as the --noise bank (a layout's, when --noise was not given); before load_banks().
  void use_noise_bank(const std::filesystem::path& folder) { args_.noise = folder; }

 private:
  augment::AugmentArgs args_;
  int sample_rate_ = 0;
  augment::Bank noise_;
  augment::Bank rir_;
  std::unique_ptr<augment::Augmenter> cpu_;
  std::unique_ptr<augment::Augmenter> device_;
};

/// Stage "augment_init" of a build with --augment-copies > 0 (nothing otherwise): reads the bank folders' headers
/// (augment::bank_bytes) and throws InvalidArgument naming --max-ram, the bank bytes and --noise/--rir when the
/// banks and the program's fixed reserve (kFixedReserveBytes) do not fit in --max-ram; then loads the banks
/// (AugmentStage::load_banks). Runs before probe, so that a bad bank fails before any input is read.
void init_augment(BuildState& state);

/// The smallest capacity C >= `largest_slice` (samples) with C >= budget(C) / 4 (integer division): `budget` is the
/// batch budget the batch runner uses once a device augmenter of capacity C holds its host bytes (so non-increasing
/// in C). A batch of two rows or more holds at most budget / 4 samples (batch_file_bytes counts 4 bytes a sample), a
/// batch of one row at most the largest slice, so every batch fits C. Throws InvalidArgument when largest_slice < 1.
int64_t augment_capacity(int64_t largest_slice, const std::function<int64_t(int64_t)>& budget);

/// augment_capacity for `state` after init_engine, with the budget of runner_batch_budget (batch_runner.h) as it will
/// be once the CUDA augmenter is in place: the audio stages' worker bytes without the CPU augmenter's scratch (the
/// device augmenter has none per thread), and the held bytes with the augmenter's pinned buffers for capacity C
/// (cuda::augment_buffer_sizes(...).pinned_bytes(), what CudaAugmenter::host_bytes reports) in place of none.
int64_t device_augment_capacity(const BuildState& state);

/// After init_engine, with a CUDA mel engine (state.engine_plan.cuda) and augmentation: moves the stage to the CUDA
/// augmenter on the plan's first device, of capacity device_augment_capacity(state). Nothing otherwise. Throws
/// CudaError.
void init_augment_device(BuildState& state);

/// The rows of split `split` (0 train, 1 val, 2 test) of state.usable in scan order: each file's clean copy, then,
/// when the split is in --augment-splits, its copies 1..K with augment::draw_recipe(args, banks, --seed, rel_path,
/// k), each with its row plan (BuildState::row_plan at the recipe's speed: a whole clip of its own length). In
/// train, with --speed-speakers, each file's group is followed by one group per factor F in the order given: the
/// utterance of speaker `<class>_sp<F>` (copy 0, decoded at speed F) and its copies 1..K, drawn for the path
/// `<rel_path>#sp<F>` and decoded at F times their drawn speed.
std::vector<PlannedCopy> split_copies(const BuildState& state, std::size_t split);

/// The row record of `recipe` (bank indices turned into the clips' relative paths; SNR NaN without noise).
RowRecipe row_recipe(const BuildState& state, const augment::Recipe& recipe);

/// Root attributes of the augmentation settings (augment_copies, augment_splits, ...; docs/FORMAT.md); empty
/// without augmentation.
std::vector<Attribute> augment_attributes(const BuildState& state);

/// Rows written per split ([3]) and class: {clean, augmented}.
using CopyCounts = std::vector<std::map<std::string, std::array<int64_t, 2>>>;

/// The report's "augmentation" object (docs/FORMAT.md): settings, augmenter, banks (clips, seconds, bytes), and the
/// rows written per split and per class, clean and augmented apart, and the augmented copies skipped.
nlohmann::json augment_report(const BuildState& state, const CopyCounts& copies, int64_t skipped_copies);

}  // namespace melforge::builder
