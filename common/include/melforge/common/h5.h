#pragma once
/// A small RAII layer over the HDF5 C API (1.10). Every failing HDF5 call throws IoError naming the file and the
/// object, with HDF5's own error message in the text (HDF5's automatic error printing is turned off); reading an
/// object of the wrong type or shape, or one that is missing, throws FormatError.
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace melforge::h5 {

/// The kind of an HDF5 identifier; it decides which H5*close releases it.
enum class Kind { file, group, dataset, dataspace, datatype, plist, attribute };

/// Closes `id` with the close function of `kind`. Returns HDF5's status (negative on failure).
herr_t close_id(Kind kind, hid_t id) noexcept;
/// Closes `id` with the close function of `kind`; throws IoError naming `name` on failure.
void close_id_checked(Kind kind, hid_t id, const std::string& name);

/// Move-only owner of one HDF5 identifier of kind K, closed on destruction (errors ignored there; call close() to
/// see them). `name()` describes the object for messages: "FILE" for a file, "FILE:/path/in/file" for an object.
template <Kind K>
class Handle {
 public:
  /// An empty handle (no identifier).
  Handle() = default;
  /// Takes ownership of `id` (must be valid), described as `name`.
  Handle(hid_t id, std::string name) : id_(id), name_(std::move(name)) {}
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  /// Takes the identifier of `other`, which becomes empty.
  Handle(Handle&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), name_(std::move(other.name_)) {}
  /// Closes the held identifier, then takes the identifier of `other`, which becomes empty.
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      name_ = std::move(other.name_);
    }
    return *this;
  }

  /// The raw identifier (H5I_INVALID_HID when empty), still owned by this handle.
  hid_t id() const { return id_; }
  /// Description of the object for messages.
  const std::string& name() const { return name_; }
  /// True when an identifier is held.
  explicit operator bool() const { return id_ >= 0; }
  /// Closes the identifier now and throws IoError if HDF5 reports a failure (for a file: the final flush failed).
  /// The handle is empty afterwards in either case.
  void close() {
    if (id_ < 0) return;
    close_id_checked(K, std::exchange(id_, H5I_INVALID_HID), name_);
  }
  /// Closes the identifier, ignoring errors; the handle becomes empty.
  void reset() noexcept {
    if (id_ >= 0) close_id(K, std::exchange(id_, H5I_INVALID_HID));
  }
  /// Gives up ownership and returns the identifier; the handle becomes empty.
  hid_t release() noexcept { return std::exchange(id_, H5I_INVALID_HID); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  std::string name_;
};

/// An open file (H5Fclose).
using File = Handle<Kind::file>;
/// An open group (H5Gclose).
using Group = Handle<Kind::group>;
/// An open dataset (H5Dclose).
using Dataset = Handle<Kind::dataset>;
/// A dataspace (H5Sclose).
using Dataspace = Handle<Kind::dataspace>;
/// A datatype (H5Tclose). Never wrap a predefined type such as H5T_NATIVE_INT32.
using Datatype = Handle<Kind::datatype>;
/// A property list (H5Pclose).
using PropList = Handle<Kind::plist>;
/// An open attribute (H5Aclose).
using Attribute = Handle<Kind::attribute>;

/// A borrowed file, group or dataset to create objects in or to put attributes on: its identifier, its
/// description and its kind. Built implicitly from any Handle, which must outlive it.
struct Ref {
  /// Borrowed identifier.
  hid_t id;
  /// Description of the object for messages.
  const std::string& name;
  /// Kind of `id`.
  Kind kind;
  /// Borrows `h`.
  template <Kind K>
  Ref(const Handle<K>& h) : id(h.id()), name(h.name()), kind(K) {}  // NOLINT(google-explicit-constructor)
};

/// Description of the child `child` of `parent` for messages: "FILE:/child" or "FILE:/group/child".
std::string child_name(Ref parent, const std::string& child);

/// Turns off HDF5's automatic error stack printing for the calling thread (the stack is per thread in the
/// thread-safe build). Every function here calls it; call it yourself before using the raw C API on a new thread.
void silence_errors() noexcept;
/// The calling thread's HDF5 error stack as one line (outermost and innermost record), then clears the stack.
/// Empty when the stack is empty.
std::string error_stack();
/// Throws IoError with "`what`: <HDF5 error stack>".
[[noreturn]] void throw_io(const std::string& what);

/// Creates (truncating) the file at `path` for writing. Throws IoError if it cannot be created.
File create_file(const std::filesystem::path& path);
/// Opens an existing file, read-only unless `writable`. Throws IoError if it cannot be opened.
File open_file(const std::filesystem::path& path, bool writable = false);
/// Creates the group `name` in `parent`.
Group create_group(Ref parent, const std::string& name);
/// Opens the group `name` in `parent`; FormatError when there is no such link.
Group open_group(Ref parent, const std::string& name);
/// True when `parent` has a link called `name`.
bool exists(Ref parent, const std::string& name);

