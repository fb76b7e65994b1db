#include "melforge/common/h5.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace melforge::h5 {

namespace {

struct StackRecord {
  std::string func;
  std::string desc;
};

herr_t collect_record(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* records = static_cast<std::vector<StackRecord>*>(data);
  StackRecord record;
  record.func = err->func_name ? err->func_name : "";
  record.desc = err->desc ? err->desc : "";
  std::erase(record.desc, '\n');
  if (record.desc.empty()) {
    char buf[256] = {0};
    if (H5Eget_msg(err->min_num, nullptr, buf, sizeof buf) > 0) record.desc = buf;
  }
  records->push_back(std::move(record));
  return 0;
}

std::string format_record(const StackRecord& r) {
  return r.func.empty() ? r.desc : r.func + "(): " + r.desc;
}

[[noreturn]] void throw_format(const std::string& what) { throw FormatError(what); }

/// `bytes` in whole MiB as text, for sizes a file declares (up to 2^64 elements of 2^32 bytes: no integer cast).
std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", std::floor(bytes / (1 << 20)));
  return buf;
}

hid_t check_id(hid_t id, const std::string& what) {
  if (id < 0) throw_io(what);
  return id;
}

void check(herr_t status, const std::string& what) {
  if (status < 0) throw_io(what);
}

std::vector<hsize_t> to_hsize(const std::vector<int64_t>& v, const std::string& what) {
  std::vector<hsize_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0) throw InvalidArgument(what + ": negative size " + std::to_string(v[i]));
    out[i] = static_cast<hsize_t>(v[i]);
  }
  return out;
}

PropList dataset_creation_plist(const std::string& name) {
  PropList dcpl(check_id(H5Pcreate(H5P_DATASET_CREATE), name + ": cannot create a property list"), name);
  check(H5Pset_obj_track_times(dcpl.id(), false), name + ": cannot turn off time tracking");
  return dcpl;
}

Dataspace simple_space(const std::vector<hsize_t>& dims, const hsize_t* max_dims, const std::string& name) {
  return Dataspace(check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims),
                            name + ": cannot create a dataspace"),
                   name);
}

Dataspace scalar_space(const std::string& name) {
  return Dataspace(check_id(H5Screate(H5S_SCALAR), name + ": cannot create a dataspace"), name);
}

std::string attribute_name(Ref object, const std::string& name) { return object.name + " attribute '" + name + "'"; }

Attribute create_attribute(Ref object, const std::string& name, hid_t type) {
  const std::string what = attribute_name(object, name);
  silence_errors();
  const htri_t found = H5Aexists(object.id, name.c_str());
  check(found, what + ": cannot check whether it exists");
  if (found > 0) check(H5Adelete(object.id, name.c_str()), what + ": cannot replace it");
  Dataspace space = scalar_space(what);
  return Attribute(check_id(H5Acreate2(object.id, name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                            what + ": cannot create"),
                   what);
}

Attribute open_attribute(Ref object, const std::string& name) {
  const std::string what = attribute_name(object, name);
  if (!has_attribute(object, name)) throw_format(what + ": missing");
  Attribute attr(check_id(H5Aopen(object.id, name.c_str(), H5P_DEFAULT), what + ": cannot open"), what);
  Dataspace space(check_id(H5Aget_space(attr.id()), what + ": cannot get its dataspace"), what);
  const int rank = H5Sget_simple_extent_ndims(space.id());
  check(rank, what + ": cannot get its rank");
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  if (n != 1) throw_format(what + ": expected a scalar, found " + std::to_string(n) + " elements");
  return attr;
}

Datatype attribute_type(const Attribute& attr) {
  return Datatype(check_id(H5Aget_type(attr.id()), attr.name() + ": cannot get its type"), attr.name());
}

H5T_class_t type_class(const Datatype& type) {
  const H5T_class_t c = H5Tget_class(type.id());
  if (c == H5T_NO_CLASS) throw_io(type.name() + ": cannot get its type class");
  return c;
}

/// Memory type for reading strings of file type `file_type`: variable-length char* or fixed-size bytes.
Datatype string_memory_type(const Datatype& file_type, bool variable) {
  const std::string& what = file_type.name();
  if (!variable) return Datatype(check_id(H5Tcopy(file_type.id()), what + ": cannot copy its type"), what);
  Datatype mem(check_id(H5Tcopy(H5T_C_S1), what + ": cannot copy H5T_C_S1"), what);
  check(H5Tset_size(mem.id(), H5T_VARIABLE), what + ": cannot make a variable-length string type");
  const H5T_cset_t cset = H5Tget_cset(file_type.id());
  if (cset < 0) throw_io(what + ": cannot get its character set");
  check(H5Tset_cset(mem.id(), cset), what + ": cannot set the character set");
  return mem;
}

std::string fixed_string(const char* data, size_t size, H5T_str_t pad) {
  size_t len = 0;
  while (len < size && data[len] != '\0') ++len;
  if (pad == H5T_STR_SPACEPAD) {
    while (len > 0 && data[len - 1] == ' ') --len;
  }
  return std::string(data, len);
}

/// Throws FormatError naming `what` when `n` strings of `each` bytes (fixed-length; 0: not known) or `total` bytes
/// together are beyond kMaxStringBytes / kMaxStringDatasetBytes.
void check_string_bytes(const std::string& what, size_t n, size_t each, double total) {
  if (each > kMaxStringBytes)
    throw_format(what + ": its strings are " + std::to_string(each) + " bytes each, more than the " +
                 std::to_string(kMaxStringBytes >> 10) + " KiB melforge reads in one string");
  if (total > static_cast<double>(kMaxStringDatasetBytes))
    throw_format(what + ": its " + std::to_string(n) + " strings hold " +
                 mib(total) + " MiB, more than the " +
                 std::to_string(kMaxStringDatasetBytes >> 20) + " MiB melforge reads in one string dataset");
}

/// Reads `n` strings of `file_type` through `read(mem_type, buffer)` (H5Dread or H5Aread on the whole object).
/// `vlen_bytes(mem_type)` gives the bytes variable-length strings need (negative: not known); every known size is
/// checked before the strings are read, and each string's length and their total after. (H5Dvlen_get_buf_size would
/// know the sizes first, but it reads element by element: 22 s for 10^6 paths against 0.2 s for H5Dread.)
template <class ReadFn, class SizeFn>
std::vector<std::string> read_string_values(const Datatype& file_type, const Dataspace& space, size_t n,
                                            ReadFn&& read, SizeFn&& vlen_bytes) {
  const std::string& what = file_type.name();
  const htri_t variable = H5Tis_variable_str(file_type.id());
  check(variable, what + ": cannot check for a variable-length string");
  Datatype mem = string_memory_type(file_type, variable > 0);
  std::vector<std::string> out(n);
  if (n == 0) return out;
  if (variable > 0) {
    if (const double total = vlen_bytes(mem.id()); total >= 0) check_string_bytes(what, n, 0, total);
    std::vector<char*> ptrs(n, nullptr);
    check(read(mem.id(), ptrs.data()), what + ": cannot read");
    size_t longest = 0;
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      out[i] = ptrs[i] ? ptrs[i] : "";
      longest = std::max(longest, out[i].size());
      total += static_cast<double>(out[i].size());
    }
    check(H5Dvlen_reclaim(mem.id(), space.id(), H5P_DEFAULT, ptrs.data()), what + ": cannot free the strings");
    check_string_bytes(what, n, longest, total);
    return out;
  }
  const size_t size = H5Tget_size(file_type.id());
  if (size == 0) throw_io(what + ": cannot get its size");
  check_string_bytes(what, n, size, static_cast<double>(n) * static_cast<double>(size));
  const H5T_str_t pad = H5Tget_strpad(file_type.id());
  std::vector<char> buf(n * size);
  check(read(mem.id(), buf.data()), what + ": cannot read");
  for (size_t i = 0; i < n; ++i) out[i] = fixed_string(buf.data() + i * size, size, pad);
  return out;
}

