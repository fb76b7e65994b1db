// libFuzzer target: the torch-free reader of split files, data::read_split_info and data::ClipReader (the one reader
// of frames that the trainer, the Python package and predict share), fed melforge split files of schema 3 (frames
// [N, M], frame_offset, num_samples, clip_flags) and of schema 1/2 (mel [F, L, S, M, T], num_valid_long) that are
// well-formed HDF5 but whose attributes, types, shapes, values and strings are mutated. Structure-aware: the fuzz
// bytes pick the schema and the clip count, then decode (FuzzedDataProvider) into up to 32 edits of a valid split
// file (8 kHz, 8 mels, float16), which is written with the HDF5 C API into a scratch folder, read with
// read_split_info, and read through a ClipReader (chunk cache of 1 byte or 1 MiB): every clip whole when the frames
// take at most 64 MiB, one frame per clip otherwise, and one read past a clip's end. Byte-level corruption of the
// HDF5 structures themselves is not generated (crashes inside libhdf5 are out of scope).
// Findings: crashes, sanitizer reports, exceptions other than melforge::Error, a split that reads although it breaks
// what split_info.h promises (labels within the classes, the clip table: frame_offset from 0, strictly increasing,
// ending at the frames' row count, [F + 1]; num_samples >= 1; clip_flags known bits; schema 1/2: num_valid_long in
// [1, num_long] and clip f of num_valid_long * num_short * n_frames frames), a ClipReader whose sizes differ from
// the SplitInfo's, a read past a clip's end that is not InvalidArgument, a read of one frame that differs from the
// same frame read with its clip, and an HDF5 identifier left open once the reader is gone (a handle leaked on an
// error path). Hostile storage (issue 29, edit 8): external raw storage in a file or a FIFO, virtual datasets whose
// source is themselves, outside the folder or missing, 1 GiB and 64 KiB + 1 fixed-length strings, 2 GiB chunks; each
// must be refused (melforge::Error) without hanging on the FIFO or allocating what the file declares.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "reader/clip_reader.h"
#include "reader/split_info.h"

namespace fs = std::filesystem;
using melforge::fuzz::require;