/// The IEEE half type exactly as h5py builds it (copy of H5T_IEEE_F32LE, fields (15, 10, 5, 0, 10), size 2,
/// exponent bias 15), so that h5py reads it as numpy float16.
Datatype float16_type();
/// A variable-length, null-terminated UTF-8 string type.
Datatype utf8_string_type();
/// The stored element type of `dataset`.
Datatype dataset_type(const Dataset& dataset);
/// The dataspace of `dataset` (its current extent).
Dataspace dataset_space(const Dataset& dataset);

/// Layout of a chunked dataset.
struct ChunkedSpec {
  /// Initial extent, one entry per dimension.
  std::vector<int64_t> dims;
  /// Maximum extent per dimension; -1 means unlimited. Empty: equal to `dims`.
  std::vector<int64_t> max_dims;
  /// Chunk shape, one entry per dimension, each >= 1.
  std::vector<int64_t> chunk;
  /// Register HDF5's shuffle filter (before deflate). Only used when deflate_level > 0.
  bool shuffle = false;
  /// Register HDF5's deflate filter at this level (1..9); 0: no filters.
  int deflate_level = 0;
};

/// Longest string, bytes, that a string dataset or attribute may hold (a class name, a path, an attribute value):
/// checked from the datatype (fixed-length) or the stored sizes (variable-length) before the strings are read.
inline constexpr std::size_t kMaxStringBytes = std::size_t{64} << 10;
/// Most bytes the strings of one dataset may hold together, checked before they are read.
inline constexpr std::size_t kMaxStringDatasetBytes = std::size_t{1} << 30;
/// Largest chunk, bytes before compression, of a dataset melforge opens: reading one element reads (and inflates)
/// its whole chunk. melforge-build writes at most kMaxWrittenChunkBytes; this leaves room above it.
inline constexpr std::size_t kMaxChunkBytes = std::size_t{512} << 20;
/// Largest chunk melforge-build writes (--frames-per-chunk times a frame's bytes).
inline constexpr std::size_t kMaxWrittenChunkBytes = std::size_t{256} << 20;
/// Largest dataset, bytes, that may be opened without being backed by stored data: beyond it a dataset whose
/// storage is not (fully) allocated, so that reading it would give fill values, is refused.
inline constexpr std::size_t kMaxUnstoredBytes = std::size_t{1} << 20;
/// Deepest chain of virtual datasets opened: a virtual dataset whose source is virtual, and so on.
inline constexpr int kMaxVirtualDepth = 4;

/// Creates a chunked dataset of element type `type` (a predefined type or a Datatype's id). Object modification
/// times are not stored, so equal contents give byte-identical files.
Dataset create_chunked_dataset(Ref parent, const std::string& name, hid_t type, const ChunkedSpec& spec);
/// Opens the dataset `name` in `parent` and checks it as untrusted input (issue 29). FormatError naming the file and
/// the dataset when there is no such link; when the dataset keeps its data in external raw storage (H5Pset_external:
/// files named inside the HDF5 file, which may be any file of the machine, a FIFO or a device); when it is a virtual
/// dataset with a source file outside the folder of the file being opened (check_virtual_layout), a source name
/// with '%' (HDF5's printf form), or a chain of virtual datasets more than kMaxVirtualDepth deep (a dataset that
/// names itself, two that name each other); when a chunk is larger than kMaxChunkBytes; and when the dataset
/// declares more than kMaxUnstoredBytes that are not stored (its storage is not fully allocated, so reading it would
/// give fill values). IoError when a virtual source file is missing. melforge reads only data stored inside the
/// files it is given, and only within their folder.
Dataset open_dataset(Ref parent, const std::string& name);

/// The raw-data chunk cache of one open dataset (H5Pset_chunk_cache): decompressed chunks kept in memory so that
/// reads which touch a chunk again do not read and inflate it again.
struct ChunkCache {
  /// Cache size, bytes (of decompressed chunks). A chunk larger than this bypasses the cache.
  size_t bytes = size_t{1} << 20;
  /// Hash table slots; best a prime about 100 times the number of chunks that fit.
  size_t slots = 521;
  /// Eviction preference in [0, 1] for chunks that were read completely (1: evict those first).
  double w0 = 0.75;

  /// A cache of `bytes` for chunks of `chunk_bytes` each: `slots` the first prime >= 100 * bytes / chunk_bytes
  /// (at least 521), w0 = 1 (sequential and block reads never return to a fully read chunk).
  static ChunkCache sized(size_t bytes, size_t chunk_bytes);
};

