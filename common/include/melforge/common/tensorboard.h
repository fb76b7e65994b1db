#pragma once
/// TensorBoard event files written natively (no TensorFlow, no protobuf library, no LibTorch): the TFRecord framing,
/// the few tensorflow.Event messages a training run needs (scalars, PNG images, the file version, a session start),
/// encoded by hand, and a writer of `events.out.tfevents.*` files that TensorBoard (`tensorboard --logdir DIR`) and
/// its Python reader (EventAccumulator) read.
///
/// Record framing (TensorFlow's record_writer): uint64 length, uint32 masked CRC32C of those 8 bytes, the data,
/// uint32 masked CRC32C of the data, all little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
/// Messages (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto): Event{wall_time = 1 (double),
/// step = 2 (int64), file_version = 3 (string), summary = 5, session_log = 7}; Summary{repeated Value value = 1};
/// Value{tag = 1, simple_value = 2 (float), image = 4}; Image{height = 1, width = 2, colorspace = 3,
/// encoded_image_string = 4}; SessionLog{status = 1 (START = 1)}.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace melforge::tensorboard {

/// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `data`, continuing from `crc` (0 to start):
/// crc32c("123456789") = 0xe3069283.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

/// TFRecord's masked CRC-32C of `data`: ((c >> 15) | (c << 17)) + 0xa282ead8 with c = crc32c(data).
uint32_t masked_crc32c(std::string_view data);

/// `data` framed as one TFRecord: 8-byte length, its masked CRC, the data, the data's masked CRC (16 + size bytes).
std::string tfrecord(std::string_view data);

/// The serialized Event that opens every event file: wall_time, step 0, file_version "brain.Event:2".
std::string file_version_event(double wall_time);

/// A serialized Event holding one scalar: Summary{Value{tag, simple_value}} at `step`.
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

/// A serialized Event holding one image: Summary{Value{tag, Image{height, width, colorspace, encoded_image_string =
/// `png`}}} at `step`; `colorspace` is 3 for RGB (1 grey, 4 RGBA).
std::string image_event(double wall_time, int64_t step, std::string_view tag, int64_t height, int64_t width,
                        int64_t colorspace, std::string_view png);

/// A serialized Event holding SessionLog{status START} at `step`: TensorBoard's reader drops the events of the same
/// run at steps >= `step` read before it (a resumed run's repeated steps replace the interrupted ones).
std::string session_start_event(double wall_time, int64_t step);

/// Seconds since the Unix epoch, as the events' wall_time.
double wall_time_now();

/// Appends events to a new event file `DIR/events.out.tfevents.<10-digit seconds>.<host>.<pid>` in a folder.
/// The name sorts after every event file already in the folder (TensorBoard reads a run's files in name order):
/// when one has the same or a later second, the new name takes that second + 1. Records go through a stdio buffer
/// and reach the file at flush(): on add_* once `flush_seconds` have passed since the last flush, and at close;
/// a killed process leaves every flushed record readable (a partial record can only be the last one, which the
/// readers skip). Not thread-safe.
class EventWriter {
 public:
  /// Creates the folder when absent and the file (exclusively), and writes the file_version event. Throws IoError
  /// naming the path when it cannot.
  explicit EventWriter(const std::filesystem::path& dir, double flush_seconds = 30.0);
  /// Flushes and closes; errors are ignored here (call close() to see them).
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  /// Appends a scalar at `step` (wall time now).
  void add_scalar(std::string_view tag, int64_t step, double value);
  /// Appends a PNG image (`height` x `width` pixels, colorspace 3 = RGB) at `step`.
  void add_image(std::string_view tag, int64_t step, std::string_view png, int64_t height, int64_t width,
                 int64_t colorspace = 3);
  /// Appends a session start at `step` (see session_start_event).
  void add_session_start(int64_t step);
  /// Hands the buffered records to the operating system (fflush). Throws IoError when it cannot.
  void flush();
  /// Flushes and closes the file; later calls do nothing. Throws IoError when it cannot.
  void close();
  /// The event file.
  const std::filesystem::path& path() const { return path_; }

 private:
  /// Frames and appends one serialized Event, flushing when flush_seconds_ have passed.
  void write(const std::string& event);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  double flush_seconds_ = 30.0;
  double last_flush_ = 0;
};

}  // namespace melforge::tensorboard
