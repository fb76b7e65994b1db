#include "export/export.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <boost/program_options.hpp>

#include <nlohmann/json.hpp>

#include "melforge/common/errors.h"
#include "models/model.h"
#include "train/checkpoint.h"

namespace po = boost::program_options;

namespace melforge::trainer {

void ExportOptions::validate() const {
  if (checkpoint.empty()) throw InvalidArgument("--checkpoint is required");
  if (out.empty()) throw InvalidArgument("--out is required");
}

void add_options(po::options_description& desc, ExportOptions& opts) {
  desc.add_options()
    ("checkpoint", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.checkpoint = s; }),
     "checkpoint to export")
    ("out", po::value<std::string>()->notifier([&opts](const std::string& s) { opts.out = s; }),
     "state-dict file to write (e.g. weights.pt); <out>.json receives the model configuration");
}

void run_export(const ExportOptions& opts, std::ostream& out) {
  opts.validate();
  const Checkpoint ck = load_checkpoint(opts.checkpoint);
  const std::shared_ptr<Classifier> model = make_model_from_json(ck.model_config);
  load_state_dict(*model, ck.model, "checkpoint '" + opts.checkpoint.string() + "'");
  const TensorMap state = state_dict(*model);

  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  int64_t numel = 0;
  for (const auto& [name, t] : state) {
    dict.insert(name, t.contiguous());
    numel += t.numel();
  }
  const std::vector<char> bytes = torch_save_bytes(c10::IValue(dict));
  const nlohmann::json meta = {{"model_config", ck.model_config},
                               {"class_names", ck.class_names},
                               {"positive_class", ck.positive_class},
                               {"positive_index", ck.positive_index},
                               {"mel", ck.mel},
                               {"epoch", ck.epoch},
                               {"checkpoint", opts.checkpoint.string()}};
  const std::filesystem::path json_path = opts.out.string() + ".json";
  write_file_atomically(opts.out, std::string_view(bytes.data(), bytes.size()));
  write_file_atomically(json_path, meta.dump(2) + "\n");
  out << "wrote " << opts.out.string() << " (" << state.size() << " tensors, " << numel << " values, model "
      << model->kind() << ", epoch " << ck.epoch << ")\n"
      << "wrote " << json_path.string() << '\n';
}

}  // namespace melforge::trainer
