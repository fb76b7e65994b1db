// Tests of the split writer (builder/h5_writer.h): round trips through our reader, through HDF5's own filter
// pipeline and through h5py; chunk layout; attributes and strings; failure handling.
#include <signal.h>
#include "melforge_test_paths.h"
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_util.h"
#include "test_skip.h"

namespace melforge_test_h5_writer {

using namespace melforge;
using builder::FileRecord;
using builder::SplitWriter;
using builder::SplitWriterConfig;

namespace {

/// Naive IEEE half decoding.
double naive_half(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  const double v = exponent == 0 ? std::ldexp(mantissa / 1024.0, -14) : std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  return (bits & 0x8000) ? -v : v;
}

/// Half bits of a value that is exactly representable as a normal half or zero.
uint16_t exact_half_bits(float v) {
  if (v == 0.0f) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::fabs(static_cast<double>(v)), &e);
  const auto mantissa = static_cast<uint16_t>((m * 2.0 - 1.0) * 1024.0);
  const auto bits = static_cast<uint16_t>(sign | ((e - 1 + 15) << 10) | mantissa);
  REQUIRE(naive_half(bits) == static_cast<double>(v));
  return bits;
}

/// Mel bands of the test files.
constexpr int64_t kMels = 4;

/// Frames of test clip k: 1 to 5, varying.
int64_t clip_frames(int64_t k) { return 1 + k * 7 % 5; }

/// Frames of test clips [0, k).
int64_t frames_before(int64_t k) {
  int64_t n = 0;
  for (int64_t i = 0; i < k; ++i) n += clip_frames(i);
  return n;
}

/// Spectrogram-like test data for `frames` frames of `n_mels` bands: smooth values plus noise, multiples of 1/8 in
/// (-96, 96), exactly representable in float16. `bytes` holds them in the stored dtype, `values` as floats.
struct MelData {
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

MelData make_mel(int64_t frames, int64_t n_mels, mel::DType dtype, uint32_t seed) {
  const int64_t n = frames * n_mels;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-3.0f, 3.0f);
  MelData d;
  d.values.resize(static_cast<size_t>(n));
  const size_t elem = dtype == mel::DType::float16 ? 2 : 4;
  d.bytes.resize(static_cast<size_t>(n) * elem);
  for (int64_t i = 0; i < n; ++i) {
    const float raw = -40.0f + 30.0f * std::sin(0.05f * static_cast<float>(i % 997)) + noise(rng);
    const float v = std::round(raw * 8.0f) / 8.0f;
    d.values[static_cast<size_t>(i)] = v;
    if (dtype == mel::DType::float16) {
      const uint16_t h = exact_half_bits(v);
      std::memcpy(d.bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(d.bytes.data() + 4 * i, &v, 4);
    }
  }
  return d;
}

/// Records of test clips [first, first + count): clip_frames(k) frames, samples and flags varying with k.
std::vector<FileRecord> make_records(int64_t first, int64_t count) {
  std::vector<FileRecord> r(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = first + i;
    r[static_cast<size_t>(i)].label = static_cast<int32_t>(k % 3);
    r[static_cast<size_t>(i)].path = "class_" + std::to_string(k % 3) + "/file_" + std::to_string(k) + ".wav";
    r[static_cast<size_t>(i)].frames = clip_frames(k);
    r[static_cast<size_t>(i)].num_samples = clip_frames(k) * 64 + k;
    r[static_cast<size_t>(i)].clip_flags = static_cast<uint8_t>(k % 4);
    r[static_cast<size_t>(i)].source_sample_rate = k % 2 == 0 ? 44100 : 8000 + static_cast<int32_t>(k);
  }
  return r;
}

/// The clip columns make_records(0, files) gives, built naively.
builder::ClipColumns expected_clips(int64_t files) {
  builder::ClipColumns c;
  for (int64_t k = 0; k < files; ++k) {
    c.frame_offset.push_back(frames_before(k + 1));
    c.num_samples.push_back(clip_frames(k) * 64 + k);
    c.clip_flags.push_back(static_cast<uint8_t>(k % 4));
  }
  return c;
}

SplitWriterConfig base_config(const std::filesystem::path& path) {
  SplitWriterConfig c;
  c.final_path = path;
  c.split = "train";
  c.n_mels = kMels;
  c.class_names = {"a", "b", "c"};
  c.threads = 2;
  return c;
}

int64_t elem_size(const SplitWriterConfig& c) { return c.dtype == mel::DType::float16 ? 2 : 4; }

int64_t expected_frames_per_chunk(const SplitWriterConfig& c) {
  const int64_t frame_bytes = c.n_mels * elem_size(c);
  return c.frames_per_chunk > 0 ? c.frames_per_chunk : std::max<int64_t>(1, (int64_t{1} << 20) / frame_bytes);
}

/// Writes `data` in appends of `sizes` clips and finishes; returns the writer's bytes_written().
int64_t write_split(const SplitWriterConfig& config, const MelData& data, const std::vector<int>& sizes) {
  SplitWriter w(config);
  const int64_t frame_bytes = config.n_mels * elem_size(config);
  int64_t done = 0;
  for (int s : sizes) {
    w.append(data.bytes.data() + frames_before(done) * frame_bytes, make_records(done, s));
    done += s;
    CHECK(w.files() == done);
    CHECK(w.frames() == frames_before(done));
  }
  CHECK(std::filesystem::exists(config.final_path.string() + ".partial"));
  CHECK_FALSE(std::filesystem::exists(config.final_path));
  w.finish();
  CHECK(w.compress_seconds() >= 0.0);
  CHECK(w.write_seconds() >= 0.0);
  return w.bytes_written();
}

/// Reads the whole `frames` dataset with plain H5Dread in its own stored type (HDF5's filter pipeline decodes).
std::vector<unsigned char> plain_read(const std::filesystem::path& path) {
  h5::File f = h5::open_file(path);
  h5::Dataset ds = h5::open_dataset(f, "frames");
  h5::Datatype type = h5::dataset_type(ds);
  const std::vector<int64_t> d = h5::dims(ds);
  const int64_t n = d.at(0) * d.at(1);
  std::vector<unsigned char> out(static_cast<size_t>(n) * H5Tget_size(type.id()));
  if (n > 0) REQUIRE(H5Dread(ds.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
  return out;
}

/// Stored bytes of every chunk of `frames`, in order along dim 0.
std::vector<std::vector<unsigned char>> stored_chunks(const std::filesystem::path& path, int64_t frames_per_chunk) {
  h5::File f = h5::open_file(path);
  h5::Dataset ds = h5::open_dataset(f, "frames");
  const std::vector<int64_t> d = h5::dims(ds);
  hsize_t num = 0;
  {
    h5::Dataspace space = h5::dataset_space(ds);
    REQUIRE(H5Dget_num_chunks(ds.id(), space.id(), &num) >= 0);
  }
  const int64_t expected = (d[0] + frames_per_chunk - 1) / frames_per_chunk;
  REQUIRE(static_cast<int64_t>(num) == expected);
  std::vector<std::vector<unsigned char>> chunks;
  for (int64_t c = 0; c < expected; ++c) {
    std::vector<hsize_t> offset(d.size(), 0);
    offset[0] = static_cast<hsize_t>(c * frames_per_chunk);
    hsize_t size = 0;
    REQUIRE(H5Dget_chunk_storage_size(ds.id(), offset.data(), &size) >= 0);
    std::vector<unsigned char> buf(size);
    uint32_t mask = 1;
    REQUIRE(H5Dread_chunk(ds.id(), H5P_DEFAULT, offset.data(), &mask, buf.data()) >= 0);
    CHECK(mask == 0);
    chunks.push_back(std::move(buf));
  }
  return chunks;
}

/// Writes `data` into a dataset laid out like the writer's, through HDF5's own H5Dwrite and filter pipeline.
void write_reference(const std::filesystem::path& path, const SplitWriterConfig& c, const MelData& data,
                     int64_t frames) {
  h5::File f = h5::create_file(path);
  h5::Datatype f16 = h5::float16_type();
  const hid_t type = c.dtype == mel::DType::float16 ? f16.id() : H5T_NATIVE_FLOAT;
  h5::ChunkedSpec spec;
  spec.dims = {frames, c.n_mels};
  spec.max_dims = {-1, c.n_mels};
  spec.chunk = {expected_frames_per_chunk(c), c.n_mels};
  spec.shuffle = c.shuffle;
  spec.deflate_level = c.compression_level;
  h5::Dataset ds = h5::create_chunked_dataset(f, "frames", type, spec);
  if (frames > 0) REQUIRE(H5Dwrite(ds.id(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.bytes.data()) >= 0);
}

/// Naive inverse of HDF5's shuffle filter.
std::vector<unsigned char> naive_unshuffle(const std::vector<unsigned char>& in, size_t elem) {
  const size_t n = in.size() / elem;
  std::vector<unsigned char> out(in.size());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < elem; ++j) out[i * elem + j] = in[j * n + i];
  }
  return out;
}

std::vector<unsigned char> read_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("split files round trip through our reader and HDF5's own filter pipeline", "[h5_writer]") {
  const auto dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  const int level = GENERATE(0, 1, 4, 9);
  const bool shuffle = GENERATE(true, false);
  const int frames_per_chunk = GENERATE(1, 7, 0);
  const auto sizes = GENERATE(values<std::vector<int>>({{7}, {1, 1, 1, 1, 1}, {3, 3}, {2, 5, 0, 4}, {}}));
  const bool half = dtype == mel::DType::float16;
  CAPTURE(half, level, shuffle, frames_per_chunk, sizes);

  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "train.h5");
  c.dtype = dtype;
  c.compression_level = level;
  c.shuffle = shuffle;
  c.frames_per_chunk = frames_per_chunk;
  int64_t files = 0;
  for (int s : sizes) files += s;
  const int64_t frames = frames_before(files);
  const MelData data = make_mel(frames, kMels, dtype, 17u + static_cast<uint32_t>(files));
  const int64_t bytes_written = write_split(c, data, sizes);
  REQUIRE(std::filesystem::exists(c.final_path));
  CHECK_FALSE(std::filesystem::exists(c.final_path.string() + ".partial"));

  {
    h5::File f = h5::open_file(c.final_path);
    h5::Dataset ds = h5::open_dataset(f, "frames");
    CHECK(h5::dims(ds) == std::vector<int64_t>{frames, kMels});
    CHECK(h5::read_float(ds) == data.values);
    if (frames >= 4)
      CHECK(h5::read_float(ds, 1, 3) == std::vector<float>(data.values.begin() + 4, data.values.begin() + 16));
    h5::Datatype type = h5::dataset_type(ds);
    h5::Datatype f16 = h5::float16_type();
    CHECK(H5Tequal(type.id(), dtype == mel::DType::float16 ? f16.id() : H5T_IEEE_F32LE) > 0);
    const std::vector<FileRecord> records = make_records(0, files);
    std::vector<int32_t> labels, rates;
    std::vector<std::string> paths;
    for (const FileRecord& r : records) {
      labels.push_back(r.label);
      paths.push_back(r.path);
      rates.push_back(r.source_sample_rate);
    }
    CHECK(h5::read_int32(f, "label") == labels);
    const builder::ClipColumns clips = builder::read_clip_columns(f, files, frames, c.final_path.string());
    const builder::ClipColumns want = expected_clips(files);
    CHECK(clips.frame_offset == want.frame_offset);
    CHECK(clips.num_samples == want.num_samples);
    CHECK(clips.clip_flags == want.clip_flags);
    CHECK_FALSE(h5::exists(f, "mel"));
    CHECK_FALSE(h5::exists(f, "num_valid_long"));
    CHECK(h5::read_int32(f, "source_sample_rate") == rates);
    CHECK(h5::read_strings(f, "path") == paths);
    CHECK(h5::read_strings(f, "class_names") == c.class_names);
  }
  CHECK(plain_read(c.final_path) == data.bytes);

  const int64_t fpc = expected_frames_per_chunk(c);
  const size_t elem = dtype == mel::DType::float16 ? 2 : 4;
  const size_t chunk_bytes = static_cast<size_t>(fpc * kMels) * elem;
  const auto ours = stored_chunks(c.final_path, fpc);
  int64_t stored = 0;
  for (size_t k = 0; k < ours.size(); ++k) {
    stored += static_cast<int64_t>(ours[k].size());
    std::vector<unsigned char> raw = ours[k];
    if (level > 0) {
      raw.assign(chunk_bytes + 1, 0xAB);
      uLongf len = static_cast<uLongf>(raw.size());
      REQUIRE(uncompress(raw.data(), &len, ours[k].data(), static_cast<uLong>(ours[k].size())) == Z_OK);
      raw.resize(len);
      if (shuffle) raw = naive_unshuffle(raw, elem);
    }
    REQUIRE(raw.size() == chunk_bytes);
    std::vector<unsigned char> expected(chunk_bytes, 0);
    const size_t begin = k * chunk_bytes;
    const size_t end = std::min(begin + chunk_bytes, data.bytes.size());
    std::copy(data.bytes.begin() + static_cast<std::ptrdiff_t>(begin),
              data.bytes.begin() + static_cast<std::ptrdiff_t>(end), expected.begin());
    CHECK(raw == expected);
  }
  CHECK(bytes_written == stored);

  // Our deflate streams come from libdeflate, so only raw chunks can equal HDF5's own bytes; compressed chunks are
  // proven compatible above by zlib's uncompress and by HDF5's own H5Dread (plain_read).
  write_reference(dir / "reference.h5", c, data, frames);
  const auto reference = stored_chunks(dir / "reference.h5", fpc);
  CHECK(reference.size() == ours.size());
  if (level == 0) CHECK(reference == ours);
}

TEST_CASE("automatic frames per chunk gives about 1 MiB chunks over several chunks", "[h5_writer]") {
  const auto dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "valid.h5");
  c.n_mels = 128;
  c.dtype = dtype;
  c.frames_per_chunk = 0;
  c.compression_level = 1;
  const int64_t fpc = expected_frames_per_chunk(c);
  CHECK(fpc == (dtype == mel::DType::float16 ? 4096 : 2048));
  int64_t files = 0;
  while (frames_before(files) < 2 * fpc + fpc / 2) ++files;
  const MelData data = make_mel(frames_before(files), c.n_mels, dtype, 5);
  write_split(c, data, {static_cast<int>(files / 3), static_cast<int>(files - files / 3)});
  h5::File f = h5::open_file(c.final_path);
  h5::Dataset ds = h5::open_dataset(f, "frames");
  h5::PropList dcpl(H5Dget_create_plist(ds.id()), "dcpl");
  std::vector<hsize_t> chunk(2, 0);
  REQUIRE(H5Pget_chunk(dcpl.id(), 2, chunk.data()) == 2);
  CHECK(chunk == std::vector<hsize_t>{static_cast<hsize_t>(fpc), 128});
  CHECK(h5::read_float(ds) == data.values);
  CHECK(plain_read(c.final_path) == data.bytes);
  CHECK(stored_chunks(c.final_path, fpc).size() == 3);
}

TEST_CASE("filters are registered only when compressing", "[h5_writer]") {
  const int level = GENERATE(0, 1, 4, 9);
  const bool shuffle = GENERATE(true, false);
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "f.h5");
  c.compression_level = level;
  c.shuffle = shuffle;
  SplitWriter w(c);
  w.finish();
  h5::File f = h5::open_file(c.final_path);
  h5::Dataset ds = h5::open_dataset(f, "frames");
  h5::PropList dcpl(H5Dget_create_plist(ds.id()), "dcpl");
  std::vector<H5Z_filter_t> filters;
  for (int i = 0; i < H5Pget_nfilters(dcpl.id()); ++i) {
    unsigned flags = 0, cd[4] = {0};
    size_t ncd = 4;
    filters.push_back(H5Pget_filter2(dcpl.id(), static_cast<unsigned>(i), &flags, &ncd, cd, 0, nullptr, nullptr));
    if (filters.back() == H5Z_FILTER_DEFLATE) CHECK(cd[0] == static_cast<unsigned>(level));
    if (filters.back() == H5Z_FILTER_SHUFFLE) CHECK(cd[0] == 2);
  }
  std::vector<H5Z_filter_t> expected;
  if (level > 0 && shuffle) expected.push_back(H5Z_FILTER_SHUFFLE);
  if (level > 0) expected.push_back(H5Z_FILTER_DEFLATE);
  CHECK(filters == expected);
}