namespace {

enum class AType { i64, i32, u64, i8, f64, f32, vstr, fstr, array2, null_space, kCount };
struct Attr {
  AType type = AType::i64;
  int64_t i = 0;
  double d = 0;
  std::string s;
};

enum class DType { f16, f32, f64, i32, i64, u8, i8, vstr, fstr, group, kCount };
/// Hostile storage of a dataset (issue 29): external raw storage (a file, a FIFO), a virtual dataset whose source is
/// itself, outside the folder (relative, absolute) or missing, fixed-length strings of 1 GiB (unwritten) or of 64 KiB
/// + 1 (written), a chunk of 2 GiB (unwritten).
enum class Storage {
  plain,
  external_file,
  external_fifo,
  virtual_self,
  virtual_outside,
  virtual_absolute,
  virtual_missing,
  huge_fixed_string,
  long_fixed_string,
  huge_chunk,
  kCount
};
struct Data {
  DType type = DType::i32;
  Storage storage = Storage::plain;
  std::vector<uint64_t> dims;
  bool chunked = false;
  bool deflate = false;
  bool write = true;
  std::vector<int64_t> ints;
  std::vector<std::string> strs;
  double value = 0;
};

struct FileSpec {
  std::map<std::string, Attr> attrs;
  std::map<std::string, Data> data;
};

const std::vector<std::string> kAttrNames = {
    "schema_version", "split",         "melforge_version", "sample_rate",  "n_fft",        "win_length",
    "hop_length",     "window",        "center",           "pad_mode",     "power",        "n_mels",
    "f_min",          "f_max",         "mel_scale",        "mel_norm",     "log",          "amin",
    "log_eps",        "dtype",         "long_seconds",     "short_seconds", "long_samples", "short_samples",
    "num_long",       "num_short",     "n_frames",         "short_files",  "channel",      "max_seconds"};
const std::vector<std::string> kDataNames = {"frames",     "frame_offset", "num_samples", "clip_flags", "mel",
                                             "num_valid_long", "label",     "path",        "class_names", "targets"};
/// Frames of the base spec's clips (schema 3): a short clip, a long one, a one-frame (padded) clip, another.
const std::vector<int64_t> kClipFrames = {3, 17, 1, 40};
const std::vector<int64_t> kInts = {0,
                                    1,
                                    -1,
                                    2,
                                    3,
                                    4,
                                    8,
                                    16,
                                    128,
                                    256,
                                    2000,
                                    8000,
                                    std::numeric_limits<int32_t>::max(),
                                    std::numeric_limits<int32_t>::min(),
                                    int64_t{1} << 31,
                                    int64_t{1} << 40,
                                    std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min()};
const std::vector<double> kDoubles = {0.0,  -0.0, 1.0,   0.25,  2.0,     1e-10,    4000.0,   -1.0,
                                      NAN,  INFINITY, -INFINITY, 1e300, 5e-324, 1e10, 0.5, 8000.0};
const std::vector<std::string> kStrings = {"hann", "hamming", "reflect", "constant", "htk",  "slaney",
                                           "none", "db",      "ln",      "float16",  "float32", "pad",
                                           "skip", "train",   "val",     "test",     "",     "x"};
const std::vector<uint64_t> kDims = {0, 1, 2, 3, 4, 8, 16, uint64_t{1} << 20, uint64_t{1} << 31, uint64_t{1} << 62,
                                     uint64_t{1} << 63};

template <class T>
T pick(FuzzedDataProvider& fdp, const std::vector<T>& v) {
  return v[fdp.ConsumeIntegralInRange<size_t>(0, v.size() - 1)];
}

int64_t any_int(FuzzedDataProvider& fdp) {
  return fdp.ConsumeBool() ? pick(fdp, kInts) : fdp.ConsumeIntegral<int64_t>();
}

std::string any_string(FuzzedDataProvider& fdp) {
  return fdp.ConsumeBool() ? pick(fdp, kStrings) : fdp.ConsumeRandomLengthString(16);
}

Attr random_attr(FuzzedDataProvider& fdp) {
  Attr a;
  a.type = static_cast<AType>(fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(AType::kCount) - 1));
  a.i = any_int(fdp);
  a.d = fdp.ConsumeBool() ? pick(fdp, kDoubles) : fdp.ConsumeFloatingPoint<double>();
  a.s = any_string(fdp);
  return a;
}

Attr int_attr(int64_t v) { return {AType::i64, v, 0, ""}; }
Attr dbl_attr(double v) { return {AType::f64, 0, v, ""}; }
Attr str_attr(std::string v) { return {AType::vstr, 0, 0, std::move(v)}; }

/// Sets the clip count of `f` to `files` with a consistent clip table (kClipFrames' first `files` clips).
void set_files(FileSpec& f, uint64_t files, bool clips) {
  for (const char* name : {"label", "path", "num_samples", "clip_flags", "num_valid_long"})
    if (f.data.count(name)) f.data[name].dims = {files};
  if (f.data.count("targets") && f.data["targets"].dims.size() == 2) f.data["targets"].dims[0] = files;
  if (!clips) {
    f.data["mel"].dims[0] = files;
    return;
  }
  Data& offset = f.data["frame_offset"];
  offset.dims = {files + 1};
  offset.ints = {0};
  Data& samples = f.data["num_samples"];
  samples.ints.clear();
  for (uint64_t i = 0; i < files; ++i) {
    offset.ints.push_back(offset.ints.back() + kClipFrames[i]);
    samples.ints.push_back(kClipFrames[i] == 1 ? 100 : (kClipFrames[i] - 1) * 128);
  }
  f.data["frames"].dims = {static_cast<uint64_t>(offset.ints.back()), 8};
}

Data int_data(DType type, std::vector<int64_t> ints) {
  Data d;
  d.type = type;
  d.ints = std::move(ints);
  return d;
}