/// The creation property list of `dataset`.
PropList creation_plist(const Dataset& dataset) {
  silence_errors();
  return PropList(check_id(H5Dget_create_plist(dataset.id()), dataset.name() + ": cannot get its creation properties"),
                  dataset.name());
}

/// The storage layout recorded in the creation property list `dcpl` (contiguous, chunked, virtual, ...).
H5D_layout_t layout_of(const PropList& dcpl) {
  const H5D_layout_t layout = H5Pget_layout(dcpl.id());
  if (layout < 0) throw_io(dcpl.name() + ": cannot get its layout");
  return layout;
}

/// Opens `name` in `parent` and checks that it is 1-D; returns it and its length.
std::pair<Dataset, size_t> open_1d(Ref parent, const std::string& name) {
  Dataset ds = open_dataset(parent, name);
  const std::vector<int64_t> d = dims(ds);
  if (d.size() != 1) throw_format(ds.name() + ": expected a 1-D dataset, found rank " + std::to_string(d.size()));
  return {std::move(ds), static_cast<size_t>(d[0])};
}

}  // namespace

herr_t close_id(Kind kind, hid_t id) noexcept {
  silence_errors();
  switch (kind) {
    case Kind::file:
      return H5Fclose(id);
    case Kind::group:
      return H5Gclose(id);
    case Kind::dataset:
      return H5Dclose(id);
    case Kind::dataspace:
      return H5Sclose(id);
    case Kind::datatype:
      return H5Tclose(id);
    case Kind::plist:
      return H5Pclose(id);
    case Kind::attribute:
      return H5Aclose(id);
  }
  return -1;
}

void close_id_checked(Kind kind, hid_t id, const std::string& name) {
  if (close_id(kind, id) < 0) throw_io(name + ": cannot close");
}

std::string child_name(Ref parent, const std::string& child) {
  return parent.kind == Kind::file ? parent.name + ":/" + child : parent.name + "/" + child;
}

void silence_errors() noexcept {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

std::string error_stack() {
  silence_errors();
  std::vector<StackRecord> records;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_record, &records);
  H5Eclear2(H5E_DEFAULT);
  if (records.empty()) return {};
  std::string out = format_record(records.front());
  if (records.size() > 1) out += "; ... " + format_record(records.back());
  return out;
}

void throw_io(const std::string& what) {
  const std::string stack = error_stack();
  throw IoError(stack.empty() ? what : what + ": " + stack);
}

File create_file(const std::filesystem::path& path) {
  silence_errors();
  const std::string name = path.string();
  return File(check_id(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                       name + ": cannot create HDF5 file"),
              name);
}

File open_file(const std::filesystem::path& path, bool writable) {
  silence_errors();
  const std::string name = path.string();
  return File(check_id(H5Fopen(name.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT),
                       name + ": cannot open HDF5 file"),
              name);
}