TEST_CASE("zero clips give a valid file with an empty frames dataset", "[h5_writer]") {
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "test.h5");
  c.split = "test";
  {
    SplitWriter w(c);
    w.append(nullptr, {});
    w.finish();
    CHECK(w.files() == 0);
    CHECK(w.bytes_written() == 0);
  }
  h5::File f = h5::open_file(c.final_path);
  h5::Dataset ds = h5::open_dataset(f, "frames");
  CHECK(h5::dims(ds) == std::vector<int64_t>{0, kMels});
  CHECK(h5::read_float(ds).empty());
  CHECK(h5::read_int32(f, "label").empty());
  CHECK(builder::read_clip_columns(f, 0, 0, "empty").frame_offset == std::vector<int64_t>{0});
  CHECK(h5::read_strings(f, "path").empty());
  CHECK(h5::read_strings(f, "class_names") == c.class_names);
  CHECK(h5::read_attribute_string(f, "split") == "test");
}

TEST_CASE("attributes and UTF-8 strings are stored", "[h5_writer]") {
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "données_é.h5");
  c.split = "valid";
  c.class_names = {"chien", "café", "音楽"};
  c.attributes = {{"sample_rate", int64_t{16000}},
                  {"f_min", 20.5},
                  {"window", std::string("hann")},
                  {"note", std::string("Grüße – 日本")}};
  const MelData data = make_mel(frames_before(3), kMels, c.dtype, 3);
  std::vector<FileRecord> records = make_records(0, 3);
  records[0].path = "café/été_1.wav";
  records[1].path = "音楽/曲 2.flac";
  records[2].path = "plain/ascii.wav";
  {
    SplitWriter w(c);
    w.append(data.bytes.data(), records);
    w.finish();
  }
  h5::File f = h5::open_file(c.final_path);
  CHECK(h5::read_attribute_int64(f, "schema_version") == builder::kSchemaVersion);
  CHECK(h5::read_attribute_string(f, "split") == "valid");
  CHECK(h5::read_attribute_string(f, "melforge_version") == MELFORGE_VERSION);
  CHECK(h5::read_attribute_int64(f, "sample_rate") == 16000);
  CHECK(h5::read_attribute_double(f, "f_min") == 20.5);
  CHECK(h5::read_attribute_string(f, "window") == "hann");
  CHECK(h5::read_attribute_string(f, "note") == "Grüße – 日本");
  CHECK(h5::read_strings(f, "path") == std::vector<std::string>{records[0].path, records[1].path, records[2].path});
  CHECK(h5::read_strings(f, "class_names") == c.class_names);
  for (const char* name : {"path", "class_names"}) {
    h5::Dataset ds = h5::open_dataset(f, name);
    h5::Datatype t = h5::dataset_type(ds);
    CHECK(H5Tis_variable_str(t.id()) > 0);
    CHECK(H5Tget_cset(t.id()) == H5T_CSET_UTF8);
  }
  for (const char* name : {"schema_version", "sample_rate"}) {
    h5::Attribute a(H5Aopen(f.id(), name, H5P_DEFAULT), name);
    h5::Datatype t(H5Aget_type(a.id()), name);
    CHECK(H5Tequal(t.id(), H5T_STD_I64LE) > 0);
  }
}

