// Tests of the RAII HDF5 layer (common/h5.h): handles, attributes, int32 and string datasets, float reads, errors.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_util.h"

namespace melforge_test_h5 {

using namespace melforge;
namespace fs = std::filesystem;

namespace {

/// Naive IEEE half decoding: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024.
double naive_half(uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  double v;
  if (exponent == 0) {
    v = std::ldexp(mantissa / 1024.0, -14);
  } else if (exponent == 31) {
    v = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return sign ? -v : v;
}

/// Captures what is written to file descriptor 2 while `fn` runs.
template <class F>
std::string capture_stderr(F&& fn) {
  test::TempDir dir;
  const std::string path = (dir.path() / "stderr.txt").string();
  std::fflush(stderr);
  const int saved = dup(2);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(saved >= 0);
  REQUIRE(fd >= 0);
  dup2(fd, 2);
  close(fd);
  try {
    fn();
  } catch (...) {
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("half_to_float matches the naive decoding for every bit pattern", "[h5]") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const double expected = naive_half(bits);
    const float got = h5::half_to_float(bits);
    if (std::isnan(expected)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == expected);
      CHECK(std::signbit(got) == std::signbit(expected));
    }
  }
}

TEST_CASE("float16 type has h5py's layout", "[h5]") {
  h5::Datatype t = h5::float16_type();
  CHECK(H5Tget_class(t.id()) == H5T_FLOAT);
  CHECK(H5Tget_size(t.id()) == 2);
  CHECK(H5Tget_precision(t.id()) == 16);
  CHECK(H5Tget_offset(t.id()) == 0);
  CHECK(H5Tget_order(t.id()) == H5T_ORDER_LE);
  CHECK(H5Tget_ebias(t.id()) == 15);
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  REQUIRE(H5Tget_fields(t.id(), &spos, &epos, &esize, &mpos, &msize) >= 0);
  CHECK(spos == 15);
  CHECK(epos == 10);
  CHECK(esize == 5);
  CHECK(mpos == 0);
  CHECK(msize == 10);
  CHECK(H5Tget_norm(t.id()) == H5T_NORM_IMPLIED);
}

TEST_CASE("handles are move-only owners that close their identifier", "[h5]") {
  h5::Datatype a = h5::float16_type();
  const hid_t id = a.id();
  REQUIRE(H5Iis_valid(id) > 0);
  h5::Datatype b = std::move(a);
  CHECK_FALSE(a);
  CHECK(b.id() == id);
  CHECK(H5Iis_valid(id) > 0);
  h5::Datatype c;
  c = std::move(b);
  CHECK(c.id() == id);
  c.close();
  CHECK_FALSE(c);
  CHECK(H5Iis_valid(id) <= 0);
  {
    h5::Datatype d = h5::utf8_string_type();
    const hid_t did = d.id();
    h5::Datatype e = h5::float16_type();
    const hid_t eid = e.id();
    d = std::move(e);
    CHECK(H5Iis_valid(did) <= 0);
    CHECK(d.id() == eid);
  }
  CHECK(H5Iis_valid(id) <= 0);
}

TEST_CASE("attributes round trip", "[h5]") {
  test::TempDir dir;
  const auto path = dir / "attrs.h5";
  {
    h5::File f = h5::create_file(path);
    h5::write_attribute_int64(f, "big", std::numeric_limits<int64_t>::max());
    h5::write_attribute_int64(f, "small", std::numeric_limits<int64_t>::min());
    h5::write_attribute_double(f, "pi", 3.141592653589793);
    h5::write_attribute_double(f, "tiny", 1e-10);
    h5::write_attribute_string(f, "text", "Grüße, 日本語 🎵");
    h5::write_attribute_string(f, "empty", "");
    h5::write_attribute_int64(f, "replaced", 1);
    h5::write_attribute_string(f, "replaced", "now a string");
    h5::Group g = h5::create_group(f, "sub");
    h5::write_attribute_int64(g, "depth", 1);
    f.close();
  }
  h5::File f = h5::open_file(path);
  CHECK(h5::read_attribute_int64(f, "big") == std::numeric_limits<int64_t>::max());
  CHECK(h5::read_attribute_int64(f, "small") == std::numeric_limits<int64_t>::min());
  CHECK(h5::read_attribute_double(f, "pi") == 3.141592653589793);
  CHECK(h5::read_attribute_double(f, "tiny") == 1e-10);
  CHECK(h5::read_attribute_double(f, "big") == static_cast<double>(std::numeric_limits<int64_t>::max()));
  CHECK(h5::read_attribute_string(f, "text") == "Grüße, 日本語 🎵");
  CHECK(h5::read_attribute_string(f, "empty").empty());
  CHECK(h5::read_attribute_string(f, "replaced") == "now a string");
  CHECK(h5::has_attribute(f, "pi"));
  CHECK_FALSE(h5::has_attribute(f, "nope"));
  h5::Group g = h5::open_group(f, "sub");
  CHECK(g.name() == path.string() + ":/sub");
  CHECK(h5::read_attribute_int64(g, "depth") == 1);

  CHECK_THROWS_AS(h5::read_attribute_int64(f, "nope"), FormatError);
  CHECK_THROWS_AS(h5::read_attribute_int64(f, "text"), FormatError);
  CHECK_THROWS_AS(h5::read_attribute_int64(f, "pi"), FormatError);
  CHECK_THROWS_AS(h5::read_attribute_string(f, "pi"), FormatError);
  CHECK_THROWS_AS(h5::read_attribute_double(f, "text"), FormatError);
  try {
    h5::read_attribute_string(f, "pi");
    FAIL("no exception");
  } catch (const FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path.string()) && Catch::Contains("'pi'"));
  }
}

