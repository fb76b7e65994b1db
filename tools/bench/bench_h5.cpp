// melforge-bench-h5: the HDF5 write stage alone (issue 4). Reads the `frames` [N, n_mels] and the clip table of one
// melforge split file (schema 3) into memory, then writes the same elements again, each way --repeats times (median
// reported):
//   raw:      one contiguous, uncompressed dataset with a single H5Dwrite (the physical limit of the write);
//   melforge: builder::SplitWriter (shuffle + deflate of whole chunks on --threads threads, H5Dwrite_chunk), the
//             builder's own writer, at --compression-level with the file's chunk layout (frames per chunk), the same
//             clips (frames, num_samples, clip_flags, label).
// tools/bench/py_builder.py h5write times h5py's single-threaded gzip of the same array with the same chunks.
#include <hdf5.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/timing.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using melforge::Stopwatch;

namespace {

/// Command-line settings.
struct Options {
  /// Split file to read (e.g. OUT/train.h5).
  std::string input;
  /// Folder for the files written (removed afterwards).
  std::string scratch = "/tmp";
  /// Deflate level of the melforge writer.
  int level = 4;
  /// Compression threads of the melforge writer.
  int threads = 1;
  /// Timed runs per way.
  int repeats = 3;
  /// JSON results file, empty: none.
  std::string out;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void check(herr_t status, const std::string& what) {
  if (status < 0) throw melforge::IoError("HDF5: " + what + " failed");
}
hid_t checked(hid_t id, const std::string& what) {
  if (id < 0) throw melforge::IoError("HDF5: " + what + " failed");
  return id;
}

/// The `frames` dataset of a schema-3 split file and its clip table, in memory.
struct MelData {
  /// [N, n_mels].
  std::vector<hsize_t> dims;
  /// Chunk dimensions of the file's `frames`.
  std::vector<hsize_t> chunk;
  /// Element bytes (2 for float16).
  std::size_t elem = 0;
  /// Raw elements.
  std::vector<unsigned char> bytes;
  /// label per clip, [F].
  std::vector<int32_t> label;
  /// frame_offset [F + 1], num_samples [F].
  std::vector<int64_t> frame_offset, num_samples;
  /// clip_flags per clip, [F].
  std::vector<uint8_t> clip_flags;
};

template <class T>
std::vector<T> read_column(hid_t file, const char* name, hid_t mem_type) {
  const hid_t d = checked(H5Dopen2(file, name, H5P_DEFAULT), std::string("open ") + name);
  const hid_t space = H5Dget_space(d);
  hsize_t n = 0;
  if (H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, &n, nullptr) < 0)
    throw melforge::FormatError(std::string("`") + name + "` is not one-dimensional");
  std::vector<T> v(n);
  check(H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), std::string("read ") + name);
  H5Sclose(space);
  H5Dclose(d);
  return v;
}

MelData read_mel(const std::string& path) {
  MelData m;
  const hid_t file = checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + path);
  if (H5Lexists(file, "frames", H5P_DEFAULT) <= 0)
    throw melforge::FormatError(path + ": no `frames` dataset (melforge-bench-h5 reads schema 3 files)");
  const hid_t d = checked(H5Dopen2(file, "frames", H5P_DEFAULT), "open frames");
  const hid_t space = H5Dget_space(d);
  if (H5Sget_simple_extent_ndims(space) != 2) throw melforge::FormatError(path + ": `frames` is not [N, n_mels]");
  m.dims.resize(2);
  H5Sget_simple_extent_dims(space, m.dims.data(), nullptr);
  const hid_t dcpl = H5Dget_create_plist(d);
  m.chunk.resize(2);
  if (H5Pget_chunk(dcpl, 2, m.chunk.data()) < 0) m.chunk = m.dims;
  const hid_t type = H5Dget_type(d);
  m.elem = H5Tget_size(type);
  m.bytes.resize(m.dims[0] * m.dims[1] * m.elem);
  check(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.bytes.data()), "read frames");
  H5Tclose(type);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Dclose(d);
  m.label = read_column<int32_t>(file, "label", H5T_NATIVE_INT32);
  m.frame_offset = read_column<int64_t>(file, "frame_offset", H5T_NATIVE_INT64);
  m.num_samples = read_column<int64_t>(file, "num_samples", H5T_NATIVE_INT64);
  m.clip_flags = read_column<uint8_t>(file, "clip_flags", H5T_NATIVE_UINT8);
  H5Fclose(file);
  const std::size_t clips = m.label.size();
  if (m.frame_offset.size() != clips + 1 || m.num_samples.size() != clips || m.clip_flags.size() != clips ||
      m.frame_offset.back() != static_cast<int64_t>(m.dims[0]))
    throw melforge::FormatError(path + ": the clip table does not match `frames`");
  return m;
}

