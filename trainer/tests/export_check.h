#pragma once
// Runs tools/check_export.py on an export: Python's torch and python/melforge/models.py reproduce the C++ outputs.
#include <ATen/core/Dict.h>
#include "melforge_test_paths.h"
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "train/checkpoint.h"
#include "venv_python.h"

namespace melforge::test {

/// Saves `input` (the model's input batch; with `lengths` defined, a dict of "x" and "lengths", which the Python
/// model then takes as its second argument) as `<weights folder>/input.pt` and `expected` (output name -> tensor, the
/// names of the Python model's `output_names`) as `expected.pt` beside it, both as torch.save does, then runs
/// `python tools/check_export.py export WEIGHTS input.pt expected.pt 1e-5`. Appends its output to `output` and
/// returns its exit code (0: every output within 1e-5).
inline int check_export_in_python(const std::string& python, const std::filesystem::path& weights,
                                  const at::Tensor& input,
                                  const std::vector<std::pair<std::string, at::Tensor>>& expected,
                                  std::string& output, const at::Tensor& lengths = {}) {
  const auto write = [](const std::filesystem::path& p, const c10::IValue& v) {
    const std::vector<char> bytes = trainer::torch_save_bytes(v);
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  const std::filesystem::path dir = weights.parent_path();
  if (lengths.defined()) {
    c10::impl::GenericDict in(c10::StringType::get(), c10::TensorType::get());
    in.insert("x", input.contiguous());
    in.insert("lengths", lengths.contiguous());
    write(dir / "input.pt", c10::IValue(in));
  } else {
    write(dir / "input.pt", c10::IValue(input));
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : expected) dict.insert(name, tensor.contiguous());
  write(dir / "expected.pt", c10::IValue(dict));
  return run_command("'" + python + "' '" + std::string(MELFORGE_SOURCE_DIR) + "/tools/check_export.py' export '" +
                         weights.string() + "' '" + (dir / "input.pt").string() + "' '" +
                         (dir / "expected.pt").string() + "' 1e-5",
                     output);
}

}  // namespace melforge::test
