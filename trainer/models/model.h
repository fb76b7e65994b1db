#pragma once
/// The interface every `--model` implements, and the factory that builds one from ModelOptions and a dataset's
/// parameters. The trainer, the evaluation, predict and export only see this interface.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace melforge::data {
struct MelInfo;
}  // namespace melforge::data

namespace melforge::trainer {

using data::MelInfo;
struct ModelOptions;

/// What one forward pass returns. Classifiers (`cnn`, `crnn`) fill `logits` and `detection`; speaker models
/// (`resnet-se`, `ecapa`, models/speaker.h) fill `logits` with cosine similarities and `embedding`, and leave
/// `detection` undefined.
struct ModelOutput {
  /// Multi-class logits, [B, num_classes]. Speaker models: the cosine similarities between the L2-normalised
  /// embedding and the L2-normalised rows of the AAM head's weight, in [-1, 1], without scale or margin (the loss,
  /// train/aam.h, adds them).
  at::Tensor logits;
  /// Binary detection logits (positive class vs the rest), [B]. Undefined for speaker models.
  at::Tensor detection;
  /// Speaker models only: the embedding, [B, embedding_dim], not normalised. Undefined for classifiers.
  at::Tensor embedding;
};

/// A classifier of spectrograms with a multi-class head and a binary detection head. Parameter and buffer names
/// (named_parameters/named_buffers) are those of the PyTorch module of the same name in python/melforge/models.py
/// (melforge.models), so a state dict moves between the two unchanged.
///
/// Inputs of any number of frames T (at least the model's minimum, min_frames()) with optional `lengths`: row b is
/// its lengths[b] real frames, then padding. Every model pools over the real frames only (models/time_mask.h), so in
/// eval mode a padded row gives the output of the same row alone at its real length, whatever the padding holds.
/// Batch norm in training mode is the exception: its batch statistics are over every position of the batch, padding
/// included (eval mode uses the running statistics, position by position, and is exact).
class Classifier : public torch::nn::Module {
 public:
  /// Registers the input normalisation buffers `input_mean` (0) and `input_std` (1), float32 scalars.
  Classifier();
  /// `x`: [B, n_mels, T] or [B, 1, n_mels, T], float, T >= min_frames() (exactly n_frames for a cnn of
  /// `time_pool` flatten). `lengths`: int64 [B], real frames per row, 1 <= lengths[b] <= T (models/time_mask.h
  /// check_lengths); undefined: every frame is real. Throws InvalidArgument for another shape or bad lengths.
  virtual ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) = 0;
  /// The fewest frames T an input may have (1 for every model today: each pads its time axis inside as it needs).
  virtual int64_t min_frames() const { return 1; }
  /// The only input width the model takes (a cnn of `time_pool` flatten, a checkpoint from before inputs of any
  /// length: its n_frames; such a model takes lengths only when every row is full), or 0 when it takes any
  /// T >= min_frames() and pools over the real frames of `lengths`.
  virtual int64_t fixed_frames() const { return 0; }
  /// The architecture name (`cnn`, `crnn`).
  virtual std::string kind() const = 0;
  /// Everything needed to build the same model again (make_model_from_json): architecture_json() with the input
  /// normalisation's "cmn" (bool) added.
  nlohmann::json config_json() const;
  /// Sets the input normalisation every forward applies first, x' = (x - mean) / std (the training split's
  /// statistics, kept in the state dict so that eval, predict and export apply the same). Throws InvalidArgument
  /// unless std > 0 and both are finite. A model with cmn() on does not apply it.
  void set_input_normalization(double mean, double std);
  /// Switches per-utterance cepstral mean normalisation on or off (off on construction): with it on, every forward
  /// first subtracts from each mel bin of a row its mean over the row's real frames (cepstral_mean_normalize), and
  /// the global mean/std of set_input_normalization is not applied. Recorded as config_json()'s "cmn".
  void set_cmn(bool on) { cmn_ = on; }
  /// Whether per-utterance cepstral mean normalisation is on.
  bool cmn() const { return cmn_; }

 protected:
  /// The architecture: input shape, number of classes and widths, {"model": kind(), ...}.
  virtual nlohmann::json architecture_json() const = 0;
  /// The input normalisation; subclasses call it at the start of forward(). `x`: [B, 1, n_mels, T] or
  /// [B, n_mels, T]; `lengths`: int64 [B] real frames per row (undefined: all real). cmn() on:
  /// cepstral_mean_normalize(x, lengths); off: (x - input_mean) / input_std.
  at::Tensor normalize_input(const at::Tensor& x, const at::Tensor& lengths = {}) const;

 private:
  at::Tensor input_mean_, input_std_;
  bool cmn_ = false;
};