Group create_group(Ref parent, const std::string& name) {
  silence_errors();
  const std::string what = child_name(parent, name);
  return Group(check_id(H5Gcreate2(parent.id, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                        what + ": cannot create group"),
               what);
}

Group open_group(Ref parent, const std::string& name) {
  const std::string what = child_name(parent, name);
  if (!exists(parent, name)) throw_format(what + ": no such group");
  return Group(check_id(H5Gopen2(parent.id, name.c_str(), H5P_DEFAULT), what + ": cannot open group"), what);
}

bool exists(Ref parent, const std::string& name) {
  silence_errors();
  const htri_t found = H5Lexists(parent.id, name.c_str(), H5P_DEFAULT);
  check(found, child_name(parent, name) + ": cannot check whether it exists");
  return found > 0;
}

Datatype float16_type() {
  silence_errors();
  const std::string what = "float16 type";
  Datatype t(check_id(H5Tcopy(H5T_IEEE_F32LE), what + ": cannot copy H5T_IEEE_F32LE"), what);
  check(H5Tset_fields(t.id(), 15, 10, 5, 0, 10), what + ": cannot set fields");
  check(H5Tset_size(t.id(), 2), what + ": cannot set size");
  check(H5Tset_ebias(t.id(), 15), what + ": cannot set exponent bias");
  return t;
}

Datatype utf8_string_type() {
  silence_errors();
  const std::string what = "UTF-8 string type";
  Datatype t(check_id(H5Tcopy(H5T_C_S1), what + ": cannot copy H5T_C_S1"), what);
  check(H5Tset_size(t.id(), H5T_VARIABLE), what + ": cannot set variable size");
  check(H5Tset_cset(t.id(), H5T_CSET_UTF8), what + ": cannot set UTF-8");
  check(H5Tset_strpad(t.id(), H5T_STR_NULLTERM), what + ": cannot set null termination");
  return t;
}

Datatype dataset_type(const Dataset& dataset) {
  silence_errors();
  return Datatype(check_id(H5Dget_type(dataset.id()), dataset.name() + ": cannot get its type"), dataset.name());
}

Dataspace dataset_space(const Dataset& dataset) {
  silence_errors();
  return Dataspace(check_id(H5Dget_space(dataset.id()), dataset.name() + ": cannot get its dataspace"),
                   dataset.name());
}

Dataset create_chunked_dataset(Ref parent, const std::string& name, hid_t type, const ChunkedSpec& spec) {
  silence_errors();
  const std::string what = child_name(parent, name);
  const size_t rank = spec.dims.size();
  if (rank == 0 || spec.chunk.size() != rank || (!spec.max_dims.empty() && spec.max_dims.size() != rank)) {
    throw InvalidArgument(what + ": dims, max_dims and chunk must have the same non-zero rank");
  }
  if (spec.deflate_level < 0 || spec.deflate_level > 9) {
    throw InvalidArgument(what + ": deflate level must be 0..9, got " + std::to_string(spec.deflate_level));
  }
  const std::vector<hsize_t> dims_h = to_hsize(spec.dims, what);
  std::vector<hsize_t> max_h(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t m = spec.max_dims.empty() ? spec.dims[i] : spec.max_dims[i];
    max_h[i] = m < 0 ? H5S_UNLIMITED : static_cast<hsize_t>(m);
  }
  std::vector<hsize_t> chunk_h(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (spec.chunk[i] < 1) throw InvalidArgument(what + ": chunk sizes must be >= 1");
    chunk_h[i] = static_cast<hsize_t>(spec.chunk[i]);
  }
  Dataspace space = simple_space(dims_h, max_h.data(), what);
  PropList dcpl = dataset_creation_plist(what);
  check(H5Pset_chunk(dcpl.id(), static_cast<int>(rank), chunk_h.data()), what + ": cannot set the chunk shape");
  if (spec.deflate_level > 0) {
    if (spec.shuffle) check(H5Pset_shuffle(dcpl.id()), what + ": cannot add the shuffle filter");
    check(H5Pset_deflate(dcpl.id(), static_cast<unsigned>(spec.deflate_level)),
          what + ": cannot add the deflate filter");
  }
  return Dataset(check_id(H5Dcreate2(parent.id, name.c_str(), type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                          what + ": cannot create dataset"),
                 what);
}

namespace {

/// Throws FormatError naming `dataset` when its raw data lives in external files.
void refuse_external_storage(const Dataset& dataset, const PropList& dcpl) {
  const int external = H5Pget_external_count(dcpl.id());
  if (external < 0) throw_io(dataset.name() + ": cannot read its storage properties");
  if (external > 0)
    throw_format(dataset.name() + ": its data is stored outside the file (HDF5 external storage, " +
                 std::to_string(external) + " file" + (external == 1 ? "" : "s") +
                 "); melforge reads only data stored inside the files it is given");
}

/// Throws FormatError naming `dataset` when one chunk holds more than kMaxChunkBytes.
void refuse_big_chunks(const Dataset& dataset, const PropList& dcpl) {
  const int rank = H5Pget_chunk(dcpl.id(), 0, nullptr);
  check(rank, dataset.name() + ": cannot get its chunk rank");
  std::vector<hsize_t> c(static_cast<size_t>(rank));
  check(H5Pget_chunk(dcpl.id(), rank, c.data()), dataset.name() + ": cannot get its chunk shape");
  double bytes = static_cast<double>(H5Tget_size(dataset_type(dataset).id()));
  for (const hsize_t d : c) bytes *= static_cast<double>(d);
  if (bytes > static_cast<double>(kMaxChunkBytes))
    throw_format(dataset.name() + ": its chunks hold " + mib(bytes) +
                 " MiB each, more than the " + std::to_string(kMaxChunkBytes >> 20) +
                 " MiB melforge reads in one chunk (melforge-build writes at most " +
                 std::to_string(kMaxWrittenChunkBytes >> 20) + " MiB)");
}

/// Throws FormatError naming `dataset` when more than kMaxUnstoredBytes of what it declares are not stored, so that
/// reading it would give fill values the file does not hold: contiguous storage that is not allocated, or chunks of
/// the extent that were never written (H5Dget_num_chunks; counted, not sized, so that compression does not count).
void refuse_unstored(const Dataset& dataset, const PropList& dcpl, H5D_layout_t layout) {
  const Dataspace space = dataset_space(dataset);
  const int rank = H5Sget_simple_extent_ndims(space.id());
  check(rank, dataset.name() + ": cannot get its rank");
  std::vector<hsize_t> d(static_cast<size_t>(rank));
  if (rank > 0) check(H5Sget_simple_extent_dims(space.id(), d.data(), nullptr), dataset.name() + ": cannot get dims");
  const double element = static_cast<double>(H5Tget_size(dataset_type(dataset).id()));
  double declared = element;
  for (const hsize_t x : d) declared *= static_cast<double>(x);
  if (declared <= static_cast<double>(kMaxUnstoredBytes)) return;
  double missing = 0;
  if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> c(static_cast<size_t>(rank));
    check(H5Pget_chunk(dcpl.id(), rank, c.data()), dataset.name() + ": cannot get its chunk shape");
    double chunks = 1, chunk_bytes = element;
    for (int i = 0; i < rank; ++i) {
      chunks *= std::ceil(static_cast<double>(d[i]) / static_cast<double>(std::max<hsize_t>(c[i], 1)));
      chunk_bytes *= static_cast<double>(c[i]);
    }
    hsize_t stored = 0;
    check(H5Dget_num_chunks(dataset.id(), space.id(), &stored), dataset.name() + ": cannot count its chunks");
    missing = std::max(0.0, chunks - static_cast<double>(stored)) * chunk_bytes;
  } else if (layout == H5D_CONTIGUOUS) {
    H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
    check(H5Dget_space_status(dataset.id(), &status), dataset.name() + ": cannot get its storage status");
    if (status != H5D_SPACE_STATUS_ALLOCATED) missing = declared;
  }
  if (missing <= static_cast<double>(kMaxUnstoredBytes)) return;
  throw_format(dataset.name() + ": declares " + mib(declared) +
               " MiB of data but " + mib(missing) +
               " MiB of it are not stored in the file (storage not allocated, " +
               std::to_string(H5Dget_storage_size(dataset.id())) +
               " bytes stored); melforge reads only data a file holds");
}

/// Checks `dataset` as open_dataset documents, following at most `depth` more virtual datasets.
void check_dataset(const Dataset& dataset, int depth) {
  const PropList dcpl = creation_plist(dataset);
  refuse_external_storage(dataset, dcpl);
  const H5D_layout_t layout = layout_of(dcpl);
  if (layout == H5D_VIRTUAL) {
    check_virtual_layout(dataset, depth);
    return;
  }
  if (layout == H5D_CHUNKED) refuse_big_chunks(dataset, dcpl);
  refuse_unstored(dataset, dcpl, layout);
}

/// Opens `name` in `parent` with the access properties `dapl` and checks it (check_dataset).
Dataset open_checked(Ref parent, const std::string& name, hid_t dapl, int depth) {
  const std::string what = child_name(parent, name.starts_with('/') ? name.substr(1) : name);
  if (!exists(parent, name)) throw_format(what + ": no such dataset");
  Dataset dataset(check_id(H5Dopen2(parent.id, name.c_str(), dapl), what + ": cannot open dataset"), what);
  check_dataset(dataset, depth);
  return dataset;
}

/// The name of the file that holds the object `id`.
std::string file_name(hid_t id, const std::string& what) {
  const ssize_t len = H5Fget_name(id, nullptr, 0);
  if (len < 0) throw_io(what + ": cannot get its file name");
  std::string out(static_cast<size_t>(len) + 1, '\0');
  if (H5Fget_name(id, out.data(), out.size()) < 0) throw_io(what + ": cannot get its file name");
  out.resize(static_cast<size_t>(len));
  return out;
}

}  // namespace

Dataset open_dataset(Ref parent, const std::string& name) {
  return open_checked(parent, name, H5P_DEFAULT, kMaxVirtualDepth);
}

ChunkCache ChunkCache::sized(size_t bytes, size_t chunk_bytes) {
  const auto is_prime = [](size_t n) {
    if (n < 2) return false;
    for (size_t d = 2; d * d <= n; ++d)
      if (n % d == 0) return false;
    return true;
  };
  size_t slots = std::max<size_t>(521, 100 * (bytes / std::max<size_t>(chunk_bytes, 1)));
  while (!is_prime(slots)) ++slots;
  return {bytes, slots, 1.0};
}

Dataset open_dataset(Ref parent, const std::string& name, const ChunkCache& cache) {
  const std::string what = child_name(parent, name);
  silence_errors();
  PropList dapl(check_id(H5Pcreate(H5P_DATASET_ACCESS), what + ": cannot create an access property list"), what);
  check(H5Pset_chunk_cache(dapl.id(), cache.slots, cache.bytes, cache.w0), what + ": cannot set the chunk cache");
  return open_checked(parent, name, dapl.id(), kMaxVirtualDepth);
}

bool is_inside(const std::filesystem::path& path, const std::filesystem::path& folder) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) return false;
  const std::filesystem::path f = std::filesystem::weakly_canonical(std::filesystem::absolute(folder, ec), ec);
  if (ec) return false;
  auto pi = p.begin();
  for (auto fi = f.begin(); fi != f.end(); ++fi, ++pi) {
    if (fi->empty() && std::next(fi) == f.end()) break;
    if (pi == p.end() || *pi != *fi) return false;
  }
  return true;
}