TEST_CASE("int32 and string datasets round trip", "[h5]") {
  const auto n = GENERATE(0, 1, 5, 1000);
  test::TempDir dir;
  const auto path = dir / "data.h5";
  std::vector<int32_t> ints(static_cast<size_t>(n));
  std::vector<std::string> strings(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ints[static_cast<size_t>(i)] = (i % 2 ? -1 : 1) * i * 1000003;
    strings[static_cast<size_t>(i)] = i % 7 == 3 ? "" : "dir/é_" + std::to_string(i) + "_声音.wav";
  }
  {
    h5::File f = h5::create_file(path);
    h5::write_int32(f, "ints", ints);
    h5::write_strings(f, "strings", strings);
    f.close();
  }
  h5::File f = h5::open_file(path);
  CHECK(h5::read_int32(f, "ints") == ints);
  CHECK(h5::read_strings(f, "strings") == strings);
  h5::Dataset ds = h5::open_dataset(f, "strings");
  h5::Datatype t = h5::dataset_type(ds);
  CHECK(H5Tis_variable_str(t.id()) > 0);
  CHECK(H5Tget_cset(t.id()) == H5T_CSET_UTF8);
  CHECK(h5::dims(ds) == std::vector<int64_t>{n});
  CHECK_THROWS_AS(h5::read_int32(f, "strings"), FormatError);
  CHECK_THROWS_AS(h5::read_strings(f, "ints"), FormatError);
  CHECK_THROWS_AS(h5::read_int32(f, "missing"), FormatError);
}

