#include "train/init_weights.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <fstream>
#include <map>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "util.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << '[';
  for (int64_t i = 0; i < t.dim(); ++i) out << (i ? ", " : "") << t.size(i);
  out << ']';
  return out.str();
}

bool skipped(const std::string& name, const std::vector<std::string>& skip) {
  for (const auto& prefix : skip)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

std::map<std::string, at::Tensor> module_tensors(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters(true)) out[item.key()] = item.value();
  for (const auto& item : module.named_buffers(true)) out[item.key()] = item.value();
  return out;
}

/// The `export` JSON beside a state dict, read into `w` when present.
void read_export_json(const fs::path& path, InitWeights& w) {
  const fs::path json_path = path.string() + ".json";
  if (!fs::exists(json_path)) return;
  const std::string text = read_regular_file(json_path, "the export JSON beside --init-from");
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.contains("model_config")) w.model_config = j["model_config"];
    if (j.contains("class_names")) w.class_names = j["class_names"].get<std::vector<std::string>>();
    if (j.contains("positive_class")) w.positive_class = j["positive_class"].get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("'" + json_path.string() + "' (the export JSON beside --init-from) is malformed: " + e.what());
  }
}

bool is_checkpoint(const c10::IValue& root) {
  if (!root.isGenericDict()) return false;
  for (const auto& item : root.toGenericDict())
    if (item.key().isString() && item.key().toStringRef() == "format") return true;
  return false;
}

}  // namespace

InitWeights load_init_weights(const fs::path& path) {
  c10::IValue root;
  try {
    root = read_torch_archive(path);
  } catch (const FormatError& e) {
    throw FormatError("--init-from: " + std::string(e.what()) +
                      " (a state dict saved from Python must be a plain dict: torch.save(dict(model.state_dict()), "
                      "path); an OrderedDict is not read)");
  }
  InitWeights w;
  if (is_checkpoint(root)) {
    Checkpoint c = load_checkpoint(path);
    w.kind = "checkpoint";
    w.model = std::move(c.model);
    w.model_config = std::move(c.model_config);
    w.class_names = std::move(c.class_names);
    w.positive_class = std::move(c.positive_class);
    return w;
  }
  const std::string what = "--init-from '" + path.string() + "'";
  if (!root.isGenericDict())
    throw FormatError(what + " is neither a melforge checkpoint nor a state dict (it holds a " + root.tagKind() +
                      ", not a dict of tensors)");
  for (const auto& item : root.toGenericDict()) {
    if (!item.key().isString()) throw FormatError(what + ": a key of the state dict is a " + item.key().tagKind());
    const std::string name = item.key().toStringRef();
    if (!item.value().isTensor())
      throw FormatError(what + ": entry '" + name + "' is a " + item.value().tagKind() + ", not a tensor");
    w.model[name] = item.value().toTensor().detach().to(at::kCPU);
  }
  w.kind = "state dict";
  read_export_json(path, w);
  return w;
}

const std::vector<std::string>& head_prefixes() {
  static const std::vector<std::string> kHeads = {"class_head.", "detect_head.", "aam."};
  return kHeads;
}

std::string StateDictMismatch::describe() const {
  std::string out;
  const auto part = [&out](const char* label, const std::vector<std::string>& names) {
    if (names.empty()) return;
    out += (out.empty() ? "" : "; ") + std::string(label) + ": " + join(names);
  };
  part("missing from the file", missing);
  part("unexpected (not in the model)", unexpected);
  part("shape mismatch", shapes);
  return out;
}

StateDictMismatch compare_state_dict(const torch::nn::Module& module, const TensorMap& state,
                                     const std::vector<std::string>& skip) {
  StateDictMismatch m;
  const auto targets = module_tensors(module);
  for (const auto& [name, target] : targets) {
    if (skipped(name, skip)) continue;
    const auto it = state.find(name);
    if (it == state.end() || !it->second.defined()) {
      m.missing.push_back(name);
    } else if (it->second.sizes() != target.sizes()) {
      m.shapes.push_back(name + ": " + shape_of(it->second) + " in the file, " + shape_of(target) + " in the model");
    }
  }
  for (const auto& [name, t] : state)
    if (!skipped(name, skip) && !targets.count(name)) m.unexpected.push_back(name);
  return m;
}

std::size_t load_matching(torch::nn::Module& module, const TensorMap& state, const std::vector<std::string>& skip,
                          const std::string& what) {
  const StateDictMismatch m = compare_state_dict(module, state, skip);
  if (!m.empty()) throw FormatError(what + ": the tensors do not match the model's: " + m.describe());
  c10::NoGradGuard no_grad;
  std::size_t copied = 0;
  for (auto& [name, target] : module_tensors(module)) {
    if (skipped(name, skip)) continue;
    target.copy_(state.at(name));
    ++copied;
  }
  return copied;
}

std::string model_config_difference(const nlohmann::json& source, const nlohmann::json& mine) {
  if (!source.is_object() || !mine.is_object()) return {};
  std::string out;
  for (const auto& item : source.items()) {
    const std::string& key = item.key();
    if (key == "dropout" || key == "num_classes") continue;
    const nlohmann::json theirs = mine.contains(key) ? mine[key] : nlohmann::json();
    if (item.value() == theirs) continue;
    out += (out.empty() ? "" : ", ") + key + " " + item.value().dump() + " (this run: " + theirs.dump() + ")";
  }
  return out;
}

}  // namespace melforge::trainer
