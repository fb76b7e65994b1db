#pragma once
/// `melforge-train export`: writes a checkpoint's model weights as a state dict that Python's torch.load reads
/// (torch.load(path) returns a dict of name -> tensor, loadable with load_state_dict into the matching module of
/// python/melforge/models.py, melforge.models), with the model configuration, class names and mel parameters beside
/// it as JSON, and what the class outputs mean: "task", "scores" (softmax, sigmoid for --task multilabel, cosine for
/// verification) and, for multilabel, "aggregate" and the val-tuned "threshold" (null when the checkpoint has none);
/// "view": the run's view options (the tile and tile hop melforge.predict reads an export's files with).
/// With --onnx, also an ONNX model of the export, written by Python (`python -m melforge.onnx_export`).
#include <filesystem>
#include <ostream>
#include <string>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// `export` settings.
struct ExportOptions {
  /// The checkpoint to read.
  std::filesystem::path checkpoint;
  /// The state-dict file to write (conventionally weights.pt); `<out>.json` receives the configuration.
  std::filesystem::path out;
  /// The ONNX file to write as well (empty: none): inputs x float32 [B, n_mels, T] and lengths int64 [B] (B and T
  /// dynamic), output the L2-normalised embedding [B, E] of a verification model, else the class scores [B, C].
  std::filesystem::path onnx;
  /// The Python interpreter that writes the ONNX file (a name looked up on PATH, or a path); it must import torch,
  /// onnx, onnxscript and melforge.
  std::string python = "python3";

  /// Throws InvalidArgument naming the missing flag.
  void validate() const;
};

/// Registers --checkpoint --out --onnx --python.
void add_options(boost::program_options::options_description& desc, ExportOptions& opts);

/// Writes the state dict and the JSON beside it (names not valid UTF-8 escaped as utf8::escape does), both or
/// neither: each goes to a temporary name first, and they are renamed into place (the JSON first) only when both
/// are complete; on failure the temporaries are removed and a previous export is left as it was. Says what it wrote
/// on `out`. Throws IoError naming the file (a folder in the way, a full disk, ...). With `onnx`: before any work,
/// InvalidArgument naming what `python` cannot import (or that it cannot run); after the export, `python -m
/// melforge.onnx_export <out> <onnx>.partial` writes the model, renamed to `onnx` once complete (Error with the
/// Python's message when it fails; the partial file is removed, a previous `onnx` is left as it was).
void run_export(const ExportOptions& opts, std::ostream& out);

}  // namespace melforge::trainer