/// A valid split file of `schema` (1, 2: mel [F, 2, 4, 8, 16], num_valid_long; 3: frames [N, 8] of kClipFrames'
/// clips) with `files` clips (at most 4) of `classes` classes (at most 3); schema 2 and 3 with one-hot targets.
FileSpec base_spec(int64_t schema, uint64_t files, int classes) {
  FileSpec f;
  f.attrs = {{"schema_version", int_attr(schema)}, {"split", str_attr("train")}, {"melforge_version", str_attr("0.1.0")},
             {"sample_rate", int_attr(8000)},  {"n_fft", int_attr(256)},         {"win_length", int_attr(256)},
             {"hop_length", int_attr(128)},    {"window", str_attr("hann")},     {"center", int_attr(1)},
             {"pad_mode", str_attr("reflect")}, {"power", dbl_attr(2.0)},        {"n_mels", int_attr(8)},
             {"f_min", dbl_attr(0.0)},         {"f_max", dbl_attr(4000.0)},      {"mel_scale", str_attr("htk")},
             {"mel_norm", str_attr("none")},   {"log", str_attr("db")},          {"amin", dbl_attr(1e-10)},
             {"log_eps", dbl_attr(1e-6)},      {"dtype", str_attr("float16")},   {"short_seconds", dbl_attr(0.25)},
             {"short_samples", int_attr(2000)}, {"n_frames", int_attr(16)},      {"channel", int_attr(-1)}};
  Data spectra;
  spectra.type = DType::f16;
  spectra.chunked = true;
  spectra.value = -20.0;
  if (schema >= 3) {
    f.attrs["max_seconds"] = dbl_attr(0.0);
    spectra.dims = {0, 8};
    f.data["frames"] = spectra;
    f.data["frame_offset"] = int_data(DType::i64, {0});
    f.data["num_samples"] = int_data(DType::i64, {});
    f.data["clip_flags"] = int_data(DType::u8, {0, 0, 1, 0});
  } else {
    f.attrs.insert({{"long_seconds", dbl_attr(1.0)}, {"long_samples", int_attr(8000)}, {"num_long", int_attr(2)},
                    {"num_short", int_attr(4)}, {"short_files", str_attr("pad")}});
    spectra.dims = {files, 2, 4, 8, 16};
    f.data["mel"] = spectra;
    f.data["num_valid_long"] = int_data(DType::i32, {1, 2, 2, 1});
  }
  Data label = int_data(DType::i32, {});
  for (int64_t i = 0; i < 4; ++i) label.ints.push_back(i % classes);
  f.data["label"] = label;
  if (schema >= 2) {
    Data targets = int_data(DType::u8, {});
    for (int64_t i = 0; i < 4 * classes; ++i) targets.ints.push_back(i % classes == (i / classes) % classes ? 1 : 0);
    targets.dims = {files, static_cast<uint64_t>(classes)};
    f.data["targets"] = targets;
  }
  Data path;
  path.type = DType::vstr;
  path.strs = {"a/0.wav", "b/1.wav", "c/2.wav", "d/3.wav"};
  f.data["path"] = path;
  Data names;
  names.type = DType::vstr;
  names.dims = {static_cast<uint64_t>(classes)};
  names.strs = {"leak", "noise", "other"};
  f.data["class_names"] = names;
  set_files(f, files, schema >= 3);
  return f;
}