void check_virtual_layout(const Dataset& dataset, int depth) {
  const std::vector<VirtualSource> sources = virtual_sources(dataset);
  if (sources.empty()) return;
  if (depth <= 0)
    throw_format(dataset.name() + ": its virtual sources lead to virtual datasets more than " +
                 std::to_string(kMaxVirtualDepth) + " deep (a dataset that names itself, or two that name each "
                 "other?)");
  const std::filesystem::path own = file_name(dataset.id(), dataset.name());
  const std::filesystem::path folder = std::filesystem::absolute(own).parent_path();
  std::vector<std::pair<std::string, std::string>> seen;
  for (const VirtualSource& s : sources) {
    const std::string shown = "'" + utf8::for_terminal(s.stored_file) + "'";
    const std::string where = dataset.name() + ": its virtual source file " + shown;
    if (s.stored_file.find('%') != std::string::npos)
      throw_format(where + " uses HDF5's '%' name patterns, which melforge does not follow");
    if (!is_inside(s.file, folder))
      throw_format(where + " (" + utf8::for_terminal(s.file.string()) + ") is outside the dataset's folder " +
                   folder.string() + "; melforge reads only files inside the folder of the file it is given");
    std::pair<std::string, std::string> key{std::filesystem::weakly_canonical(std::filesystem::absolute(s.file)),
                                            s.dataset};
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(s.file, ec))
      throw IoError(where + " (" + utf8::for_terminal(s.file.string()) +
                    ") is missing or not a regular file; a merged dataset keeps its sources in its own sources/ "
                    "folder, where `melforge-build merge` put them");
    const File file = open_file(s.file);
    open_checked(file, s.dataset, H5P_DEFAULT, depth - 1);
  }
}