/// Opens the dataset `name` in `parent` with its own chunk cache; FormatError as open_dataset above.
Dataset open_dataset(Ref parent, const std::string& name, const ChunkCache& cache);
/// Chunk shape of a chunked dataset, one entry per dimension; for a virtual dataset, the chunk shape of its first
/// source dataset (see virtual_sources), so that readers pick the same block sizes as for the source files; empty
/// when the layout is neither (contiguous, or a virtual dataset without mappings). A chain of virtual datasets more
/// than 4 deep (a dataset that names itself, or two that name each other) is a FormatError, not a recursion without
/// end.
std::vector<int64_t> chunk_dims(const Dataset& dataset);
/// Current extent of `dataset`, one entry per dimension (empty for a scalar).
std::vector<int64_t> dims(const Dataset& dataset);
/// Sets the extent of a chunked dataset to `new_dims`.
void set_extent(const Dataset& dataset, const std::vector<int64_t>& new_dims);
/// Writes one chunk's stored bytes (already filtered by the caller) with H5Dwrite_chunk. `offset` is the chunk's
/// first element in every dimension; `filter_mask` 0 means every registered filter was applied.
void write_chunk(const Dataset& dataset, const std::vector<int64_t>& offset, const void* data, size_t bytes,
                 uint32_t filter_mask = 0);

/// The filters of a chunked dataset as melforge writes them.
struct Filters {
  /// HDF5's shuffle filter is registered.
  bool shuffle = false;
  /// Level of the deflate filter, 0 when there is none.
  int deflate_level = 0;
};
/// The shuffle and deflate filters of `dataset` (none for a contiguous or virtual dataset).
Filters filters(const Dataset& dataset);

/// True when `dataset` is an HDF5 virtual dataset (VDS).
bool is_virtual(const Dataset& dataset);

/// One mapping of a virtual dataset built by create_virtual_dataset: rows [first, first + count) along dim 0 of the
/// virtual dataset are the whole source dataset, of shape [count, dims[1:]...].
struct VirtualBlock {
  /// Source file name as stored: relative names are resolved by HDF5 against the virtual dataset's file's folder.
  std::string file;
  /// Path of the source dataset inside its file, e.g. "/mel".
  std::string dataset;
  /// First row of the block in the virtual dataset.
  int64_t first = 0;
  /// Rows of the block (>= 1).
  int64_t count = 0;
};

/// Creates a fixed-size virtual dataset `name` of element type `type` and extent `dims` in `parent`, made of
/// `blocks` (which must not overlap). Elements no block covers, or whose source cannot be opened when read, read as
/// `fill` (converted to `type`). Object modification times are not stored.
Dataset create_virtual_dataset(Ref parent, const std::string& name, hid_t type, const std::vector<int64_t>& dims,
                               const std::vector<VirtualBlock>& blocks, double fill);

/// True when `path` is `folder` or inside it, both resolved with weakly_canonical (symbolic links and `..` followed).
bool is_inside(const std::filesystem::path& path, const std::filesystem::path& folder);

/// A source of a virtual dataset as stored in it, and the file it resolves to.
struct VirtualSource {
  /// File name as stored ("." for the virtual dataset's own file).
  std::string stored_file;
  /// Resolved file: absolute names as stored, relative ones against the folder of the virtual dataset's file
  /// (HDF5 1.10.8's own rule when HDF5_VDS_PREFIX is not set).
  std::filesystem::path file;
  /// Source dataset path inside the file.
  std::string dataset;
};

/// The sources of a virtual dataset, in mapping order (empty for other layouts).
std::vector<VirtualSource> virtual_sources(const Dataset& dataset);

/// Checks the sources of a virtual dataset before anything is read through it (open_dataset calls it): each source
/// file name without '%', resolved as HDF5 resolves it (relative to the folder of the virtual dataset's file; "."
/// is that file), inside that folder (sub-folders allowed; weakly_canonical follows symbolic links and `..`), an
/// existing regular file, and its source dataset checked as open_dataset checks it, at most `depth` virtual levels
/// further. FormatError naming the dataset, the stored source name and where it resolves; IoError when a source file
/// is missing. Does nothing for other layouts.
void check_virtual_layout(const Dataset& dataset, int depth = kMaxVirtualDepth);

/// Checks that every source of a virtual dataset opens and holds its source dataset. HDF5 reads an unreachable
/// source as fill values without an error, so a reader must call this first. Throws IoError naming the virtual
/// dataset and the missing file or dataset. Does nothing for other layouts.
void check_virtual_sources(const Dataset& dataset);

