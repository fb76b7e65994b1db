#include "reader/mel_info.h"

#include <climits>
#include <cmath>
#include <sstream>
#include <utility>
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

/// One fbank parameter: torchaudio's name (the attribute's) and the member of FbankArgs that holds it.
struct FbankField {
  const char* name;
  std::variant<int fbank::FbankArgs::*, double fbank::FbankArgs::*, bool fbank::FbankArgs::*,
               fbank::KaldiWindow fbank::FbankArgs::*, uint64_t fbank::FbankArgs::*>
      member;
};

/// Every fbank parameter, in the order of docs/FORMAT.md.
const std::vector<FbankField>& fbank_fields() {
  using F = fbank::FbankArgs;
  static const std::vector<FbankField> f = {
      {"num_mel_bins", &F::num_mel_bins},
      {"frame_length", &F::frame_length},
      {"frame_shift", &F::frame_shift},
      {"window_type", &F::window_type},
      {"blackman_coeff", &F::blackman_coeff},
      {"preemphasis_coefficient", &F::preemphasis_coefficient},
      {"remove_dc_offset", &F::remove_dc_offset},
      {"dither", &F::dither},
      {"dither_seed", &F::dither_seed},
      {"round_to_power_of_two", &F::round_to_power_of_two},
      {"snip_edges", &F::snip_edges},
      {"low_freq", &F::low_freq},
      {"high_freq", &F::high_freq},
      {"use_energy", &F::use_energy},
      {"raw_energy", &F::raw_energy},
      {"energy_floor", &F::energy_floor},
      {"htk_compat", &F::htk_compat},
      {"use_log_fbank", &F::use_log_fbank},
      {"use_power", &F::use_power},
      {"vtln_warp", &F::vtln_warp},
      {"subtract_mean", &F::subtract_mean},
  };
  return f;
}

[[noreturn]] void refuse_value(const std::string& name, const h5::AttributeValue& value, const std::string& why) {
  throw FormatError("attribute " + name + " = " + h5::to_string(value) + " " + why);
}

/// Stores `value` (the attribute or JSON field `field.name`) in `f`, bounded: integers within int range (dither_seed
/// >= 0), booleans 0 or 1, reals finite, window_type a Kaldi window. Throws FormatError naming the attribute.
void set_fbank_field(fbank::FbankArgs& f, const FbankField& field, const h5::AttributeValue& value) {
  const std::string name = field.name;
  const auto refuse = [&](const std::string& why) { refuse_value(name, value, why); };
  const auto integer = [&]() -> int64_t {
    if (const auto* v = std::get_if<int64_t>(&value)) return *v;
    refuse_value(name, value, "must be an integer");
  };
  std::visit(
      [&](auto member) {
        using T = std::remove_cvref_t<decltype(f.*member)>;
        if constexpr (std::is_same_v<T, int>) {
          const int64_t v = integer();
          if (v < INT_MIN || v > INT_MAX) refuse("is out of range");
          f.*member = static_cast<int>(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          const int64_t v = integer();
          if (v != 0 && v != 1) refuse("must be 0 or 1");
          f.*member = v == 1;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          const int64_t v = integer();
          if (v < 0) refuse("must be >= 0");
          f.*member = static_cast<uint64_t>(v);
        } else if constexpr (std::is_same_v<T, double>) {
          const auto* d = std::get_if<double>(&value);
          const auto* i = std::get_if<int64_t>(&value);
          if (d == nullptr && i == nullptr) refuse_value(name, value, "must be a number");
          const double v = d != nullptr ? *d : static_cast<double>(*i);
          if (!std::isfinite(v)) refuse("must be finite");
          f.*member = v;
        } else {
          const auto* s = std::get_if<std::string>(&value);
          if (s == nullptr) refuse_value(name, value, "must be a string");
          try {
            f.*member = fbank::parse_kaldi_window(*s);
          } catch (const InvalidArgument& e) {
            refuse(std::string("is not understood: ") + e.what());
          }
        }
      },
      field.member);
}

/// The attribute value of a JSON field: integers and booleans as int64, other numbers as double, strings.
h5::AttributeValue json_attribute(const nlohmann::json& j, const std::string& name) {
  if (j.is_boolean()) return int64_t{j.get<bool>() ? 1 : 0};
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  throw FormatError("mel parameters: field '" + name + "' is " + j.dump() + ", not a number or a string");
}

nlohmann::json attribute_json(const h5::AttributeValue& v) {
  return std::visit([](const auto& x) { return nlohmann::json(x); }, v);
}

template <typename Parse>
auto parse_attribute(const std::string& name, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const InvalidArgument& e) {
    throw FormatError("attribute " + name + " = '" + value + "' is not understood: " + e.what());
  }
}
/// The attribute `name` of `file` read with the reader of `field`'s type (int64, double or string).
h5::AttributeValue read_fbank_attribute(const h5::File& file, const FbankField& field) {
  return std::visit(
      [&](auto member) -> h5::AttributeValue {
        using T = std::remove_reference_t<decltype(std::declval<fbank::FbankArgs&>().*member)>;
        if constexpr (std::is_same_v<T, double>) return h5::read_attribute_double(file, field.name);
        else if constexpr (std::is_same_v<T, fbank::KaldiWindow>) return h5::read_attribute_string(file, field.name);
        else return h5::read_attribute_int64(file, field.name);
      },
      field.member);
}

