#pragma once
/// `train --init-from`: the trained weights a new run starts from (a melforge checkpoint, or a state dict written by
/// `export` or by Python's torch.save of a dict of tensors), and the strict matching of their names and shapes
/// against the run's model.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/checkpoint.h"

namespace torch::nn {
class Module;
}

namespace melforge::trainer {

/// Weights to start a run from.
struct InitWeights {
  /// The tensors by name (CPU).
  TensorMap model;
  /// "checkpoint" or "state dict".
  std::string kind;
  /// The model configuration (Classifier::config_json()): a checkpoint's, or that of the `export` JSON beside a
  /// state dict (`<file>.json`); null when neither is there.
  nlohmann::json model_config;
  /// Class names and the detection head's class, when known (the same sources); empty otherwise.
  std::vector<std::string> class_names;
  std::string positive_class;
};

/// Reads `path`: a melforge checkpoint (load_checkpoint), else a torch.save'd dict of name -> tensor, with
/// `<path>.json` (export's) read when present. Throws IoError when it cannot be read, FormatError naming the file
/// when it is neither a checkpoint nor a dict of tensors.
InitWeights load_init_weights(const std::filesystem::path& path);

/// The prefixes of the heads' tensors: classification and detection ("class_head.", "detect_head.") and the speaker
/// models' AAM head ("aam.").
const std::vector<std::string>& head_prefixes();

/// How a state dict differs from a module's parameters and buffers, names under a skipped prefix aside.
struct StateDictMismatch {
  /// Names the module has and the state dict lacks.
  std::vector<std::string> missing;
  /// Names the state dict has and the module lacks.
  std::vector<std::string> unexpected;
  /// "name: [a, b] in the file, [c, d] in the model" for each name of both with another shape.
  std::vector<std::string> shapes;

  /// Whether nothing differs.
  bool empty() const { return missing.empty() && unexpected.empty() && shapes.empty(); }
  /// "missing: a, b; unexpected: c; shape mismatch: d: [..] in the file, [..] in the model".
  std::string describe() const;
};

/// Compares `state` with `module`'s parameters and buffers, ignoring names that start with one of `skip`.
StateDictMismatch compare_state_dict(const torch::nn::Module& module, const TensorMap& state,
                                     const std::vector<std::string>& skip);

/// Copies the entries of `state` into `module`, except names starting with one of `skip`. Throws FormatError
/// naming `what` and listing every missing, unexpected and differently shaped tensor (describe()) when
/// compare_state_dict finds any. Returns the number of tensors copied.
std::size_t load_matching(torch::nn::Module& module, const TensorMap& state, const std::vector<std::string>& skip,
                          const std::string& what);

/// The differences between the architecture `source` (a model_config of InitWeights) and `mine` (the run's model's
/// config_json()), "hidden 24 (this run: 128)", ignoring num_classes (the class set is checked on its own) and
/// dropout; empty when they match or `source` is null.
std::string model_config_difference(const nlohmann::json& source, const nlohmann::json& mine);

}  // namespace melforge::trainer