TEST_CASE("a writer destroyed before finish leaves nothing behind", "[h5_writer]") {
  const int appended = GENERATE(0, 1, 4);
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "train.h5");
  c.frames_per_chunk = 2;
  const std::filesystem::path partial = dir / "train.h5.partial";
  const MelData data = make_mel(frames_before(appended), kMels, c.dtype, 9);
  {
    SplitWriter w(c);
    if (appended > 0) w.append(data.bytes.data(), make_records(0, appended));
    CHECK(std::filesystem::exists(partial));
  }
  CHECK_FALSE(std::filesystem::exists(partial));
  CHECK_FALSE(std::filesystem::exists(c.final_path));
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("a stale partial file is replaced and an old final file is overwritten", "[h5_writer]") {
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "train.h5");
  test::write_text(dir / "train.h5.partial", "stale bytes");
  test::write_text(dir / "train.h5", "old result");
  const MelData data = make_mel(frames_before(2), kMels, c.dtype, 1);
  {
    SplitWriter w(c);
    w.append(data.bytes.data(), make_records(0, 2));
    CHECK(read_file_bytes(dir / "train.h5") == std::vector<unsigned char>{'o', 'l', 'd', ' ', 'r', 'e', 's', 'u', 'l', 't'});
    w.finish();
  }
  h5::File f = h5::open_file(c.final_path);
  CHECK(h5::read_float(h5::open_dataset(f, "frames")) == data.values);
  CHECK_FALSE(std::filesystem::exists(dir / "train.h5.partial"));
}

