#pragma once
/// What the flags given on the command line do to a saved configuration: with --resume (the checkpoint's
/// configuration) each is honoured or refused with a message naming it, and with --config RUN/config.json (a run's
/// recorded configuration) each replaces the file's value. A flag is "given" when TrainConfig::given names it
/// (the command line fills it from Boost's variables_map: every flag not left at its default).
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "options.h"
#include "train/config.h"

namespace boost::program_options {
class options_description;
class variables_map;
}  // namespace boost::program_options

namespace melforge::trainer {

/// The flag of `train` that sets the field at JSON pointer `pointer` of TrainConfig::to_json() ("/optim/lr" ->
/// "lr", "/eval/batch_size" -> "eval-batch-size", "/augment/time_masks" -> "spec-time-masks"); "" for a field
/// no flag sets (/eval/split).
std::string flag_of_field(const std::string& pointer);

/// The JSON pointers of every value (leaf) of a TrainConfig::to_json() document, in document order.
std::vector<std::string> config_fields(const nlohmann::json& config);

/// The saved flags that --resume honours (they replace the checkpoint's values): data, stream, h5-cache,
/// prefetch, gpu-mem, eval-batch-size, epochs, patience, channels-last, adamw.
const std::set<std::string>& resume_honoured_flags();

/// The flags of `train` that are not part of the saved configuration and are always taken from the command line:
/// the runtime and dist groups, --profile-steps, --config and --no-device-check; --out, --resume and --overwrite are
/// checked apart.
const std::set<std::string>& unsaved_flags();

/// The canonical names of the flags in `vm` that were given (not left at their defaults), "help" aside.
std::set<std::string> given_flags(const boost::program_options::variables_map& vm);

/// --resume: the checkpoint's configuration `saved` with the honoured flags of cli.given taking the command line's
/// values (cli's runtime, dist, profile_steps, no_device_check, resume and given are kept). A given saved flag that
/// is not honoured is accepted only when its value equals the saved one; otherwise, and for --overwrite or a flag
/// that is neither saved nor in unsaved_flags(), throws InvalidArgument naming the flag, both values and
/// `checkpoint`. --stream auto keeps the saved mode; another mode than the saved one is taken with a warning on `log`.
TrainConfig resume_config(const nlohmann::json& saved, const TrainConfig& cli, const std::string& checkpoint,
                          const Logger& log);

/// --config RUN/config.json: the file's configuration (TrainConfig::from_json) with every given saved flag of `cli`
/// replacing its value, and cli's runtime, dist, out, overwrite, profile_steps, no_device_check, config and given.
/// Throws FormatError naming `source` for a malformed document.
TrainConfig config_from_run_json(const nlohmann::json& file, const TrainConfig& cli, const std::string& source);

/// `train`'s side of the command line, between po::store and po::notify: an INI --config file is stored into `vm`
/// below the flags given (those win; keys spelled as flag_conventions allow), then `config.given` is set to
/// given_flags(vm). A JSON --config (a run's config.json) is left to with_config_file. Throws InvalidArgument for an
/// unreadable file, boost::program_options::error naming the file and key for an unknown key.
void read_train_config_file(boost::program_options::variables_map& vm,
                            const boost::program_options::options_description& desc, TrainConfig& config);

/// `cli` with a JSON --config applied (config_from_run_json); `cli` itself when --config is absent or INI (already
/// read by read_train_config_file). Throws InvalidArgument for --config with --resume, IoError/FormatError naming the
/// file when it cannot be read or parsed.
TrainConfig with_config_file(const TrainConfig& cli);

/// Whether the text of a --config file is JSON (its first non-blank character is '{') rather than INI.
bool is_json_config(const std::string& text);

}  // namespace melforge::trainer