/// Per-utterance cepstral mean normalisation: `x` [B, ..., n_mels, T] (time last) minus, for each row b and mel bin,
/// the mean of that bin over the row's real frames t < lengths[b] (int64 [B]; undefined: every frame), with the
/// padding frames (t >= lengths[b]) set to 0 whatever they held. So a padded row gives the values of the same row
/// alone at its real length (up to the rounding of the sum), and the models' masked pooling stays exact.
at::Tensor cepstral_mean_normalize(const at::Tensor& x, const at::Tensor& lengths);

/// `x` as [B, 1, n_mels, T]: the input of every model's forward, [B, n_mels, T] or [B, 1, n_mels, T] with
/// min_frames <= T <= max_frames. Throws InvalidArgument naming `model` and the accepted shapes for another shape.
at::Tensor spectrogram_input(const at::Tensor& x, int64_t n_mels, int64_t min_frames, int64_t max_frames,
                             const std::string& model);

/// A model's size, known before it is built (doubles: absurd widths overflow int64).
struct ModelSize {
  /// Number of parameters (every weight and bias).
  double parameters = 0;
  /// Floats of the activations one input segment produces in a forward pass (every layer's output, the input
  /// normalisation included): what backward keeps of it, and what its gradients take again.
  double activation_floats = 0;
};

/// Parameters of a 3x3 convolution from `in` to `out` channels with bias.
inline double conv3x3_parameters(double in, double out) { return in * out * 9 + out; }
/// Parameters of a fully connected layer from `in` to `out` features with bias.
inline double linear_parameters(double in, double out) { return in * out + out; }

/// The size of the model make_model(opts, info, num_classes) builds, from the shapes alone (nothing is allocated).
/// Throws InvalidArgument as make_model does (`--model auto` is cnn here, as for every task but verification).
ModelSize model_size(const ModelOptions& opts, const MelInfo& info, int64_t num_classes);

/// Whether `model` (a `--model` name) is a speaker-embedding model (`resnet-se`, `ecapa`): its forward gives
/// ModelOutput::embedding and cosine logits, and it trains with the AAM-softmax loss (train/aam.h).
bool is_speaker_model(const std::string& model);

/// Builds the model `opts` names for spectrograms of `info` (n_mels, n_frames) and `num_classes` classes, after
/// seeding the global generator with opts.seed, with cepstral mean normalisation as opts.cmn says (auto: on for the
/// speaker models). `--model auto` builds a cnn (the default of every task but verification: `train` resolves it
/// for its task first, ModelOptions::resolved). Throws InvalidArgument for an unknown model or bad widths, and
/// for a speaker model with fewer than 2 classes.
std::shared_ptr<Classifier> make_model(const ModelOptions& opts, const MelInfo& info, int64_t num_classes);

/// Builds the architecture a checkpoint recorded (Classifier::config_json), with its "cmn" (absent: off, as every
/// checkpoint from before the field). Throws FormatError when the JSON names an unknown model or lacks a field, when
/// "cmn" is not a boolean, and when it records a task other than multiclass (`"task": "multilabel"`,
/// whose class logits are sigmoid scores, or `"verification"`, whose logits are cosines to training speakers)
/// unless `any_task`: a caller that treats the logits as softmax classes refuses such a checkpoint instead of
/// misreading it.
std::shared_ptr<Classifier> make_model_from_json(const nlohmann::json& config, bool any_task = false);

/// A recorded model configuration's "cmn": false when absent (checkpoints from before the field). Throws
/// FormatError when it is there but not a boolean.
bool model_cmn(const nlohmann::json& config);

/// Largest width, class count or input dimension a model configuration read from a file may hold (2^20).
inline constexpr int64_t kMaxModelWidth = int64_t{1} << 20;

/// The size of the architecture a recorded configuration (Classifier::config_json) describes, from the JSON alone:
/// nothing is allocated. Throws FormatError naming the field when a width, class count or input dimension is not
/// an integer from 1 to kMaxModelWidth, dropout is outside [0, 1), or the model is unknown.
ModelSize model_size_from_json(const nlohmann::json& config);

}  // namespace melforge::trainer

namespace melforge::trainer {

/// The training loss of both heads, averaged over the batch: cross-entropy of `out.logits` against `labels`
/// (int64 [B]) plus `bce_weight` times the binary cross-entropy with logits of `out.detection` against
/// `labels == positive_class` (no BCE term when positive_class is -1: `--positive-class none`); `pos_weight` (a float scalar tensor, or undefined for 1) weights the positive
/// term of the BCE as torch.nn.BCEWithLogitsLoss(pos_weight=...) does. Returns a float scalar tensor.
at::Tensor combined_loss(const ModelOutput& out, const at::Tensor& labels, int64_t positive_class, double bce_weight,
                         const at::Tensor& pos_weight = {});

}  // namespace melforge::trainer