TEST_CASE("writing into a folder that does not exist throws IoError naming the path", "[h5_writer]") {
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "missing" / "train.h5");
  try {
    SplitWriter w(c);
    FAIL("no exception");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Catch::Contains((dir / "missing" / "train.h5.partial").string()));
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("invalid writer arguments throw InvalidArgument", "[h5_writer]") {
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "x.h5");
  SECTION("no mel band") { c.n_mels = 0; }
  SECTION("level") { c.compression_level = 10; }
  SECTION("frames per chunk") { c.frames_per_chunk = -1; }
  SECTION("reserved attribute") { c.attributes = {{"split", std::string("x")}}; }
  SECTION("duplicate attribute") { c.attributes = {{"n_fft", int64_t{1}}, {"n_fft", int64_t{2}}}; }
  CHECK_THROWS_AS(SplitWriter(c), InvalidArgument);
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("bad records and use after finish are rejected", "[h5_writer]") {
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "x.h5");
  const MelData data = make_mel(clip_frames(0), kMels, c.dtype, 1);
  SplitWriter w(c);
  const std::vector<FileRecord> good = make_records(0, 1);
  std::vector<FileRecord> r = good;
  SECTION("label") { r[0].label = 3; }
  SECTION("no frame") { r[0].frames = 0; }
  SECTION("negative samples") { r[0].num_samples = -1; }
  SECTION("unknown flag") { r[0].clip_flags = 4; }
  CHECK_THROWS_AS(w.append(data.bytes.data(), r), InvalidArgument);
  CHECK_THROWS_AS(w.append(nullptr, good), InvalidArgument);
  CHECK(w.files() == 0);
  w.append(data.bytes.data(), good);
  w.finish();
  CHECK_THROWS_AS(w.append(data.bytes.data(), good), InvalidArgument);
  CHECK_THROWS_AS(w.finish(), InvalidArgument);
  CHECK(std::filesystem::exists(c.final_path));
}

