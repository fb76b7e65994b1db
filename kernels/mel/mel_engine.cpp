#include "mel/mel_engine.h"

#include <istream>
#include <ostream>

#include "melforge/common/errors.h"
#include "mel/mel_math.h"

namespace melforge::mel {

std::string to_string(Device d) {
  switch (d) {
    case Device::auto_select: return "auto";
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "?";
}

Device parse_device(const std::string& s) {
  if (s == "auto") return Device::auto_select;
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  throw InvalidArgument("invalid device '" + s + "' (accepted: auto, cpu, cuda)");
}

std::istream& operator>>(std::istream& in, Device& d) {
  std::string token;
  if (in >> token) d = parse_device(token);
  return in;
}

std::ostream& operator<<(std::ostream& out, Device d) { return out << to_string(d); }

MelLayout make_layout(const EngineConfig& config) {
  MelLayout layout;
  layout.n_frames = config.mel.n_frames(config.segment_samples);
  if (config.segment_samples <= 0 || layout.n_frames < 1) {
    throw InvalidArgument("a segment of " + std::to_string(config.segment_samples) + " samples gives no frame (" +
                          config.mel.to_string() + ")");
  }
  layout.n_mels = config.mel.n_mels;
  layout.n_freqs = config.mel.n_freqs();
  layout.segment_samples = config.segment_samples;
  layout.out_elem_bytes = config.dtype == DType::float16 ? 2 : 4;
  return layout;
}

float silence_value(const MelArgs& args) {
  return log_compress(0.0f, static_cast<int>(args.log), args.power, args.amin, args.log_eps);
}

std::unique_ptr<MelEngine> make_engine(Device device, const EngineConfig& config) {
  switch (device) {
    case Device::cpu: return make_cpu_engine(config);
    case Device::cuda: return make_cuda_engine(config);
    case Device::auto_select: break;
  }
  return cuda_available() ? make_cuda_engine(config) : make_cpu_engine(config);
}

}  // namespace melforge::mel