/// Applies one edit decoded from `fdp` to `f`.
void edit(FuzzedDataProvider& fdp, FileSpec& f) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 8)) {
    case 0:
      f.attrs[fdp.ConsumeBool() ? pick(fdp, kAttrNames) : fdp.ConsumeRandomLengthString(8)] = random_attr(fdp);
      break;
    case 1:
      f.attrs.erase(pick(fdp, kAttrNames));
      break;
    case 2: {
      Attr& a = f.attrs[pick(fdp, kAttrNames)];
      if (a.type == AType::i64) a.i = pick(fdp, kInts);
      else if (a.type == AType::f64) a.d = pick(fdp, kDoubles);
      else a.s = any_string(fdp);
      break;
    }
    case 3: {
      Data& d = f.data[pick(fdp, kDataNames)];
      const size_t rank = fdp.ConsumeIntegralInRange<size_t>(0, 6);
      if (fdp.ConsumeBool() && !d.dims.empty()) {
        d.dims[fdp.ConsumeIntegralInRange<size_t>(0, d.dims.size() - 1)] = pick(fdp, kDims);
      } else {
        d.dims.resize(rank);
        for (auto& x : d.dims) x = fdp.ConsumeBool() ? pick(fdp, kDims) : fdp.ConsumeIntegralInRange<uint64_t>(0, 20);
      }
      break;
    }
    case 4: {
      Data& d = f.data[pick(fdp, kDataNames)];
      d.type = static_cast<DType>(fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(DType::kCount) - 1));
      d.chunked = fdp.ConsumeBool();
      d.deflate = d.chunked && fdp.ConsumeBool();
      d.write = fdp.ConsumeBool();
      break;
    }
    case 5: {
      Data& d = f.data[pick(fdp, kDataNames)];
      const size_t at = fdp.ConsumeIntegralInRange<size_t>(0, 7);
      if (fdp.ConsumeBool()) {
        if (d.ints.size() <= at) d.ints.resize(at + 1, 1);
        d.ints[at] = any_int(fdp);
      } else {
        if (d.strs.size() <= at) d.strs.resize(at + 1, "s");
        d.strs[at] = any_string(fdp);
      }
      d.value = fdp.ConsumeBool() ? pick(fdp, kDoubles) : fdp.ConsumeFloatingPoint<double>();
      break;
    }
    case 6:
      if (fdp.ConsumeBool()) f.data.erase(pick(fdp, kDataNames));
      else f.data[pick(fdp, kDataNames)].type = DType::group;
      break;
    case 7: {
      const bool clips = f.data.count("frames") && f.data["frames"].dims.size() == 2;
      if (clips || (f.data.count("mel") && f.data["mel"].dims.size() == 5))
        set_files(f, fdp.ConsumeIntegralInRange<uint64_t>(0, kClipFrames.size()), clips);
      break;
    }
    case 8: {
      Data& d = f.data[pick(fdp, kDataNames)];
      d.storage = static_cast<Storage>(fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(Storage::kCount) - 1));
      break;
    }
  }
}

/// Owns a raw HDF5 identifier created here.
struct Id {
  hid_t id;
  herr_t (*close)(hid_t);
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Id() {
    if (id >= 0) close(id);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
};

hid_t string_type(bool variable, size_t size) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, variable ? H5T_VARIABLE : std::max<size_t>(size, 1));
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

float to_float(double d) {
  if (std::isnan(d)) return NAN;
  if (d > FLT_MAX) return INFINITY;
  if (d < -FLT_MAX) return -INFINITY;
  return static_cast<float>(d);
}

