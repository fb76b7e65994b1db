#include "train/overrides.h"

#include <boost/program_options.hpp>
#include <map>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "train/monitor.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

void collect_fields(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
  if (!j.is_object()) {
    out.push_back(prefix);
    return;
  }
  for (const auto& item : j.items()) collect_fields(item.value(), prefix + "/" + item.key(), out);
}

/// `j` read by TrainConfig::from_json and written back (every field present, defaults filled in).
nlohmann::json normalised(const nlohmann::json& j) { return TrainConfig::from_json(j).to_json(); }

/// The configuration `merged` (a TrainConfig::to_json() document) with what it does not record taken from `cli`:
/// the runtime and dist groups, the given flags, --out, --resume, --overwrite, --profile-steps, --config and
/// --no-device-check.
TrainConfig with_unsaved(const nlohmann::json& merged, const TrainConfig& cli) {
  TrainConfig out = TrainConfig::from_json(merged);
  out.runtime = cli.runtime;
  out.dist = cli.dist;
  out.monitor = cli.monitor;
  out.given = cli.given;
  out.train.out = cli.train.out;
  out.train.resume = cli.train.resume;
  out.train.overwrite = cli.train.overwrite;
  out.train.profile_steps = cli.train.profile_steps;
  out.train.no_device_check = cli.train.no_device_check;
  out.train.allow_dataset_change = cli.train.allow_dataset_change;
  out.train.config = cli.train.config;
  return out;
}

std::string shown(const nlohmann::json& v) { return v.is_null() ? "nothing" : v.dump(); }

/// Applies the given flag of field `ptr` (value `value`) to the saved configuration `merged` (--resume rules).
void resume_field(nlohmann::json& merged, const nlohmann::json::json_pointer& p, const std::string& flag,
                  const nlohmann::json& value, const std::string& checkpoint, const Logger& log) {
  const nlohmann::json theirs = merged.contains(p) ? merged.at(p) : nlohmann::json();
  if (flag == "stream" && value == "auto") return;
  if (resume_honoured_flags().count(flag)) {
    if (flag == "stream" && value != theirs)
      log.warn("--stream " + value.get<std::string>() + " replaces the run's " + shown(theirs) +
               ": the shuffle order changes from here on, so the result will differ from an uninterrupted run");
    merged[p] = value;
    return;
  }
  if (value != theirs && (flag == "init-from" || flag == "reset-heads"))
    throw InvalidArgument("--" + flag + " starts a new run from trained weights; it cannot be combined with --resume "
                          "(give --out NEW instead of --resume)");
  if (value != theirs)
    throw InvalidArgument("--" + flag + " cannot be changed when resuming: " + checkpoint + " was trained with " +
                          shown(theirs) + ", the command line gives " + shown(value) +
                          " (drop the flag to continue the run, or start a new run from its weights with --init-from)");
}

}  // namespace

std::string flag_of_field(const std::string& pointer) {
  static const std::map<std::string, std::string> kSpecial = {
      {"/data", "data"},          {"/stream/stream", "stream"},           {"/stream/h5_cache", "h5-cache"},
      {"/model/model", "model"},  {"/optim/adamw_impl", "adamw"},         {"/eval/batch_size", "eval-batch-size"},
      {"/eval/split", ""},        {"/augment/mixup", "mixup"},            {"/view/resolved", ""}};
  if (const auto it = kSpecial.find(pointer); it != kSpecial.end()) return it->second;
  const std::size_t second = pointer.find('/', 1);
  const std::string group = pointer.substr(1, second == std::string::npos ? std::string::npos : second - 1);
  std::string name = pointer.substr(pointer.rfind('/') + 1);
  for (char& ch : name)
    if (ch == '_') ch = '-';
  return group == "augment" ? "spec-" + name : name;
}

std::vector<std::string> config_fields(const nlohmann::json& config) {
  std::vector<std::string> out;
  collect_fields(config, "", out);
  return out;
}