TEST_CASE("fixed-length strings and other integer widths are read", "[h5]") {
  test::TempDir dir;
  const auto path = dir / "fixed.h5";
  {
    h5::File f = h5::create_file(path);
    h5::Datatype t(H5Tcopy(H5T_C_S1), "fixed");
    REQUIRE(H5Tset_size(t.id(), 4) >= 0);
    REQUIRE(H5Tset_strpad(t.id(), H5T_STR_NULLPAD) >= 0);
    const hsize_t n = 3;
    h5::Dataspace s(H5Screate_simple(1, &n, nullptr), "space");
    h5::Dataset ds(H5Dcreate2(f.id(), "names", t.id(), s.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "names");
    const char data[12] = {'a', 'b', 0, 0, 'w', 'x', 'y', 'z', 'q', 0, 0, 0};
    REQUIRE(H5Dwrite(ds.id(), t.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    h5::Dataset wide(H5Dcreate2(f.id(), "wide", H5T_STD_I64BE, s.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     "wide");
    const int64_t values[3] = {-7, 0, 123456};
    REQUIRE(H5Dwrite(wide.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
    h5::Attribute a(H5Acreate2(f.id(), "fixed_attr", t.id(), h5::Dataspace(H5Screate(H5S_SCALAR), "s").id(),
                               H5P_DEFAULT, H5P_DEFAULT),
                    "a");
    REQUIRE(H5Awrite(a.id(), t.id(), "hey") >= 0);
  }
  h5::File f = h5::open_file(path);
  CHECK(h5::read_strings(f, "names") == std::vector<std::string>{"ab", "wxyz", "q"});
  CHECK(h5::read_int32(f, "wide") == std::vector<int32_t>{-7, 0, 123456});
  CHECK(h5::read_attribute_string(f, "fixed_attr") == "hey");
}

TEST_CASE("read_float reads float16 and float32 datasets whole and by rows", "[h5]") {
  const bool half = GENERATE(true, false);
  const int deflate = GENERATE(0, 4);
  test::TempDir dir;
  const auto path = dir / "floats.h5";
  const int64_t rows = 11, cols = 6;
  std::vector<uint16_t> bits(rows * cols);
  std::vector<float> values(rows * cols);
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = static_cast<uint16_t>((i * 2654435761u) & 0x7bff);
    if (i % 5 == 0) bits[i] |= 0x8000;
    values[i] = half ? static_cast<float>(naive_half(bits[i])) : static_cast<float>(i) * 0.37f - 9.0f;
  }
  {
    h5::File f = h5::create_file(path);
    h5::Datatype f16 = h5::float16_type();
    h5::ChunkedSpec spec;
    spec.dims = {rows, 2, 3};
    spec.max_dims = {-1, 2, 3};
    spec.chunk = {4, 2, 3};
    spec.shuffle = true;
    spec.deflate_level = deflate;
    h5::Dataset ds = h5::create_chunked_dataset(f, "x", half ? f16.id() : H5T_NATIVE_FLOAT, spec);
    REQUIRE(H5Dwrite(ds.id(), half ? f16.id() : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     half ? static_cast<const void*>(bits.data()) : static_cast<const void*>(values.data())) >= 0);
    h5::write_int32(f, "ints", std::vector<int32_t>{1, 2});
  }
  h5::File f = h5::open_file(path);
  h5::Dataset ds = h5::open_dataset(f, "x");
  CHECK(h5::dims(ds) == std::vector<int64_t>{rows, 2, 3});
  CHECK(h5::row_elements(ds) == cols);
  CHECK(h5::read_float(ds) == values);
  const auto [begin, count] = GENERATE(table<int64_t, int64_t>({{0, 1}, {3, 5}, {10, 1}, {0, 11}, {7, 0}}));
  const std::vector<float> part = h5::read_float(ds, begin, count);
  CHECK(part == std::vector<float>(values.begin() + begin * cols, values.begin() + (begin + count) * cols));
  CHECK_THROWS_AS(h5::read_float(ds, 8, 4), InvalidArgument);
  CHECK_THROWS_AS(h5::read_float(ds, -1, 1), InvalidArgument);
  h5::Dataset ints = h5::open_dataset(f, "ints");
  CHECK_THROWS_AS(h5::read_float(ints), FormatError);
}

TEST_CASE("chunked datasets carry the requested filters", "[h5]") {
  const bool shuffle = GENERATE(true, false);
  const int level = GENERATE(0, 1, 9);
  test::TempDir dir;
  h5::File f = h5::create_file(dir / "filters.h5");
  h5::ChunkedSpec spec;
  spec.dims = {0, 8};
  spec.max_dims = {-1, 8};
  spec.chunk = {3, 8};
  spec.shuffle = shuffle;
  spec.deflate_level = level;
  h5::Dataset ds = h5::create_chunked_dataset(f, "x", H5T_NATIVE_FLOAT, spec);
  h5::PropList dcpl(H5Dget_create_plist(ds.id()), "dcpl");
  std::vector<H5Z_filter_t> filters;
  for (int i = 0; i < H5Pget_nfilters(dcpl.id()); ++i) {
    unsigned flags = 0, cd[4] = {0};
    size_t ncd = 4;
    filters.push_back(H5Pget_filter2(dcpl.id(), static_cast<unsigned>(i), &flags, &ncd, cd, 0, nullptr, nullptr));
    if (filters.back() == H5Z_FILTER_DEFLATE) CHECK(cd[0] == static_cast<unsigned>(level));
  }
  std::vector<H5Z_filter_t> expected;
  if (level > 0 && shuffle) expected.push_back(H5Z_FILTER_SHUFFLE);
  if (level > 0) expected.push_back(H5Z_FILTER_DEFLATE);
  CHECK(filters == expected);
  hsize_t chunk[2] = {0, 0};
  CHECK(H5Pget_chunk(dcpl.id(), 2, chunk) == 2);
  CHECK(chunk[0] == 3);
  CHECK(chunk[1] == 8);
  h5::set_extent(ds, {5, 8});
  CHECK(h5::dims(ds) == std::vector<int64_t>{5, 8});
  CHECK_THROWS_AS(h5::set_extent(ds, {5, 9}), IoError);
}

TEST_CASE("a dataset whose data is stored in external files is refused, naming it, before anything is read",
          "[h5][untrusted]") {
  test::TempDir d;
  const fs::path secret = d / "secret.txt";
  std::ofstream(secret) << "root:x:0:0:root:/root:/bin/bash\n";
  const std::string target = GENERATE(std::string("secret"), std::string("/dev/zero"));
  const std::string external = target == "secret" ? secret.string() : target;
  CAPTURE(external);
  const fs::path file = d / "split.h5";
  {
    h5::File f = h5::create_file(file);
    const hsize_t n = 8;
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    REQUIRE(H5Pset_external(dcpl, external.c_str(), 0, static_cast<hsize_t>(n)) >= 0);
    const hid_t ds = H5Dcreate2(f.id(), "label", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  const h5::File f = h5::open_file(file);
  const auto refused = Catch::Contains("/label: its data is stored outside the file (HDF5 external storage, 1 file)");
  CHECK_THROWS_AS(h5::open_dataset(f, "label"), FormatError);
  CHECK_THROWS_WITH(h5::open_dataset(f, "label"), refused);
  CHECK_THROWS_WITH(h5::open_dataset(f, "label", h5::ChunkCache{}), refused);
  CHECK_THROWS_WITH(h5::read_int32(f, "label"), refused);
}

TEST_CASE("a virtual dataset that names itself is a FormatError, not a recursion without end", "[h5][untrusted]") {
  test::TempDir d;
  const fs::path file = d / "loop.h5";
  {
    h5::File f = h5::create_file(file);
    h5::create_virtual_dataset(f, "mel", H5T_NATIVE_FLOAT, {4}, {{"loop.h5", "/mel", 0, 4}}, 0.0);
  }
  const h5::File f = h5::open_file(file);
  CHECK_THROWS_AS(h5::open_dataset(f, "mel"), FormatError);
  CHECK_THROWS_WITH(h5::open_dataset(f, "mel"), Catch::Contains("loop.h5:/mel") && Catch::Contains("more than 4 deep"));
  CHECK_THROWS_WITH(h5::open_dataset(f, "mel", h5::ChunkCache{}), Catch::Contains("more than 4 deep"));
}

TEST_CASE("virtual sources must lie inside the folder of the file opened", "[h5][untrusted]") {
  test::TempDir d;
  fs::create_directories(d / "data" / "sub");
  for (const fs::path& p : {d / "outside.h5", d / "data" / "sub" / "inside.h5", d / "data" / "beside.h5"}) {
    h5::File f = h5::create_file(p);
    h5::write_float32(f, "mel", std::vector<float>{1, 2, 3, 4});
  }
  struct Case {
    std::string stored;
    bool inside;
  };
  const std::vector<Case> cases = {{"sub/inside.h5", true},
                                   {"beside.h5", true},
                                   {"./sub/../beside.h5", true},
                                   {"../outside.h5", false},
                                   {"sub/../../outside.h5", false},
                                   {(d / "outside.h5").string(), false},
                                   {(d / "data" / "beside.h5").string(), true},
                                   {"sub/%%inside.h5", false}};
  const Case c = cases[GENERATE(range(std::size_t{0}, std::size_t{8}))];
  CAPTURE(c.stored);
  const fs::path file = d / "data" / "vds.h5";
  {
    h5::File f = h5::create_file(file);
    h5::create_virtual_dataset(f, "mel", H5T_NATIVE_FLOAT, {4}, {{c.stored, "/mel", 0, 4}}, 0.0);
  }
  const h5::File f = h5::open_file(file);
  if (c.inside) {
    CHECK(h5::read_float(h5::open_dataset(f, "mel")) == std::vector<float>{1, 2, 3, 4});
  } else {
    CHECK_THROWS_AS(h5::open_dataset(f, "mel"), FormatError);
    CHECK_THROWS_WITH(h5::open_dataset(f, "mel"), Catch::Contains("vds.h5:/mel: its virtual source file"));
  }
}

TEST_CASE("strings, chunks and unstored data are bounded before reading", "[h5][untrusted]") {
  test::TempDir d;
  const fs::path file = d / "x.h5";
  {
    h5::File f = h5::create_file(file);
    h5::write_strings(f, "ok", {std::string(h5::kMaxStringBytes, 'a')});
    h5::write_strings(f, "long", {std::string(h5::kMaxStringBytes + 1, 'a')});
    h5::ChunkedSpec big;
    big.dims = {4};
    big.max_dims = {-1};
    big.chunk = {static_cast<int64_t>(h5::kMaxChunkBytes / 4 + 1)};
    h5::create_chunked_dataset(f, "big_chunk", H5T_NATIVE_FLOAT, big);
    h5::ChunkedSpec claim;
    claim.dims = {static_cast<int64_t>(h5::kMaxUnstoredBytes / 4 + 1)};
    claim.chunk = {1024};
    h5::create_chunked_dataset(f, "claim", H5T_NATIVE_FLOAT, claim);
    claim.dims = {static_cast<int64_t>(h5::kMaxUnstoredBytes / 4)};
    h5::create_chunked_dataset(f, "small_claim", H5T_NATIVE_FLOAT, claim);
  }
  const h5::File f = h5::open_file(file);
  CHECK(h5::read_strings(f, "ok")[0].size() == h5::kMaxStringBytes);
  CHECK_THROWS_WITH(h5::read_strings(f, "long"), Catch::Contains("x.h5:/long") && Catch::Contains("64 KiB"));
  CHECK_THROWS_WITH(h5::open_dataset(f, "big_chunk"), Catch::Contains("x.h5:/big_chunk: its chunks hold 512 MiB"));
  CHECK_THROWS_WITH(h5::open_dataset(f, "claim"), Catch::Contains("x.h5:/claim: declares 1 MiB"));
  CHECK(h5::dims(h5::open_dataset(f, "small_claim")) == std::vector<int64_t>{int64_t{1} << 18});
}

TEST_CASE("failures throw IoError with the path and HDF5's message, and print nothing", "[h5]") {
  test::TempDir dir;
  const auto missing = dir / "no_such_dir" / "x.h5";
  std::string message;
  const std::string printed = capture_stderr([&] {
    try {
      h5::create_file(missing);
    } catch (const IoError& e) {
      message = e.what();
    }
  });
  CHECK(printed.empty());
  CHECK_THAT(message, Catch::Contains(missing.string()) && Catch::Contains("H5Fcreate"));

  CHECK_THROWS_AS(h5::open_file(dir / "absent.h5"), IoError);
  test::write_text(dir / "not_hdf5.h5", "this is not an HDF5 file");
  CHECK_THROWS_AS(h5::open_file(dir / "not_hdf5.h5"), IoError);
  {
    h5::File f = h5::create_file(dir / "ok.h5");
    h5::write_int32(f, "a", std::vector<int32_t>{1});
    CHECK_THROWS_AS(h5::write_int32(f, "a", std::vector<int32_t>{2}), IoError);
    CHECK_THROWS_AS(h5::open_dataset(f, "b"), FormatError);
    CHECK_THROWS_AS(h5::open_group(f, "g"), FormatError);
    try {
      h5::write_strings(f, "a", {"x"});
      FAIL("no exception");
    } catch (const IoError& e) {
      CHECK_THAT(e.what(), Catch::Contains((dir / "ok.h5").string() + ":/a"));
    }
  }
  h5::File ro = h5::open_file(dir / "ok.h5");
  CHECK_THROWS_AS(h5::write_attribute_int64(ro, "x", 1), IoError);
  CHECK(h5::error_stack().empty());
}

}  // namespace melforge_test_h5