namespace {

/// chunk_dims, following at most `depth` more virtual datasets.
std::vector<int64_t> chunk_dims_within(const Dataset& dataset, int depth) {
  const PropList dcpl = creation_plist(dataset);
  const H5D_layout_t layout = layout_of(dcpl);
  if (layout == H5D_VIRTUAL) {
    const std::vector<VirtualSource> sources = virtual_sources(dataset);
    if (sources.empty()) return {};
    if (depth == 0)
      throw_format(dataset.name() + ": its virtual sources lead to virtual datasets more than 4 deep (a dataset "
                   "that names itself, or two that name each other?)");
    const File file = open_file(sources.front().file);
    return chunk_dims_within(open_checked(file, sources.front().dataset, H5P_DEFAULT, depth - 1), depth - 1);
  }
  if (layout != H5D_CHUNKED) return {};
  const int rank = H5Pget_chunk(dcpl.id(), 0, nullptr);
  check(rank, dataset.name() + ": cannot get its chunk rank");
  std::vector<hsize_t> c(static_cast<size_t>(rank));
  check(H5Pget_chunk(dcpl.id(), rank, c.data()), dataset.name() + ": cannot get its chunk shape");
  return std::vector<int64_t>(c.begin(), c.end());
}

}  // namespace

std::vector<int64_t> chunk_dims(const Dataset& dataset) { return chunk_dims_within(dataset, kMaxVirtualDepth); }

std::vector<int64_t> dims(const Dataset& dataset) {
  Dataspace space = dataset_space(dataset);
  const int rank = H5Sget_simple_extent_ndims(space.id());
  check(rank, dataset.name() + ": cannot get its rank");
  std::vector<hsize_t> d(static_cast<size_t>(rank));
  if (rank > 0) check(H5Sget_simple_extent_dims(space.id(), d.data(), nullptr), dataset.name() + ": cannot get dims");
  return std::vector<int64_t>(d.begin(), d.end());
}

void set_extent(const Dataset& dataset, const std::vector<int64_t>& new_dims) {
  silence_errors();
  const std::vector<hsize_t> d = to_hsize(new_dims, dataset.name());
  check(H5Dset_extent(dataset.id(), d.data()), dataset.name() + ": cannot set the extent");
}

void write_chunk(const Dataset& dataset, const std::vector<int64_t>& offset, const void* data, size_t bytes,
                 uint32_t filter_mask) {
  silence_errors();
  const std::vector<hsize_t> off = to_hsize(offset, dataset.name());
  std::string where;
  for (size_t i = 0; i < off.size(); ++i) {
    if (i > 0) where += ',';
    where += std::to_string(off[i]);
  }
  check(H5Dwrite_chunk(dataset.id(), H5P_DEFAULT, filter_mask, off.data(), bytes, data),
        dataset.name() + ": cannot write the chunk at [" + where + "]");
}

void write_attribute_int64(Ref object, const std::string& name, int64_t value) {
  Attribute attr = create_attribute(object, name, H5T_NATIVE_INT64);
  check(H5Awrite(attr.id(), H5T_NATIVE_INT64, &value), attr.name() + ": cannot write");
  attr.close();
}

void write_attribute_double(Ref object, const std::string& name, double value) {
  Attribute attr = create_attribute(object, name, H5T_NATIVE_DOUBLE);
  check(H5Awrite(attr.id(), H5T_NATIVE_DOUBLE, &value), attr.name() + ": cannot write");
  attr.close();
}

void write_attribute_string(Ref object, const std::string& name, const std::string& value) {
  Datatype type = utf8_string_type();
  Attribute attr = create_attribute(object, name, type.id());
  const char* ptr = value.c_str();
  check(H5Awrite(attr.id(), type.id(), &ptr), attr.name() + ": cannot write");
  attr.close();
}

