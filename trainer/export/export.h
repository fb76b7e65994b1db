#pragma once
/// `melforge-train export`: writes a checkpoint's model weights as a state dict that Python's torch.load reads
/// (torch.load(path) returns a dict of name -> tensor, loadable with load_state_dict into the matching module of
/// tools/melforge_models.py), with the model configuration, class names and mel parameters beside it as JSON.
#include <filesystem>
#include <ostream>

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

  /// Throws InvalidArgument naming the missing flag.
  void validate() const;
};

/// Registers --checkpoint --out.
void add_options(boost::program_options::options_description& desc, ExportOptions& opts);

/// Writes the state dict (atomically) and the JSON beside it, and says what it wrote on `out`.
void run_export(const ExportOptions& opts, std::ostream& out);

}  // namespace melforge::trainer