double write_raw(const MelData& m, const fs::path& path) {
  Stopwatch w;
  const hid_t file = checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create");
  const hid_t space = H5Screate_simple(static_cast<int>(m.dims.size()), m.dims.data(), nullptr);
  const hid_t d = checked(H5Dcreate2(file, "frames", m.elem == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT, space,
                                     H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                          "create frames");
  check(H5Dwrite(d, m.elem == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                 m.bytes.data()),
        "write frames");
  H5Dclose(d);
  H5Sclose(space);
  check(H5Fclose(file), "close");
  return w.seconds();
}

double write_melforge(const MelData& m, const fs::path& path, int level, int threads, int64_t& compressed) {
  namespace b = melforge::builder;
  Stopwatch w;
  b::SplitWriterConfig c;
  c.final_path = path;
  c.split = "train";
  c.n_mels = static_cast<int64_t>(m.dims[1]);
  c.dtype = m.elem == 2 ? melforge::mel::DType::float16 : melforge::mel::DType::float32;
  c.compression_level = level;
  c.shuffle = true;
  c.frames_per_chunk = static_cast<int64_t>(m.chunk[0]);
  c.threads = threads;
  const int32_t classes = m.label.empty() ? 1 : 1 + *std::max_element(m.label.begin(), m.label.end());
  for (int32_t i = 0; i < classes; ++i) c.class_names.push_back("c" + std::to_string(i));
  b::SplitWriter writer(c);
  std::vector<b::FileRecord> records(m.label.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    records[i].label = m.label[i];
    records[i].path = "f" + std::to_string(i);
    records[i].frames = m.frame_offset[i + 1] - m.frame_offset[i];
    records[i].num_samples = m.num_samples[i];
    records[i].clip_flags = m.clip_flags[i];
  }
  writer.append(m.bytes.data(), records);
  writer.finish();
  compressed = writer.bytes_written();
  return w.seconds();
}

int run(const Options& o) {
  const MelData m = read_mel(o.input);
  const fs::path dir = fs::path(o.scratch) / ("melforge-bench-h5-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<double> raw_s, mf_s;
  int64_t compressed = 0;
  for (int r = 0; r <= o.repeats; ++r) {
    const double a = write_raw(m, dir / "raw.h5");
    const double b = write_melforge(m, dir / "melforge.h5", o.level, o.threads, compressed);
    if (r > 0) {
      raw_s.push_back(a);
      mf_s.push_back(b);
    }
  }
  fs::remove_all(dir);
  const double mb = static_cast<double>(m.bytes.size()) / 1e6;
  const double rs = median(raw_s), ms = median(mf_s);
  nlohmann::json j = {{"input", o.input},
                      {"files", m.label.size()},
                      {"frames", m.dims[0]},
                      {"uncompressed_bytes", m.bytes.size()},
                      {"compressed_bytes", compressed},
                      {"chunk_frames", m.chunk[0]},
                      {"level", o.level},
                      {"threads", o.threads},
                      {"raw", {{"seconds", raw_s}, {"median_s", rs}, {"mb_per_s", mb / rs}}},
                      {"melforge", {{"seconds", mf_s}, {"median_s", ms}, {"mb_per_s", mb / ms}}}};
  std::printf("HDF5 write of %.1f MB (%zu clips): raw uncompressed %.4f s (%.0f MB/s); melforge SplitWriter level %d, "
              "%d thread(s): %.4f s (%.0f MB/s, %.2f:1)\n",
              mb, m.label.size(), rs, mb / rs, o.level, o.threads, ms, mb / ms,
              compressed > 0 ? static_cast<double>(m.bytes.size()) / static_cast<double>(compressed) : 0.0);
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << j.dump(2) << "\n";
    if (!f) throw melforge::IoError("cannot write " + o.out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  po::options_description desc("melforge-bench-h5: HDF5 write alone (raw vs melforge's parallel-compressed writer)");
  desc.add_options()("help,h", "show this help and exit")("input", po::value(&o.input)->required(),
                                                           "split file (schema 3) whose frames are written again")(
      "scratch", po::value(&o.scratch)->default_value(o.scratch), "folder for the written files")(
      "compression-level", po::value(&o.level)->default_value(o.level), "deflate level of the melforge writer")(
      "threads", po::value(&o.threads)->default_value(o.threads), "compression threads (0: all cores)")(
      "repeats", po::value(&o.repeats)->default_value(o.repeats), "timed runs (median reported)")(
      "out", po::value(&o.out), "write JSON results here");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (o.repeats < 1) throw melforge::InvalidArgument("--repeats must be >= 1");
    return run(o);
  } catch (const melforge::InvalidArgument& e) {
    std::cerr << "melforge-bench-h5: " << e.what() << "\n";
    return 2;
  } catch (const po::error& e) {
    std::cerr << "melforge-bench-h5: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "melforge-bench-h5: " << e.what() << "\n";
    return 1;
  }
}