bool has_attribute(Ref object, const std::string& name) {
  silence_errors();
  const htri_t found = H5Aexists(object.id, name.c_str());
  check(found, attribute_name(object, name) + ": cannot check whether it exists");
  return found > 0;
}

int64_t read_attribute_int64(Ref object, const std::string& name) {
  Attribute attr = open_attribute(object, name);
  Datatype type = attribute_type(attr);
  if (type_class(type) != H5T_INTEGER) throw_format(attr.name() + ": expected an integer");
  int64_t value = 0;
  check(H5Aread(attr.id(), H5T_NATIVE_INT64, &value), attr.name() + ": cannot read");
  return value;
}

double read_attribute_double(Ref object, const std::string& name) {
  Attribute attr = open_attribute(object, name);
  Datatype type = attribute_type(attr);
  const H5T_class_t c = type_class(type);
  if (c != H5T_FLOAT && c != H5T_INTEGER) throw_format(attr.name() + ": expected a number");
  double value = 0;
  check(H5Aread(attr.id(), H5T_NATIVE_DOUBLE, &value), attr.name() + ": cannot read");
  return value;
}

std::string read_attribute_string(Ref object, const std::string& name) {
  Attribute attr = open_attribute(object, name);
  Datatype type = attribute_type(attr);
  if (type_class(type) != H5T_STRING) throw_format(attr.name() + ": expected a string");
  Dataspace space(check_id(H5Aget_space(attr.id()), attr.name() + ": cannot get its dataspace"), attr.name());
  return read_string_values(
      type, space, 1, [&](hid_t mem, void* buf) { return H5Aread(attr.id(), mem, buf); },
      [](hid_t) { return -1.0; })[0];
}

