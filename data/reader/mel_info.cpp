#include "reader/mel_info.h"

#include <cmath>
#include <sstream>
#include <variant>

#include "melforge/common/errors.h"

namespace melforge::data {

namespace {

/// Largest long_samples a schema-1/2 file may declare: 2^40 samples (289 days at 44.1 kHz).
constexpr int64_t kMaxLongSamples = int64_t{1} << 40;

/// One parameter attribute of MelInfo: its name and the member that holds it.
struct Field {
  const char* name;
  std::variant<int64_t MelInfo::*, double MelInfo::*, std::string MelInfo::*> member;
};

/// Every compared parameter attribute, in the order of docs/FORMAT.md.
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"sample_rate", &MelInfo::sample_rate},     {"n_fft", &MelInfo::n_fft},
      {"win_length", &MelInfo::win_length},       {"hop_length", &MelInfo::hop_length},
      {"window", &MelInfo::window},               {"center", &MelInfo::center},
      {"pad_mode", &MelInfo::pad_mode},           {"power", &MelInfo::power},
      {"n_mels", &MelInfo::n_mels},               {"f_min", &MelInfo::f_min},
      {"f_max", &MelInfo::f_max},                 {"mel_scale", &MelInfo::mel_scale},
      {"mel_norm", &MelInfo::mel_norm},           {"log", &MelInfo::log},
      {"amin", &MelInfo::amin},                   {"log_eps", &MelInfo::log_eps},
      {"dtype", &MelInfo::dtype},                 {"long_seconds", &MelInfo::long_seconds},
      {"short_seconds", &MelInfo::short_seconds}, {"long_samples", &MelInfo::long_samples},
      {"short_samples", &MelInfo::short_samples}, {"num_long", &MelInfo::num_long},
      {"num_short", &MelInfo::num_short},         {"n_frames", &MelInfo::n_frames},
      {"short_files", &MelInfo::short_files},     {"channel", &MelInfo::channel},
      {"max_seconds", &MelInfo::max_seconds},
  };
  return f;
}

/// Attributes a file of schema `schema` may lack; they keep their default. channel and max_seconds came after schema
/// 1 was first written; schema 3 has no segment grid.
bool optional_attribute(const std::string& name, int64_t schema) {
  if (name == "channel" || name == "max_seconds") return true;
  return schema >= kClipSchemaVersion && (name == "long_seconds" || name == "long_samples" || name == "num_long" ||
                                          name == "num_short" || name == "short_files");
}

/// Fields a JSON config may lack (written before they existed); they keep their default.
bool optional_json_field(const std::string& name) { return name == "max_seconds"; }

std::string value_text(const MelInfo& info, const Field& field) {
  std::ostringstream out;
  std::visit([&](auto member) { out << info.*member; }, field.member);
  return out.str();
}

template <typename Parse>
auto parse_attribute(const std::string& name, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const InvalidArgument& e) {
    throw FormatError("attribute " + name + " = '" + value + "' is not understood: " + e.what());
  }
}
}  // namespace

MelInfo read_mel_info(const h5::File& file, const std::string& where) {
  const int64_t schema =
      h5::has_attribute(file, "schema_version") ? h5::read_attribute_int64(file, "schema_version") : 1;
  MelInfo info;
  for (const auto& field : fields()) {
    if (!h5::has_attribute(file, field.name)) {
      if (optional_attribute(field.name, schema)) continue;
      throw FormatError(where + ": missing attribute '" + field.name + "' (not a melforge-build dataset?)");
    }
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(info.*member)>;
          if constexpr (std::is_same_v<T, int64_t>) info.*member = h5::read_attribute_int64(file, field.name);
          else if constexpr (std::is_same_v<T, double>) info.*member = h5::read_attribute_double(file, field.name);
          else info.*member = h5::read_attribute_string(file, field.name);
        },
        field.member);
  }
  if (h5::has_attribute(file, "melforge_version"))
    info.melforge_version = h5::read_attribute_string(file, "melforge_version");
  std::vector<std::pair<const char*, int64_t>> positive = {{"sample_rate", info.sample_rate},
                                                           {"n_mels", info.n_mels},
                                                           {"n_frames", info.n_frames},
                                                           {"short_samples", info.short_samples}};
  if (schema < kClipSchemaVersion)
    positive.insert(positive.end(),
                    {{"num_long", info.num_long}, {"num_short", info.num_short}, {"long_samples", info.long_samples}});
  for (const auto& [name, value] : positive) {
    if (value <= 0) throw FormatError(where + ": attribute " + name + " = " + std::to_string(value) + " must be > 0");
  }
  if (schema < kClipSchemaVersion && info.long_samples > kMaxLongSamples)
    throw FormatError(where + ": attribute long_samples = " + std::to_string(info.long_samples) + " is more than " +
                      std::to_string(kMaxLongSamples) + " samples (2^40)");
  if (!std::isfinite(info.max_seconds) || info.max_seconds < 0)
    throw FormatError(where + ": attribute max_seconds = " + std::to_string(info.max_seconds) +
                      " must be >= 0 and finite (0: no cap)");
  try {
    info.mel_args();
    if (schema < kClipSchemaVersion) info.segment_args();
  } catch (const FormatError& e) {
    throw FormatError(where + ": " + e.what());
  }
  return info;
}