TEST_CASE("1 and 2 compression threads give byte-identical files", "[h5_writer]") {
  const auto dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "one.h5");
  c.dtype = dtype;
  c.frames_per_chunk = 2;
  c.compression_level = 4;
  c.attributes = {{"n_fft", int64_t{512}}, {"power", 2.0}, {"window", std::string("hann")}};
  const MelData data = make_mel(frames_before(23), kMels, dtype, 11);
  c.threads = 1;
  write_split(c, data, {5, 13, 5});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c.final_path = dir / "two.h5";
  c.threads = 2;
  write_split(c, data, {5, 13, 5});
  const auto one = read_file_bytes(dir / "one.h5");
  const auto two = read_file_bytes(dir / "two.h5");
  REQUIRE_FALSE(one.empty());
  CHECK(one == two);
}

TEST_CASE("a full disk during writing throws IoError and leaves no file", "[h5_writer]") {
  const int level = GENERATE(0, 1);
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "train.h5");
  c.n_mels = 64;
  c.dtype = mel::DType::float32;
  c.compression_level = level;
  c.frames_per_chunk = 512;
  c.threads = 1;
  std::vector<FileRecord> records = make_records(0, 16);
  for (FileRecord& r : records) r.frames = 512;
  const MelData data = make_mel(16 * 512, c.n_mels, c.dtype, 21);
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{256 * 1024, 256 * 1024};
    int code = 0;
    std::string message;
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) code = 9;
    try {
      SplitWriter w(c);
      for (int i = 0; i < 16; i += 4)
        w.append(data.bytes.data() + i * 64 * 512 * 4, {records.begin() + i, records.begin() + i + 4});
      w.finish();
      code = code ? code : 1;
    } catch (const IoError& e) {
      message = e.what();
      if (message.find(c.final_path.string()) == std::string::npos) code = 2;
    } catch (const std::exception& e) {
      message = e.what();
      code = 3;
    }
    if (std::filesystem::exists(c.final_path)) code = 4;
    if (std::filesystem::exists(c.final_path.string() + ".partial")) code = 5;
    if (write(fds[1], message.data(), message.size()) < 0) code = 6;
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  std::string message;
  char buf[512];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0) message.append(buf, static_cast<size_t>(got));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("child message: " << message);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(std::filesystem::exists(c.final_path));
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("h5py reads the written files", "[h5_writer][python]") {
  if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) {
    MELFORGE_SKIP("/usr/bin/python3 with h5py is not available (tools/setup.sh installs python3-h5py)");
  }
  const bool half = GENERATE(true, false);
  test::TempDir dir;
  SplitWriterConfig c = base_config(dir / "h5py.h5");
  c.dtype = half ? mel::DType::float16 : mel::DType::float32;
  c.compression_level = half ? 4 : 0;
  c.shuffle = true;
  c.frames_per_chunk = 3;
  c.class_names = {"chien", "café", "音楽"};
  c.attributes = {{"sample_rate", int64_t{16000}}, {"f_min", 20.5}, {"window", std::string("hann")}};
  const int64_t files = 7;
  const int64_t frames = frames_before(files);
  const MelData data = make_mel(frames, kMels, c.dtype, 99);
  std::vector<FileRecord> records = make_records(0, files);
  records[1].path = "café/été_1.wav";
  records[4].path = "音楽/曲 2.flac";
  {
    SplitWriter w(c);
    w.append(data.bytes.data(), {records.begin(), records.begin() + 2});
    w.append(data.bytes.data() + frames_before(2) * kMels * (half ? 2 : 4), {records.begin() + 2, records.end()});
    w.finish();
  }
  {
    std::ofstream out(dir / "expected.f32", std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.values.data()),
              static_cast<std::streamsize>(data.values.size() * sizeof(float)));
  }
  nlohmann::json expect;
  expect["file"] = c.final_path.string();
  expect["expected_frames"] = (dir / "expected.f32").string();
  expect["shape"] = {frames, kMels};
  expect["dtype"] = half ? "float16" : "float32";
  expect["chunks"] = {3, kMels};
  expect["compression_opts"] = c.compression_level;
  expect["shuffle"] = c.shuffle;
  std::vector<int32_t> labels, rates;
  std::vector<std::string> paths;
  for (const FileRecord& r : records) {
    labels.push_back(r.label);
    paths.push_back(r.path);
    rates.push_back(r.source_sample_rate);
  }
  const builder::ClipColumns clips = expected_clips(files);
  expect["label"] = labels;
  expect["frame_offset"] = clips.frame_offset;
  expect["num_samples"] = clips.num_samples;
  expect["clip_flags"] = clips.clip_flags;
  expect["source_sample_rate"] = rates;
  expect["path"] = paths;
  expect["class_names"] = c.class_names;
  expect["attributes"] = {{"schema_version", builder::kSchemaVersion},
                          {"split", "train"},
                          {"melforge_version", MELFORGE_VERSION},
                          {"sample_rate", 16000},
                          {"f_min", 20.5},
                          {"window", "hann"}};
  expect["write_back"] = (dir / "from_h5py.h5").string();
  {
    std::ofstream out(dir / "expect.json");
    out << expect.dump();
  }
  const std::string cmd = "/usr/bin/python3 '" + std::string(MELFORGE_SOURCE_DIR) + "/tests/h5py_readback.py' '" +
                          (dir / "expect.json").string() + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buf[256];
  while (fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pclose(pipe);
  INFO("h5py_readback.py output:\n" << output);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(output == "OK\n");

  h5::File f = h5::open_file(dir / "from_h5py.h5");
  h5::Dataset halves = h5::open_dataset(f, "half");
  h5::Datatype t = h5::dataset_type(halves);
  h5::Datatype f16 = h5::float16_type();
  CHECK(H5Tequal(t.id(), f16.id()) > 0);
  std::vector<float> expected_half(24);
  for (int i = 0; i < 24; ++i) expected_half[static_cast<size_t>(i)] = static_cast<float>(i) / 8.0f - 1.0f;
  CHECK(h5::read_float(halves) == expected_half);
  CHECK(h5::read_float(halves, 2, 2) == std::vector<float>(expected_half.begin() + 12, expected_half.end()));
  const std::vector<float> single = h5::read_float(h5::open_dataset(f, "single"));
  REQUIRE(single.size() == 10);
  CHECK(single.front() == -1.0f);
  CHECK(single.back() == 1.0f);
  CHECK(h5::read_strings(f, "names") == std::vector<std::string>{"α", "b", ""});
  CHECK(h5::read_strings(f, "fixed") == std::vector<std::string>{"ab", "cde"});
  CHECK(h5::read_int32(f, "wide") == std::vector<int32_t>{-3, 9});
  CHECK(h5::read_attribute_int64(f, "n") == 42);
  CHECK(h5::read_attribute_double(f, "x") == 0.25);
  CHECK(h5::read_attribute_string(f, "s") == "héllo");
}