const std::set<std::string>& resume_honoured_flags() {
  static const std::set<std::string> kHonoured = {"data",     "stream",  "h5-cache", "prefetch",      "gpu-mem",
                                                  "eval-batch-size", "epochs", "patience", "channels-last", "adamw"};
  return kHonoured;
}

const std::set<std::string>& unsaved_flags() {
  static const std::set<std::string> kUnsaved = [] {
    po::options_description desc;
    RuntimeOptions runtime;
    DistOptions dist;
    MonitorOptions monitor;
    add_options(desc, runtime);
    add_options(desc, dist);
    add_options(desc, monitor);
    std::set<std::string> names = {"profile-steps", "config", "no-device-check", "allow-dataset-change"};
    for (const auto& o : desc.options()) names.insert(o->long_name());
    return names;
  }();
  return kUnsaved;
}

std::set<std::string> given_flags(const po::variables_map& vm) {
  std::set<std::string> out;
  for (const auto& [name, value] : vm)
    if (!value.defaulted() && name != "help") out.insert(name);
  return out;
}

TrainConfig resume_config(const nlohmann::json& saved, const TrainConfig& cli, const std::string& checkpoint,
                          const Logger& log) {
  nlohmann::json merged = normalised(saved);
  const nlohmann::json mine = cli.to_json();
  std::set<std::string> handled = {"resume", "out"};
  for (const auto& ptr : config_fields(mine)) {
    const std::string flag = flag_of_field(ptr);
    if (flag.empty() || !cli.given.count(flag)) continue;
    handled.insert(flag);
    const nlohmann::json::json_pointer p(ptr);
    resume_field(merged, p, flag, mine.at(p), checkpoint, log);
  }
  for (const auto& flag : cli.given) {
    if (handled.count(flag) || unsaved_flags().count(flag)) continue;
    throw InvalidArgument("--" + flag + " cannot be combined with --resume" +
                          (flag == "overwrite" ? ": a resumed run continues in its own folder"
                                               : ": it is not part of what a resumed run may change"));
  }
  return with_unsaved(merged, cli);
}

TrainConfig config_from_run_json(const nlohmann::json& file, const TrainConfig& cli, const std::string& source) {
  if (!file.is_object() || !file.contains("model") || !file.contains("train"))
    throw FormatError(source + " is JSON but not a run's config.json (no \"model\" and \"train\" groups)");
  nlohmann::json merged;
  try {
    merged = normalised(file);
  } catch (const FormatError& e) {
    throw FormatError(source + ": " + e.what());
  }
  const nlohmann::json mine = cli.to_json();
  for (const auto& ptr : config_fields(mine)) {
    const std::string flag = flag_of_field(ptr);
    const nlohmann::json::json_pointer p(ptr);
    if (!flag.empty() && cli.given.count(flag)) merged[p] = mine.at(p);
  }
  return with_unsaved(merged, cli);
}

bool is_json_config(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{';
}

void read_train_config_file(po::variables_map& vm, const po::options_description& desc, TrainConfig& config) {
  if (vm.count("config")) {
    const std::string path = vm["config"].as<std::filesystem::path>().string();
    const std::string text = read_config_text(path);
    if (!is_json_config(text)) {
      std::istringstream canonical(canonical_config(text, desc, "--config file '" + path + "'"));
      po::store(po::parse_config_file(canonical, desc), vm);
    }
  }
  config.given = given_flags(vm);
}

TrainConfig with_config_file(const TrainConfig& cli) {
  if (cli.train.config.empty()) return cli;
  const std::string path = cli.train.config.string();
  const std::string text = read_config_text(path);
  if (!is_json_config(text)) return cli;
  if (!cli.train.resume.empty())
    throw InvalidArgument("--config " + path + " (a run's config.json) cannot be combined with --resume: a resumed "
                          "run keeps the configuration of its checkpoint");
  nlohmann::json file;
  try {
    file = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("--config file '" + path + "' is not valid JSON: " + e.what());
  }
  return config_from_run_json(file, cli, "--config file '" + path + "'");
}

}  // namespace melforge::trainer