mel::MelArgs MelInfo::mel_args() const {
  mel::MelArgs a;
  a.sample_rate = static_cast<int>(sample_rate);
  a.n_fft = static_cast<int>(n_fft);
  a.win_length = static_cast<int>(win_length);
  a.hop_length = static_cast<int>(hop_length);
  a.window = parse_attribute("window", window, mel::parse_window);
  a.center = center != 0;
  a.pad_mode = parse_attribute("pad_mode", pad_mode, mel::parse_pad_mode);
  a.power = static_cast<float>(power);
  a.n_mels = static_cast<int>(n_mels);
  a.f_min = static_cast<float>(f_min);
  a.f_max = static_cast<float>(f_max);
  a.mel_scale = parse_attribute("mel_scale", mel_scale, mel::parse_mel_scale);
  a.mel_norm = parse_attribute("mel_norm", mel_norm, mel::parse_mel_norm);
  a.log = parse_attribute("log", log, mel::parse_log_mode);
  a.amin = static_cast<float>(amin);
  a.log_eps = static_cast<float>(log_eps);
  parse_attribute("dtype", dtype, mel::parse_dtype);
  return a;
}

segment::SegmentArgs MelInfo::segment_args() const {
  segment::SegmentArgs s;
  s.long_seconds = long_seconds;
  s.short_seconds = short_seconds;
  s.num_long = static_cast<int>(num_long);
  s.short_files = parse_attribute("short_files", short_files, segment::parse_short_file_policy);
  return s;
}

featurize::DatasetParams MelInfo::dataset_params() const {
  featurize::DatasetParams p;
  p.mel = mel_args();
  p.segment = segment_args();
  p.dtype = parse_attribute("dtype", dtype, mel::parse_dtype);
  p.channel = static_cast<int>(channel);
  p.num_long = num_long;
  p.num_short = num_short;
  p.n_mels = n_mels;
  p.n_frames = n_frames;
  p.long_samples = long_samples;
  p.short_samples = short_samples;
  return p;
}

nlohmann::json MelInfo::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& field : fields()) std::visit([&](auto member) { j[field.name] = this->*member; }, field.member);
  j["melforge_version"] = melforge_version;
  return j;
}

MelInfo MelInfo::from_json(const nlohmann::json& j) {
  MelInfo info;
  for (const auto& field : fields()) {
    if (j.is_object() && !j.contains(field.name) && optional_json_field(field.name)) continue;
    if (!j.is_object() || !j.contains(field.name))
      throw FormatError(std::string("mel parameters: missing field '") + field.name + "'");
    try {
      std::visit([&](auto member) { j.at(field.name).get_to(info.*member); }, field.member);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(std::string("mel parameters: field '") + field.name + "': " + e.what());
    }
  }
  if (j.contains("melforge_version") && j["melforge_version"].is_string())
    info.melforge_version = j["melforge_version"].get<std::string>();
  return info;
}

std::string MelInfo::first_difference(const MelInfo& other, const std::string& this_name,
                                      const std::string& other_name) const {
  for (const auto& field : fields()) {
    const bool equal = std::visit([&](auto member) { return this->*member == other.*member; }, field.member);
    if (!equal)
      return std::string(field.name) + " is " + value_text(*this, field) + " in " + this_name + " but " +
             value_text(other, field) + " in " + other_name;
  }
  return {};
}
}  // namespace melforge::data
