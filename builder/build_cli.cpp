#include "build_cli.h"

#include <boost/program_options.hpp>
#include <ostream>
#include <sstream>

#include "audio/decode.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"

namespace po = boost::program_options;

namespace melforge::builder {

void add_build_groups(po::options_description& all, BuildConfig& config, std::string& config_file) {
  po::options_description general("General");
  general.add_options()("help,h", "show this help and exit")(
      "config", po::value<std::string>(&config_file),
      "read options from an INI-style FILE (`n-fft = 512`); command-line flags override it");
  po::options_description build("Input, output and running");
  add_options(build, config.build);
  add_options(build, config.engine_check);
  audio::add_options(build, config.decode);
  po::options_description mel("Mel spectrogram (torchaudio.transforms.MelSpectrogram semantics)");
  mel::add_options(mel, config.mel);
  po::options_description front_end("Front-end: --features fbank is Kaldi's filterbank "
                                    "(torchaudio.compliance.kaldi.fbank semantics and defaults)");
  add_front_end_options(front_end, config.mel);
  po::options_description seg("Clips (each stored whole)");
  add_options(seg, config.clips);
  po::options_description aug("Waveform augmentation (augmented copies of the files of --augment-splits)");
  augment::add_options(aug, config.augment);
  all.add(general).add(build).add(mel).add(front_end).add(seg).add(aug);
}

bool parse_build_args(const std::vector<std::string>& args, const po::options_description& all, std::ostream& help,
                      BuildConfig* config) {
  po::variables_map vm;
  po::store(parse_flags(args, all), vm);
  if (vm.count("help")) {
    help << all << "\n";
    return false;
  }
  if (vm.count("config")) {
    const std::string path = vm["config"].as<std::string>();
    std::istringstream text(canonical_config(read_config_text(path), all, "--config file '" + path + "'"));
    po::store(po::parse_config_file(text, all), vm);
  }
  po::notify(vm);
  if (config != nullptr) {
    config->build.split_given = vm.count("split") != 0 && !vm["split"].defaulted();
    std::vector<std::string> given;
    for (const auto& [name, value] : vm)
      if (!value.defaulted()) given.push_back(name);
    apply_front_end(config->mel, given);
  }
  return true;
}

}  // namespace melforge::builder
