#pragma once
/// Option groups of melforge-train's subcommands. Each has in-class defaults, validate() and add_options(), so that
/// every subcommand spells a flag the same way.
#include <cstdint>
#include <filesystem>
#include <string>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// Where the dataset is.
struct DataOptions {
  /// A melforge-build output folder holding train.h5, val.h5 and test.h5.
  std::filesystem::path data;

  /// Throws InvalidArgument when `data` is empty.
  void validate() const;
};

/// Registers --data.
void add_options(boost::program_options::options_description& desc, DataOptions& opts);

/// Which model, and its widths.
struct ModelOptions {
  /// Architecture: `cnn` (the default; `crnn` is planned).
  std::string model = "cnn";
  /// Width of the hidden fully connected layer.
  int64_t hidden = 128;
  /// Dropout probability before the heads, in [0, 1).
  double dropout = 0.3;
  /// Seed of the parameter initialisation.
  uint64_t seed = 42;

  /// Throws InvalidArgument for an unknown model or an out-of-range width.
  void validate() const;
};

/// Registers --model --hidden --dropout --seed.
void add_options(boost::program_options::options_description& desc, ModelOptions& opts);

}  // namespace melforge::trainer
