#include "options.h"

#include <boost/program_options.hpp>

#include "melforge/common/errors.h"

namespace po = boost::program_options;

namespace melforge::trainer {

void DataOptions::validate() const {
  if (data.empty()) throw InvalidArgument("--data is required: a melforge-build output folder");
}

void add_options(po::options_description& desc, DataOptions& opts) {
  desc.add_options()("data", po::value<std::filesystem::path>(&opts.data)->value_name("DIR"),
                     "melforge-build output folder with train.h5, val.h5 and test.h5");
}

void ModelOptions::validate() const {
  if (model != "cnn") throw InvalidArgument("--model: unknown model '" + model + "' (available: cnn)");
  if (hidden < 1) throw InvalidArgument("--hidden must be >= 1, got " + std::to_string(hidden));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw InvalidArgument("--dropout must be in [0, 1), got " + std::to_string(dropout));
}

void add_options(po::options_description& desc, ModelOptions& opts) {
  desc.add_options()("model", po::value(&opts.model)->default_value(opts.model)->value_name("NAME"),
                     "architecture: cnn (three conv layers, two max-pools, class and detection heads)")(
      "hidden", po::value(&opts.hidden)->default_value(opts.hidden)->value_name("N"), "hidden layer width")(
      "dropout", po::value(&opts.dropout)->default_value(opts.dropout)->value_name("P"),
      "dropout before the heads, in [0, 1)")(
      "seed", po::value(&opts.seed)->default_value(opts.seed)->value_name("N"), "seed of the initialisation");
}

}  // namespace melforge::trainer