/// A root or object attribute value: integers are read as int64, floating point values as double.
using AttributeValue = std::variant<int64_t, double, std::string>;
/// Writes a scalar attribute of the value's type (H5T_NATIVE_INT64, H5T_NATIVE_DOUBLE or variable-length UTF-8),
/// replacing one of the same name.
void write_attribute(Ref object, const std::string& name, const AttributeValue& value);
/// Every attribute of `object` by name. FormatError for an attribute that is not a scalar integer, float or string.
std::map<std::string, AttributeValue> read_attributes(Ref object);
/// The value as text for messages (strings quoted, passed through utf8::for_terminal).
std::string to_string(const AttributeValue& value);

/// Writes a scalar int64 attribute (H5T_NATIVE_INT64) on `object`, replacing one of the same name.
void write_attribute_int64(Ref object, const std::string& name, int64_t value);
/// Writes a scalar double attribute (H5T_NATIVE_DOUBLE) on `object`, replacing one of the same name.
void write_attribute_double(Ref object, const std::string& name, double value);
/// Writes a scalar variable-length UTF-8 string attribute on `object`, replacing one of the same name.
void write_attribute_string(Ref object, const std::string& name, const std::string& value);
/// True when `object` has an attribute `name`.
bool has_attribute(Ref object, const std::string& name);
/// Reads a scalar integer attribute as int64; FormatError when missing, not an integer or not a scalar.
int64_t read_attribute_int64(Ref object, const std::string& name);
/// Reads a scalar integer or floating-point attribute as double; FormatError when missing or of another type.
double read_attribute_double(Ref object, const std::string& name);
/// Reads a scalar string attribute (variable or fixed length); FormatError when missing, not a string, or longer
/// than kMaxStringBytes (a fixed-length one checked before reading).
std::string read_attribute_string(Ref object, const std::string& name);

/// Writes `values` as a new 1-D int32 dataset [values.size()] (contiguous, H5T_NATIVE_INT32).
void write_int32(Ref parent, const std::string& name, std::span<const int32_t> values);
/// Writes `values` as a new 1-D float32 dataset [values.size()] (contiguous, H5T_NATIVE_FLOAT); read it back with
/// read_float.
void write_float32(Ref parent, const std::string& name, std::span<const float> values);
/// Reads a whole 1-D integer dataset as int32; FormatError when missing, not an integer or not 1-D.
std::vector<int32_t> read_int32(Ref parent, const std::string& name);
/// Writes `values` (row-major, rows * cols) as a new 2-D uint8 dataset [rows, cols] (contiguous, H5T_STD_U8LE).
/// Throws InvalidArgument when values.size() != rows * cols.
void write_uint8_matrix(Ref parent, const std::string& name, int64_t rows, int64_t cols,
                        std::span<const uint8_t> values);
/// Reads a whole 2-D integer dataset as uint8, row-major, and its dims [rows, cols]; FormatError when missing, not
/// an integer or not 2-D.
std::vector<uint8_t> read_uint8_matrix(Ref parent, const std::string& name, std::vector<int64_t>& dims_out);
/// Writes `values` as a new 1-D variable-length UTF-8 string dataset [values.size()].
void write_strings(Ref parent, const std::string& name, const std::vector<std::string>& values);
/// Reads a whole 1-D string dataset (variable or fixed length); FormatError when missing, not strings or not 1-D,
/// when a string is longer than kMaxStringBytes or all of them longer than kMaxStringDatasetBytes together (fixed
/// length: checked from the type before reading; variable length: checked after one H5Dread, the strings being
/// stored in the file).
std::vector<std::string> read_strings(Ref parent, const std::string& name);

/// Elements per index of dim 0 of `dataset`: the product of its other dimensions (1 for a 1-D dataset).
int64_t row_elements(const Dataset& dataset);
/// Reads rows [begin, begin + count) along dim 0 of `dataset` into `out` as elements of `mem_type` (HDF5 converts),
/// row-major. InvalidArgument when the range is outside the extent; FormatError for a scalar.
void read_rows(const Dataset& dataset, int64_t begin, int64_t count, hid_t mem_type, void* out);
/// Reads rows [begin, begin + count) along dim 0 of a float16 or float32 dataset into `out`, which holds
/// count * row_elements(dataset) floats. FormatError when the element type is not a 2- or 4-byte float or the
/// dataset is scalar; InvalidArgument when the range is outside the extent.
void read_float(const Dataset& dataset, int64_t begin, int64_t count, float* out);
/// Reads rows [begin, begin + count) along dim 0 of a float16 or float32 dataset, row-major.
std::vector<float> read_float(const Dataset& dataset, int64_t begin, int64_t count);
/// Reads a whole float16 or float32 dataset, row-major.
std::vector<float> read_float(const Dataset& dataset);

/// Converts IEEE half bits to float exactly (subnormals, infinities and NaNs included).
float half_to_float(uint16_t bits);

}  // namespace melforge::h5