namespace {

/// Writes `count` elements of the predefined type `type` at `data` as a new contiguous 1-D dataset `name`.
void write_1d(Ref parent, const std::string& name, hid_t type, std::size_t count, const void* data) {
  silence_errors();
  const std::string what = child_name(parent, name);
  Dataspace space = simple_space({static_cast<hsize_t>(count)}, nullptr, what);
  PropList dcpl = dataset_creation_plist(what);
  Dataset ds(check_id(H5Dcreate2(parent.id, name.c_str(), type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                      what + ": cannot create dataset"),
             what);
  if (count > 0) check(H5Dwrite(ds.id(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), what + ": cannot write");
  ds.close();
}

}  // namespace

void write_int32(Ref parent, const std::string& name, std::span<const int32_t> values) {
  write_1d(parent, name, H5T_NATIVE_INT32, values.size(), values.data());
}

void write_float32(Ref parent, const std::string& name, std::span<const float> values) {
  write_1d(parent, name, H5T_NATIVE_FLOAT, values.size(), values.data());
}

std::vector<int32_t> read_int32(Ref parent, const std::string& name) {
  auto [ds, n] = open_1d(parent, name);
  Datatype type = dataset_type(ds);
  if (type_class(type) != H5T_INTEGER) throw_format(ds.name() + ": expected integers");
  std::vector<int32_t> out(n);
  if (n > 0) {
    check(H5Dread(ds.id(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), ds.name() + ": cannot read");
  }
  return out;
}

void write_uint8_matrix(Ref parent, const std::string& name, int64_t rows, int64_t cols,
                        std::span<const uint8_t> values) {
  silence_errors();
  const std::string what = child_name(parent, name);
  if (rows < 0 || cols < 0 || static_cast<int64_t>(values.size()) != rows * cols)
    throw InvalidArgument(what + ": " + std::to_string(values.size()) + " values for [" + std::to_string(rows) +
                          ", " + std::to_string(cols) + "]");
  Dataspace space = simple_space({static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)}, nullptr, what);
  PropList dcpl = dataset_creation_plist(what);
  Dataset ds(check_id(H5Dcreate2(parent.id, name.c_str(), H5T_STD_U8LE, space.id(), H5P_DEFAULT, dcpl.id(),
                                 H5P_DEFAULT),
                      what + ": cannot create dataset"),
             what);
  if (!values.empty()) {
    check(H5Dwrite(ds.id(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), what + ": cannot write");
  }
  ds.close();
}

std::vector<uint8_t> read_uint8_matrix(Ref parent, const std::string& name, std::vector<int64_t>& dims_out) {
  Dataset ds = open_dataset(parent, name);
  dims_out = dims(ds);
  if (dims_out.size() != 2) throw_format(ds.name() + ": expected a 2-D dataset, found rank " + std::to_string(dims_out.size()));
  Datatype type = dataset_type(ds);
  if (type_class(type) != H5T_INTEGER) throw_format(ds.name() + ": expected integers");
  std::vector<uint8_t> out(static_cast<size_t>(dims_out[0] * dims_out[1]));
  if (!out.empty()) {
    check(H5Dread(ds.id(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), ds.name() + ": cannot read");
  }
  return out;
}

void write_strings(Ref parent, const std::string& name, const std::vector<std::string>& values) {
  silence_errors();
  const std::string what = child_name(parent, name);
  Datatype type = utf8_string_type();
  Dataspace space = simple_space({static_cast<hsize_t>(values.size())}, nullptr, what);
  PropList dcpl = dataset_creation_plist(what);
  Dataset ds(
      check_id(H5Dcreate2(parent.id, name.c_str(), type.id(), space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
               what + ": cannot create dataset"),
      what);
  if (!values.empty()) {
    std::vector<const char*> ptrs(values.size());
    for (size_t i = 0; i < values.size(); ++i) ptrs[i] = values[i].c_str();
    check(H5Dwrite(ds.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), what + ": cannot write");
  }
  ds.close();
}

std::vector<std::string> read_strings(Ref parent, const std::string& name) {
  auto [ds, n] = open_1d(parent, name);
  Datatype type = dataset_type(ds);
  if (type_class(type) != H5T_STRING) throw_format(ds.name() + ": expected strings");
  Dataspace space = dataset_space(ds);
  const auto read = [id = ds.id()](hid_t mem, void* buf) {
    return H5Dread(id, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  };
  return read_string_values(type, space, n, read, [](hid_t) { return -1.0; });
}

int64_t row_elements(const Dataset& dataset) {
  const std::vector<int64_t> d = dims(dataset);
  if (d.empty()) throw_format(dataset.name() + ": expected at least one dimension, found a scalar");
  int64_t n = 1;
  for (size_t i = 1; i < d.size(); ++i) n *= d[i];
  return n;
}

void read_rows(const Dataset& dataset, int64_t begin, int64_t count, hid_t mem_type, void* out) {
  const std::vector<int64_t> d = dims(dataset);
  if (d.empty()) throw_format(dataset.name() + ": expected at least one dimension, found a scalar");
  if (begin < 0 || count < 0 || begin + count > d[0]) {
    throw InvalidArgument(dataset.name() + ": rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                          ") are outside the extent " + std::to_string(d[0]));
  }
  int64_t n = count;
  for (size_t i = 1; i < d.size(); ++i) n *= d[i];
  if (n == 0) return;
  std::vector<hsize_t> start(d.size(), 0), extent(d.begin(), d.end());
  start[0] = static_cast<hsize_t>(begin);
  extent[0] = static_cast<hsize_t>(count);
  Dataspace file_space = dataset_space(dataset);
  check(H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr),
        dataset.name() + ": cannot select rows");
  Dataspace mem_space = simple_space(extent, nullptr, dataset.name());
  check(H5Dread(dataset.id(), mem_type, mem_space.id(), file_space.id(), H5P_DEFAULT, out),
        dataset.name() + ": cannot read");
}

void read_float(const Dataset& dataset, int64_t begin, int64_t count, float* out) {
  const std::vector<int64_t> d = dims(dataset);
  if (d.empty()) throw_format(dataset.name() + ": expected at least one dimension, found a scalar");
  Datatype type = dataset_type(dataset);
  const size_t size = H5Tget_size(type.id());
  if (type_class(type) != H5T_FLOAT || (size != 2 && size != 4)) {
    throw_format(dataset.name() + ": expected float16 or float32 elements, found a " + std::to_string(size) +
                 "-byte " + (type_class(type) == H5T_FLOAT ? "float" : "non-float") + " type");
  }
  int64_t row = 1;
  for (size_t i = 1; i < d.size(); ++i) row *= d[i];
  const int64_t n = count * row;

  Datatype f16 = float16_type();
  const htri_t is_half = H5Tequal(type.id(), f16.id());
  check(is_half, dataset.name() + ": cannot compare types");
  if (is_half == 0) {
    read_rows(dataset, begin, count, H5T_NATIVE_FLOAT, out);
    return;
  }
  auto* bytes = reinterpret_cast<unsigned char*>(out);
  unsigned char* halves = bytes + 2 * n;
  read_rows(dataset, begin, count, f16.id(), halves);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, halves + 2 * i, sizeof h);
    const float f = half_to_float(h);
    std::memcpy(bytes + 4 * i, &f, sizeof f);
  }
}

std::vector<float> read_float(const Dataset& dataset, int64_t begin, int64_t count) {
  const int64_t row = row_elements(dataset);
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(count, 0) * row));
  read_float(dataset, begin, count, out.data());
  return out;
}

std::vector<float> read_float(const Dataset& dataset) {
  const std::vector<int64_t> d = dims(dataset);
  if (d.empty()) throw_format(dataset.name() + ": expected at least one dimension, found a scalar");
  return read_float(dataset, 0, d[0]);
}

Filters filters(const Dataset& dataset) {
  const PropList dcpl = creation_plist(dataset);
  Filters out;
  const int n = H5Pget_nfilters(dcpl.id());
  check(n, dataset.name() + ": cannot count its filters");
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0;
    size_t nvalues = 4;
    unsigned values[4] = {0, 0, 0, 0};
    unsigned config = 0;
    const H5Z_filter_t id = H5Pget_filter2(dcpl.id(), static_cast<unsigned>(i), &flags, &nvalues, values, 0, nullptr,
                                           &config);
    if (id < 0) throw_io(dataset.name() + ": cannot get filter " + std::to_string(i));
    if (id == H5Z_FILTER_SHUFFLE) out.shuffle = true;
    if (id == H5Z_FILTER_DEFLATE) out.deflate_level = nvalues > 0 ? static_cast<int>(values[0]) : 0;
  }
  return out;
}

bool is_virtual(const Dataset& dataset) {
  const PropList dcpl = creation_plist(dataset);
  const H5D_layout_t layout = layout_of(dcpl);
  return layout == H5D_VIRTUAL;
}

