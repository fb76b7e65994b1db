#pragma once
/// Checkpoints: everything needed to resume a run exactly or to use its model, in one file written atomically.
/// The file is a torch pickle archive (torch::pickle_save of a dict), so Python's torch.load reads it too.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}
namespace c10 {
struct IValue;
}

namespace melforge::trainer {

/// Tensors by name (a state dict), on the CPU.
using TensorMap = std::map<std::string, at::Tensor>;

/// The contents of a checkpoint file.
struct Checkpoint {
  /// Checkpoint format version (kCheckpointVersion when written by this build).
  int64_t version = 0;
  /// The model architecture (Classifier::config_json()).
  nlohmann::json model_config;
  /// The full run configuration: every option group of `train` as JSON.
  nlohmann::json config;
  /// The dataset's parameters (MelInfo::to_json()): what predict featurizes with.
  nlohmann::json mel;
  /// Class names, indexed by label.
  std::vector<std::string> class_names;
  /// Name and index of the detection head's positive class.
  std::string positive_class;
  int64_t positive_index = 0;
  /// Completed epochs.
  int64_t epoch = 0;
  /// Optimizer steps taken.
  int64_t step = 0;
  /// Model parameters and buffers by their module names.
  TensorMap model;
  /// AdamW::state_dict().
  TensorMap optimizer;
  /// GradScaler::state_dict().
  TensorMap scaler;
  /// CosineSchedule::to_json().
  nlohmann::json scheduler;
  /// The CPU generator's state (at::Generator::get_state(), uint8).
  at::Tensor rng_state;
  /// The training CUDA device's default generator state (uint8); undefined for a run on the CPU.
  at::Tensor cuda_rng_state;
  /// The trainer's own bookkeeping (best metric and epoch, epochs without improvement, sampler state, ...).
  nlohmann::json state;
};

/// The format version this build writes; it reads every version from 1 up to it. Version 2 stores model_config
/// as a dict (torch.load gives a Python dict); version 1 stored it as a JSON string.
inline constexpr int64_t kCheckpointVersion = 2;

/// Largest checkpoint file read_torch_archive reads (64 GiB): the file is read whole into memory.
inline constexpr std::uintmax_t kMaxCheckpointBytes = std::uintmax_t{64} << 30;

/// Writes `c` to `path` through `<path>.tmp` + fsync + rename: `path` is either the previous complete file or the
/// new complete file, never a partial one. Throws IoError naming the path on any write error (the temporary file
/// is removed).
void save_checkpoint(const Checkpoint& c, const std::filesystem::path& path);

/// Reads a checkpoint. Throws IoError when the file cannot be read, FormatError when it is not a melforge
/// checkpoint, is truncated or corrupt, or has another version.
Checkpoint load_checkpoint(const std::filesystem::path& path);

/// The value pickled in a torch.save archive (a checkpoint, or any file torch.save wrote), after checking the zip
/// entries' CRCs; only a regular file is read (a FIFO or device is refused before reading). Every tensor inside is
/// checked on its metadata before any value is read: a dense CPU tensor of a real dtype, contiguous (no stride 0,
/// negative or overlapping strides), its shape and storage offset within the bytes its storage declares, and those
/// within the bytes the file stores for it. Throws IoError when the file cannot be read (naming the checkpoints of
/// a run folder given instead), InvalidArgument when it is not a regular file, FormatError (naming the file and the
/// entry) when it is not a readable torch archive or a tensor fails a check.
c10::IValue read_torch_archive(const std::filesystem::path& path);

/// `value` serialized as torch.save does (a zip archive with data.pkl and one record per tensor storage), without
/// TorchScript's type tags (torch::pickle_save adds them), so that Python's torch.load with its default
/// weights_only=True reads dicts, lists, strings, ints and tensors back; torch::jit::pickle_load reads it too.
std::vector<char> torch_save_bytes(const c10::IValue& value);

/// Writes `bytes` to `path` through `<path>.tmp`, fsync and rename (then fsyncs the folder): `path` holds either its
/// previous contents or all of `bytes`. Throws IoError naming the path when any step fails; the temporary file is
/// removed.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

/// The module's parameters and buffers by name, detached CPU copies.
TensorMap state_dict(const torch::nn::Module& module);

/// Copies `state` into the module's parameters and buffers. Throws FormatError naming `what` (e.g. the checkpoint
/// path) and the first missing, unexpected or differently shaped entry.
void load_state_dict(torch::nn::Module& module, const TensorMap& state, const std::string& what);

}  // namespace melforge::trainer