/// Reads the `features` attribute and, for "fbank", every fbank attribute into `info`, bounded (set_fbank_field).
/// Throws FormatError naming `where`.
void read_front_end(const h5::File& file, const std::string& where, MelInfo& info) {
  try {
    if (h5::has_attribute(file, "features"))
      info.features =
          mel::to_string(parse_attribute("features", h5::read_attribute_string(file, "features"), mel::parse_features));
    if (!info.is_fbank()) return;
    for (const auto& field : fbank_fields()) {
      if (!h5::has_attribute(file, field.name))
        throw FormatError(std::string("missing attribute '") + field.name + "' (required with features = fbank)");
      set_fbank_field(info.fbank, field, read_fbank_attribute(file, field));
    }
  } catch (const FormatError& e) {
    throw FormatError(where + ": " + e.what());
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
  read_front_end(file, where, info);
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
  if (parse_attribute("features", features, mel::parse_features) == mel::Features::fbank) use_fbank_checked(a);
  return a;
}

void MelInfo::use_fbank_checked(mel::MelArgs& a) const {
  try {
    a.use_fbank(fbank);
  } catch (const InvalidArgument& e) {
    throw FormatError(std::string("the fbank attributes are refused: ") + e.what());
  }
  const std::pair<const char*, std::pair<int64_t, int64_t>> derived[] = {
      {"n_fft", {n_fft, a.n_fft}},
      {"win_length", {win_length, a.win_length}},
      {"hop_length", {hop_length, a.hop_length}},
      {"n_mels", {n_mels, a.n_mels}}};
  for (const auto& [name, values] : derived)
    if (values.first != values.second)
      throw FormatError(std::string("attribute ") + name + " = " + std::to_string(values.first) +
                        " but the fbank attributes give " + std::to_string(values.second));
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
  j["features"] = features;
  if (is_fbank())
    for (const auto& [name, value] : fbank_attributes(fbank)) j[name] = attribute_json(value);
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
  if (!j.contains("features")) return info;
  if (!j["features"].is_string()) throw FormatError("mel parameters: field 'features' must be a string");
  try {
    info.features = mel::to_string(parse_attribute("features", j["features"].get<std::string>(), mel::parse_features));
    if (!info.is_fbank()) return info;
    for (const auto& field : fbank_fields()) {
      if (!j.contains(field.name))
        throw FormatError(std::string("missing field '") + field.name + "' (required with features = fbank)");
      set_fbank_field(info.fbank, field, json_attribute(j[field.name], field.name));
    }
  } catch (const FormatError& e) {
    throw FormatError(std::string("mel parameters: ") + e.what());
  }
  return info;
}

std::string MelInfo::first_difference(const MelInfo& other, const std::string& this_name,
                                      const std::string& other_name) const {
  if (features != other.features)
    return "features is " + features + " in " + this_name + " but " + other.features + " in " + other_name;
  for (const auto& field : fields()) {
    const bool equal = std::visit([&](auto member) { return this->*member == other.*member; }, field.member);
    if (!equal)
      return std::string(field.name) + " is " + value_text(*this, field) + " in " + this_name + " but " +
             value_text(other, field) + " in " + other_name;
  }
  if (!is_fbank()) return {};
  const auto mine = fbank_attributes(fbank);
  const auto theirs = fbank_attributes(other.fbank);
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i].second != theirs[i].second)
      return mine[i].first + " is " + h5::to_string(mine[i].second) + " in " + this_name + " but " +
             h5::to_string(theirs[i].second) + " in " + other_name;
  return {};
}

std::vector<std::pair<std::string, h5::AttributeValue>> fbank_attributes(const fbank::FbankArgs& f) {
  std::vector<std::pair<std::string, h5::AttributeValue>> out;
  for (const auto& field : fbank_fields()) {
    h5::AttributeValue value = std::visit(
        [&](auto member) -> h5::AttributeValue {
          using T = std::remove_cvref_t<decltype(f.*member)>;
          if constexpr (std::is_same_v<T, double>) return f.*member;
          else if constexpr (std::is_same_v<T, fbank::KaldiWindow>) return fbank::to_string(f.*member);
          else if constexpr (std::is_same_v<T, bool>) return int64_t{f.*member ? 1 : 0};
          else return static_cast<int64_t>(f.*member);
        },
        field.member);
    out.emplace_back(field.name, std::move(value));
  }
  return out;
}
}  // namespace melforge::data