TEST_CASE("ChunkCutter cuts any sequence of appends into the chunks of the concatenated files", "[h5_writer]") {
  const int64_t per_chunk = GENERATE(1, 2, 3, 5);
  const int64_t file_bytes = GENERATE(1, 7);
  const uint32_t seed = GENERATE(1u, 2u, 3u);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> count(0, 3 * per_chunk + 1);
  std::vector<unsigned char> all;
  std::vector<std::vector<unsigned char>> got;
  builder::ChunkCutter cutter(per_chunk, file_bytes);
  std::vector<std::vector<unsigned char>> keep_alive;
  for (int call = 0; call < 12; ++call) {
    const int64_t n = count(rng);
    std::vector<unsigned char> files(static_cast<std::size_t>(n * file_bytes));
    for (auto& b : files) b = static_cast<unsigned char>(rng());
    all.insert(all.end(), files.begin(), files.end());
    for (const unsigned char* c : cutter.append(files.data(), n))
      got.emplace_back(c, c + per_chunk * file_bytes);
    CHECK(cutter.pending_units() == static_cast<int64_t>(all.size()) / file_bytes % per_chunk);
    keep_alive.push_back(std::move(files));
  }
  if (const unsigned char* last = cutter.flush()) got.emplace_back(last, last + per_chunk * file_bytes);
  CHECK(cutter.flush() == nullptr);
  const auto chunk = static_cast<std::size_t>(per_chunk * file_bytes);
  std::vector<std::vector<unsigned char>> want;
  for (std::size_t at = 0; at < all.size(); at += chunk) {
    std::vector<unsigned char> c(chunk, 0);
    std::copy(all.begin() + static_cast<std::ptrdiff_t>(at),
              all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), at + chunk)), c.begin());
    want.push_back(std::move(c));
  }
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("chunk " << i);
    CHECK(got[i] == want[i]);
  }
  CHECK_THROWS_AS(builder::ChunkCutter(0, 4), InvalidArgument);
}

}  // namespace melforge_test_h5_writer