bool write_attr(hid_t file, const std::string& name, const Attr& a) {
  Id scalar(H5Screate(a.type == AType::null_space ? H5S_NULL : H5S_SCALAR), H5Sclose);
  const hsize_t two = 2;
  Id array(H5Screate_simple(1, &two, nullptr), H5Sclose);
  const hid_t space = a.type == AType::array2 ? array.id : scalar.id;
  auto put = [&](hid_t type, const void* value) {
    Id attr(H5Acreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (attr.id < 0) return false;
    return value == nullptr || H5Awrite(attr.id, type, value) >= 0;
  };
  switch (a.type) {
    case AType::i64: return put(H5T_NATIVE_INT64, &a.i);
    case AType::i32: {
      const auto v = static_cast<int32_t>(a.i);
      return put(H5T_NATIVE_INT32, &v);
    }
    case AType::u64: {
      const auto v = static_cast<uint64_t>(a.i);
      return put(H5T_NATIVE_UINT64, &v);
    }
    case AType::i8: {
      const auto v = static_cast<int8_t>(a.i);
      return put(H5T_NATIVE_INT8, &v);
    }
    case AType::f64: return put(H5T_NATIVE_DOUBLE, &a.d);
    case AType::f32: {
      const float v = to_float(a.d);
      return put(H5T_NATIVE_FLOAT, &v);
    }
    case AType::vstr: {
      Id t(string_type(true, 0), H5Tclose);
      const char* p = a.s.c_str();
      return put(t.id, &p);
    }
    case AType::fstr: {
      Id t(string_type(false, a.s.size()), H5Tclose);
      std::string padded = a.s;
      padded.resize(std::max<size_t>(a.s.size(), 1), '\0');
      return put(t.id, padded.data());
    }
    case AType::array2: {
      const int64_t v[2] = {a.i, a.i};
      return put(H5T_NATIVE_INT64, v);
    }
    case AType::null_space: return put(H5T_NATIVE_INT64, nullptr);
    case AType::kCount: break;
  }
  return false;
}

/// The scratch folder's regular file and FIFO that external storage names (made by Scratch).
fs::path g_secret, g_fifo;

/// Creates `name` as a virtual dataset of `type` and `dims` (rank >= 1) over the source d.storage names.
bool write_virtual(hid_t file, const std::string& name, hid_t type, const std::vector<hsize_t>& dims, Storage s) {
  if (dims.empty()) return false;
  Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const std::string source = s == Storage::virtual_self       ? "."
                             : s == Storage::virtual_outside  ? "../outside.h5"
                             : s == Storage::virtual_absolute ? "/etc/passwd"
                                                              : "missing.h5";
  if (space.id < 0 || H5Pset_virtual(dcpl.id, space.id, source.c_str(), ("/" + name).c_str(), space.id) < 0)
    return false;
  Id ds(H5Dcreate2(file, name.c_str(), type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose);
  return ds.id >= 0;
}

bool write_data(hid_t file, const std::string& name, const Data& d) {
  if (d.type == DType::group) {
    Id g(H5Gcreate2(file, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    return g.id >= 0;
  }
  const bool huge_string = d.storage == Storage::huge_fixed_string;
  const bool long_string = d.storage == Storage::long_fixed_string;
  const bool is_string = d.type == DType::vstr || d.type == DType::fstr || huge_string || long_string;
  const size_t fixed = huge_string ? size_t{1} << 30 : long_string ? (size_t{64} << 10) + 1 : 12;
  hid_t type = H5I_INVALID_HID;
  melforge::h5::Datatype half;
  const bool variable = d.type == DType::vstr && !huge_string && !long_string;
  Id str(is_string ? string_type(variable, fixed) : H5I_INVALID_HID, H5Tclose);
  switch (d.type) {
    case DType::f16: half = melforge::h5::float16_type(); type = half.id(); break;
    case DType::f32: type = H5T_NATIVE_FLOAT; break;
    case DType::f64: type = H5T_NATIVE_DOUBLE; break;
    case DType::i32: type = H5T_NATIVE_INT32; break;
    case DType::i64: type = H5T_NATIVE_INT64; break;
    case DType::u8: type = H5T_NATIVE_UINT8; break;
    case DType::i8: type = H5T_NATIVE_INT8; break;
    default: type = str.id; break;
  }
  if (is_string) type = str.id;
  const auto rank = static_cast<int>(d.dims.size());
  std::vector<hsize_t> dims(d.dims.begin(), d.dims.end());
  if (d.storage >= Storage::virtual_self && d.storage <= Storage::virtual_missing)
    return write_virtual(file, name, type, dims, d.storage);
  const bool external = d.storage == Storage::external_file || d.storage == Storage::external_fifo;
  std::vector<hsize_t> max_dims(dims.size(), H5S_UNLIMITED);
  Id space(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(),
                                                          d.chunked || d.storage == Storage::huge_chunk
                                                              ? max_dims.data()
                                                              : nullptr),
           H5Sclose);
  if (space.id < 0) return false;
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (external) {
    const fs::path& target = d.storage == Storage::external_file ? g_secret : g_fifo;
    if (H5Pset_external(dcpl.id, target.c_str(), 0, H5F_UNLIMITED) < 0) return false;
  } else if ((d.chunked || d.storage == Storage::huge_chunk) && rank > 0) {
    std::vector<hsize_t> chunk(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) chunk[i] = std::clamp<hsize_t>(dims[i], 1, 16);
    if (d.storage == Storage::huge_chunk) {
      std::fill(chunk.begin(), chunk.end(), 1);
      chunk[0] = (hsize_t{1} << 31) / std::min<size_t>(H5Tget_size(type), 8);
    }
    if (H5Pset_chunk(dcpl.id, rank, chunk.data()) < 0) return false;
    if (d.deflate) H5Pset_deflate(dcpl.id, 1);
  }
  Id ds(H5Dcreate2(file, name.c_str(), type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose);
  if (ds.id < 0) return false;
  uint64_t n = 1;
  for (auto x : d.dims) n = x > 0 && n > (uint64_t{1} << 20) / x ? (uint64_t{1} << 21) : n * x;
  const uint64_t max_n = long_string ? 64 : uint64_t{1} << 20;
  if (!d.write || external || huge_string || d.storage == Storage::huge_chunk || n == 0 || n > max_n) return true;
  if (is_string) {
    std::vector<std::string> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = d.strs.empty() ? "" : d.strs[i % d.strs.size()];
    if (variable) {
      std::vector<const char*> ptrs(n);
      for (size_t i = 0; i < n; ++i) ptrs[i] = values[i].c_str();
      return H5Dwrite(ds.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) >= 0;
    }
    std::vector<char> buf(n * fixed, long_string ? 'x' : '\0');
    for (size_t i = 0; i < n; ++i)
      std::copy_n(values[i].data(), std::min<size_t>(values[i].size(), fixed), &buf[i * fixed]);
    return H5Dwrite(ds.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0;
  }
  if (d.type == DType::f16 || d.type == DType::f32 || d.type == DType::f64) {
    std::vector<double> values(n, d.value);
    return H5Dwrite(ds.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0;
  }
  std::vector<int64_t> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = d.ints.empty() ? 0 : d.ints[i % d.ints.size()];
  return H5Dwrite(ds.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0;
}

bool write_file(const fs::path& path, const FileSpec& spec) {
  melforge::h5::silence_errors();
  Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (file.id < 0) return false;
  for (const auto& [name, a] : spec.attrs)
    if (!write_attr(file.id, name, a)) return false;
  for (const auto& [name, d] : spec.data)
    if (!write_data(file.id, name, d)) return false;
  return true;
}

/// True when a split claims more than 2^20 clips consistently in its per-clip datasets (label, path, and
/// num_valid_long or num_samples, clip_flags and frame_offset), but few enough that read_split_info's memory check (64
/// bytes a clip against MemAvailable) lets it read them: gigabytes for the target to allocate, so such inputs are
/// not run. Larger claims are run, and read_split_info must refuse them before reading.
bool claims_huge_file_count(const FileSpec& f) {
  const auto rows = f.data.find("label");
  if (rows == f.data.end() || rows->second.dims.size() != 1 || rows->second.dims[0] <= (uint64_t{1} << 20))
    return false;
  const uint64_t files = rows->second.dims[0];
  const int64_t available = melforge::data::available_memory_bytes();
  if (available >= 0 && files > static_cast<uint64_t>(available / 64)) return false;
  const auto has = [&](const char* name, uint64_t n) {
    const auto d = f.data.find(name);
    return d != f.data.end() && d->second.dims == std::vector<uint64_t>{n};
  };
  if (!has("path", files)) return false;
  return has("num_valid_long", files) ||
         (has("num_samples", files) && has("clip_flags", files) && has("frame_offset", files + 1));
}

struct Scratch {
  fs::path dir;
  Scratch() {
    const char* env = std::getenv("TMPDIR");
    std::error_code ec;
    const std::string base = env && *env ? env : fs::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    std::string pattern = base + "/melforge-fuzz-dataset-XXXXXX";
    require(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
    dir = pattern;
    g_secret = dir / "secret.txt";
    g_fifo = dir / "fifo";
    FILE* secret = std::fopen(g_secret.c_str(), "w");
    require(secret != nullptr, "cannot write the secret file");
    std::fputs("root:x:0:0:root:/root:/bin/bash\n", secret);
    std::fclose(secret);
    require(::mkfifo(g_fifo.c_str(), 0600) == 0, "mkfifo failed");
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

/// What read_split_info promises of a split it returns.
void check_split_info(const melforge::data::SplitInfo& s) {
  const int64_t files = s.files();
  const auto classes = static_cast<int64_t>(s.class_names.size());
  require(static_cast<int64_t>(s.labels.size()) == files, "labels is not [files]");
  for (int64_t l : s.labels) require(l >= 0 && l < classes, "read a label outside the class names");
  require(static_cast<int64_t>(s.frame_offset.size()) == files + 1, "frame_offset is not [files + 1]");
  require(s.frame_offset[0] == 0, "frame_offset does not start at 0");
  require(static_cast<int64_t>(s.num_samples.size()) == files, "num_samples is not [files]");
  require(static_cast<int64_t>(s.clip_flags.size()) == files, "clip_flags is not [files]");
  require(s.targets.empty() || static_cast<int64_t>(s.targets.size()) == files * classes, "targets is not [F, C]");
  const bool clips = s.schema_version >= melforge::data::kClipSchemaVersion;
  require(clips == s.num_valid_long.empty() || files == 0, "num_valid_long present in schema 3 or absent before");
  for (int64_t f = 0; f < files; ++f) {
    require(s.frame_offset[f + 1] > s.frame_offset[f], "frame_offset is not strictly increasing");
    require(s.num_samples[f] >= 1, "read a clip of no samples");
    require((s.clip_flags[f] & ~melforge::data::kClipFlagsKnown) == 0, "read unknown clip_flags bits");
    if (clips) continue;
    const int64_t v = s.num_valid_long[f];
    require(v >= 1 && v <= s.info.num_long, "read a num_valid_long outside [1, num_long]");
    require(s.clip_frames(f) == v * s.info.num_short * s.info.n_frames, "a schema 1/2 clip is not its segments");
  }
}

/// Reads `s` through a ClipReader: whole clips when the frames take at most 64 MiB (else the first frame of each
/// clip), each clip's last frame again on its own (equal to the same frame of the whole read), and one frame past
/// the last clip's end (InvalidArgument).
void check_reads(const melforge::data::SplitInfo& s, int64_t cache_bytes) {
  const melforge::data::ClipReader reader(s, cache_bytes);
  require(reader.clips() == s.files() && reader.total_frames() == s.total_frames(), "ClipReader sizes differ");
  require(reader.n_mels() == s.info.n_mels, "ClipReader n_mels differs");
  const int64_t m = reader.n_mels();
  constexpr int64_t kMaxValues = int64_t{16} << 20;
  if (m > kMaxValues) return;
  std::vector<float> one(static_cast<size_t>(m));
  if (s.total_frames() <= kMaxValues / m) {
    std::vector<float> all(static_cast<size_t>(s.total_frames() * m));
    reader.read_clips(0, s.files(), all.data());
    for (int64_t f = 0; f < s.files(); ++f) {
      const int64_t last = s.clip_frames(f) - 1;
      reader.read_frames(f, last, 1, one.data());
      const float* row = all.data() + (s.frame_offset[f] + last) * m;
      require(std::equal(one.begin(), one.end(), row), "a frame read alone differs from the same frame of its clip");
    }
  } else {
    for (int64_t f = 0; f < s.files(); ++f) reader.read_frames(f, 0, 1, one.data());
  }
  if (s.files() == 0) return;
  const int64_t f = s.files() - 1;
  try {
    reader.read_frames(f, s.clip_frames(f), 1, one.data());
    require(false, "a read past a clip's end succeeded");
  } catch (const melforge::InvalidArgument&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Scratch scratch;
  FuzzedDataProvider fdp(data, size);
  const int64_t schema = fdp.ConsumeIntegralInRange<int64_t>(1, 3);
  const int classes = fdp.ConsumeIntegralInRange<int>(1, 3);
  FileSpec spec = base_spec(schema, fdp.ConsumeIntegralInRange<uint64_t>(0, kClipFrames.size()), classes);
  const int64_t cache_bytes = fdp.ConsumeBool() ? int64_t{1} << 20 : 1;
  for (int i = 0; i < 32 && fdp.remaining_bytes() > 0; ++i) edit(fdp, spec);
  if (claims_huge_file_count(spec)) return 0;
  const fs::path path = scratch.dir / "train.h5";
  if (!write_file(path, spec)) return 0;

  try {
    const melforge::data::SplitInfo s = melforge::data::read_split_info(path, "train");
    check_split_info(s);
    check_reads(s, cache_bytes);
  } catch (const melforge::Error&) {
  }
  const ssize_t open_ids = H5Fget_obj_count(static_cast<hid_t>(H5F_OBJ_ALL), H5F_OBJ_ALL);
  require(open_ids == 0, std::to_string(open_ids) + " HDF5 identifiers are still open after the reads");
  return 0;
}