Dataset create_virtual_dataset(Ref parent, const std::string& name, hid_t type, const std::vector<int64_t>& dims,
                               const std::vector<VirtualBlock>& blocks, double fill) {
  silence_errors();
  const std::string what = child_name(parent, name);
  if (dims.empty()) throw InvalidArgument(what + ": a virtual dataset needs at least one dimension");
  const std::vector<hsize_t> dims_h = to_hsize(dims, what);
  Dataspace space = simple_space(dims_h, nullptr, what);
  PropList dcpl = dataset_creation_plist(what);
  std::vector<unsigned char> fill_value(std::max<size_t>(H5Tget_size(type), sizeof(double)), 0);
  std::memcpy(fill_value.data(), &fill, sizeof fill);
  check(H5Tconvert(H5T_NATIVE_DOUBLE, type, 1, fill_value.data(), nullptr, H5P_DEFAULT),
        what + ": cannot convert the fill value");
  check(H5Pset_fill_value(dcpl.id(), type, fill_value.data()), what + ": cannot set the fill value");
  for (const VirtualBlock& b : blocks) {
    if (b.count < 1 || b.first < 0 || b.first + b.count > dims[0])
      throw InvalidArgument(what + ": block of rows [" + std::to_string(b.first) + ", " +
                            std::to_string(b.first + b.count) + ") is empty or outside the extent " +
                            std::to_string(dims[0]));
    std::vector<hsize_t> start(dims.size(), 0), count = dims_h;
    start[0] = static_cast<hsize_t>(b.first);
    count[0] = static_cast<hsize_t>(b.count);
    Dataspace vspace = simple_space(dims_h, nullptr, what);
    check(H5Sselect_hyperslab(vspace.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
          what + ": cannot select a block");
    Dataspace src_space = simple_space(count, nullptr, what);
    check(H5Pset_virtual(dcpl.id(), vspace.id(), b.file.c_str(), b.dataset.c_str(), src_space.id()),
          what + ": cannot map " + b.file + ":" + b.dataset);
  }
  return Dataset(check_id(H5Dcreate2(parent.id, name.c_str(), type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                          what + ": cannot create the virtual dataset"),
                 what);
}

std::vector<VirtualSource> virtual_sources(const Dataset& dataset) {
  const PropList dcpl = creation_plist(dataset);
  const H5D_layout_t layout = layout_of(dcpl);
  if (layout != H5D_VIRTUAL) return {};
  size_t count = 0;
  check(H5Pget_virtual_count(dcpl.id(), &count), dataset.name() + ": cannot count its mappings");
  const ssize_t own_len = H5Fget_name(dataset.id(), nullptr, 0);
  if (own_len < 0) throw_io(dataset.name() + ": cannot get its file name");
  std::string own(static_cast<size_t>(own_len) + 1, '\0');
  if (H5Fget_name(dataset.id(), own.data(), own.size()) < 0) throw_io(dataset.name() + ": cannot get its file name");
  own.resize(static_cast<size_t>(own_len));
  const auto text = [&](auto get, size_t i) {
    const ssize_t len = get(dcpl.id(), i, nullptr, 0);
    if (len < 0) throw_io(dataset.name() + ": cannot get mapping " + std::to_string(i));
    std::string out(static_cast<size_t>(len) + 1, '\0');
    if (get(dcpl.id(), i, out.data(), out.size()) < 0)
      throw_io(dataset.name() + ": cannot get mapping " + std::to_string(i));
    out.resize(static_cast<size_t>(len));
    return out;
  };
  std::vector<VirtualSource> out;
  for (size_t i = 0; i < count; ++i) {
    VirtualSource s;
    s.stored_file = text(H5Pget_virtual_filename, i);
    s.dataset = text(H5Pget_virtual_dsetname, i);
    const std::filesystem::path stored(s.stored_file);
    s.file = s.stored_file == "."      ? std::filesystem::path(own)
             : stored.is_absolute()    ? stored
                                       : std::filesystem::path(own).parent_path() / stored;
    out.push_back(std::move(s));
  }
  return out;
}

void check_virtual_sources(const Dataset& dataset) {
  for (const VirtualSource& s : virtual_sources(dataset)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(s.file, ec))
      throw IoError(dataset.name() + ": its source file '" + utf8::for_terminal(s.stored_file) + "' (" +
                    utf8::for_terminal(s.file.string()) +
                    ") is missing; a merged dataset keeps its sources in its own sources/ folder, where "
                    "`melforge-build merge` put them");
    const File file = open_file(s.file);
    silence_errors();
    const htri_t found = H5Lexists(file.id(), s.dataset.c_str(), H5P_DEFAULT);
    if (found <= 0)
      throw IoError(dataset.name() + ": its source " + utf8::for_terminal(s.file.string()) + " has no dataset " +
                    utf8::for_terminal(s.dataset));
  }
}

void write_attribute(Ref object, const std::string& name, const AttributeValue& value) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) write_attribute_int64(object, name, v);
        else if constexpr (std::is_same_v<T, double>) write_attribute_double(object, name, v);
        else write_attribute_string(object, name, v);
      },
      value);
}

std::map<std::string, AttributeValue> read_attributes(Ref object) {
  silence_errors();
  std::vector<std::string> names;
  const auto collect = [](hid_t, const char* attr_name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(attr_name);
    return 0;
  };
  hsize_t idx = 0;
  check(H5Aiterate2(object.id, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names),
        object.name + ": cannot list its attributes");
  std::map<std::string, AttributeValue> out;
  for (const std::string& name : names) {
    Attribute attr = open_attribute(object, name);
    const H5T_class_t c = type_class(attribute_type(attr));
    if (c == H5T_INTEGER) out[name] = read_attribute_int64(object, name);
    else if (c == H5T_FLOAT) out[name] = read_attribute_double(object, name);
    else if (c == H5T_STRING) out[name] = read_attribute_string(object, name);
    else throw_format(attr.name() + ": expected an integer, a float or a string");
  }
  return out;
}

std::string to_string(const AttributeValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", *d);
    return buf;
  }
  return "'" + utf8::for_terminal(std::get<std::string>(value)) + "'";
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace melforge::h5
