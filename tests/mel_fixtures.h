#pragma once
/// Loader for the torchaudio fixtures in tests/data/mel (made by tools/gen_mel_fixtures.py): manifest.json plus raw
/// little-endian float32 files.
#include <bit>
#include "melforge_test_paths.h"
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mel/mel_args.h"

namespace melforge::test {

/// Folder of the mel fixtures.
inline std::filesystem::path mel_fixture_dir() { return std::filesystem::path(MELFORGE_TEST_DATA_DIR) / "mel"; }

/// The parsed manifest.json.
inline nlohmann::json load_mel_manifest() {
  std::ifstream in(mel_fixture_dir() / "manifest.json");
  if (!in) throw std::runtime_error("cannot open " + (mel_fixture_dir() / "manifest.json").string());
  return nlohmann::json::parse(in);
}

/// All float32 values of fixture file `name`; throws unless it holds exactly `expected` values (when >= 0).
inline std::vector<float> load_f32(const std::string& name, int64_t expected = -1) {
  const auto path = mel_fixture_dir() / name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() % 4 != 0 || (expected >= 0 && static_cast<int64_t>(bytes.size() / 4) != expected)) {
    throw std::runtime_error(path.string() + " has " + std::to_string(bytes.size()) + " bytes, expected " +
                             std::to_string(expected) + " floats");
  }
  std::vector<float> values(bytes.size() / 4);
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint32_t u = 0;
    for (int b = 3; b >= 0; --b) u = (u << 8) | static_cast<unsigned char>(bytes[4 * i + b]);
    values[i] = std::bit_cast<float>(u);
  }
  return values;
}

/// MelArgs from a manifest "params" object (keys are the MelArgs field names).
inline mel::MelArgs mel_args_from_json(const nlohmann::json& p) {
  mel::MelArgs a;
  a.sample_rate = p.at("sample_rate").get<int>();
  a.n_fft = p.at("n_fft").get<int>();
  a.win_length = p.at("win_length").get<int>();
  a.hop_length = p.at("hop_length").get<int>();
  a.window = mel::parse_window(p.at("window").get<std::string>());
  a.center = p.at("center").get<bool>();
  a.pad_mode = mel::parse_pad_mode(p.at("pad_mode").get<std::string>());
  a.power = p.at("power").get<float>();
  a.n_mels = p.at("n_mels").get<int>();
  a.f_min = p.at("f_min").get<float>();
  a.f_max = p.at("f_max").get<float>();
  a.mel_scale = mel::parse_mel_scale(p.at("mel_scale").get<std::string>());
  a.mel_norm = mel::parse_mel_norm(p.at("mel_norm").get<std::string>());
  a.log = mel::parse_log_mode(p.at("log").get<std::string>());
  a.amin = p.at("amin").get<float>();
  a.log_eps = p.at("log_eps").get<float>();
  return a;
}

}  // namespace melforge::test
