#include "train/checkpoint.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/storage_context.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"
#include "train/torch_zip.h"

namespace torch::jit {
// Declared in <torch/csrc/jit/serialization/export.h>, which costs a TorchScript and ONNX include tree.
TORCH_API void writeArchiveAndTensors(const std::string& archive_name, const char* pickle_bytes, size_t size,
                                      const std::vector<at::Tensor>& tensors,
                                      caffe2::serialize::PyTorchStreamWriter& out);
}  // namespace torch::jit

namespace melforge::trainer {

namespace {

/// Value of the "format" entry that marks a melforge checkpoint.
constexpr const char* kFormatTag = "melforge-checkpoint";

std::string shape_string(at::IntArrayRef s) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < s.size(); ++i) out << (i ? ", " : "") << s[i];
  out << ']';
  return out.str();
}

c10::impl::GenericDict tensor_dict(const TensorMap& m) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : m) d.insert(name, t.detach().to(at::kCPU).contiguous());
  return d;
}

std::string errno_text() { return std::strerror(errno); }

/// `j` as a pickled Python value: an object becomes a dict (string keys), an array a list, numbers int or float,
/// null None. torch.load then gives the plain dict a Python user expects.
c10::IValue json_to_ivalue(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
      for (const auto& item : j.items()) d.insert(item.key(), json_to_ivalue(item.value()));
      return d;
    }
    case nlohmann::json::value_t::array: {
      c10::impl::GenericList l(c10::AnyType::get());
      for (const auto& e : j) l.push_back(json_to_ivalue(e));
      return l;
    }
    case nlohmann::json::value_t::string: return j.get<std::string>();
    case nlohmann::json::value_t::boolean: return j.get<bool>();
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return j.get<int64_t>();
    case nlohmann::json::value_t::number_float: return j.get<double>();
    default: return c10::IValue();
  }
}

/// The inverse of json_to_ivalue; throws FormatError (via `fail`) for a value JSON cannot hold.
template <typename Fail>
nlohmann::json ivalue_to_json(const c10::IValue& v, const Fail& fail) {
  if (v.isGenericDict()) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& item : v.toGenericDict()) {
      if (!item.key().isString()) fail("a dict key of type " + item.key().tagKind());
      o[item.key().toStringRef()] = ivalue_to_json(item.value(), fail);
    }
    return o;
  }
  if (v.isList() || v.isTuple()) {
    nlohmann::json a = nlohmann::json::array();
    for (const c10::IValue& e : v.isList() ? v.toListRef() : v.toTupleRef().elements())
      a.push_back(ivalue_to_json(e, fail));
    return a;
  }
  if (v.isString()) return v.toStringRef();
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isNone()) return nullptr;
  fail("a value of type " + v.tagKind());
  return nullptr;
}

/// Reads the entries of a loaded checkpoint with type checks; every error names the file and the entry.
class Reader {
 public:
  Reader(const std::filesystem::path& path, c10::impl::GenericDict dict) : path_(path), dict_(std::move(dict)) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError("checkpoint '" + path_.string() + "': " + why);
  }
  bool has(const std::string& key) const { return dict_.contains(key); }
  c10::IValue get(const std::string& key) const {
    auto it = dict_.find(key);
    if (it == dict_.end()) fail("missing entry '" + key + "'");
    return it->value();
  }
  int64_t integer(const std::string& key) const {
    const c10::IValue v = get(key);
    if (!v.isInt()) fail("entry '" + key + "' is a " + v.tagKind() + ", not an int");
    return v.toInt();
  }
  std::string string(const std::string& key) const {
    const c10::IValue v = get(key);
    if (!v.isString()) fail("entry '" + key + "' is a " + v.tagKind() + ", not a string");
    return v.toStringRef();
  }
  nlohmann::json json(const std::string& key) const {
    const std::string s = string(key);
    try {
      return nlohmann::json::parse(s);
    } catch (const nlohmann::json::exception& e) {
      fail("entry '" + key + "' is not valid JSON: " + e.what());
    }
  }
  /// A JSON entry stored as a dict (version 2's model_config) or as a JSON string (version 1).
  nlohmann::json json_or_dict(const std::string& key) const {
    const c10::IValue v = get(key);
    if (v.isString()) return json(key);
    if (!v.isGenericDict()) fail("entry '" + key + "' is a " + v.tagKind() + ", not a dict or a JSON string");
    return ivalue_to_json(v, [&](const std::string& what) { fail("entry '" + key + "' holds " + what); });
  }
  std::vector<std::string> strings(const std::string& key) const {
    const c10::IValue v = get(key);
    if (!v.isList()) fail("entry '" + key + "' is a " + v.tagKind() + ", not a list");
    std::vector<std::string> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isString()) fail("entry '" + key + "' holds a " + e.tagKind() + ", not a string");
      out.push_back(e.toStringRef());
    }
    return out;
  }
  TensorMap tensors(const std::string& key) const {
    const c10::IValue v = get(key);
    if (!v.isGenericDict()) fail("entry '" + key + "' is a " + v.tagKind() + ", not a dict");
    TensorMap out;
    for (const auto& item : v.toGenericDict()) {
      if (!item.key().isString()) fail("entry '" + key + "' has a key of type " + item.key().tagKind());
      if (!item.value().isTensor())
        fail("entry '" + key + "." + item.key().toStringRef() + "' is a " + item.value().tagKind() + ", not a tensor");
      out[item.key().toStringRef()] = item.value().toTensor();
    }
    return out;
  }
  at::Tensor optional_tensor(const std::string& key, bool may_be_absent = false) const {
    if (may_be_absent && dict_.find(key) == dict_.end()) return {};
    const c10::IValue v = get(key);
    if (v.isNone()) return {};
    if (!v.isTensor()) fail("entry '" + key + "' is a " + v.tagKind() + ", not a tensor");
    return v.toTensor();
  }

 private:
  std::filesystem::path path_;
  c10::impl::GenericDict dict_;
};

}  // namespace

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* buf, size_t size) { pickle.insert(pickle.end(), buf, buf + size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  auto fail = [&](const std::string& what, int fd) {
    const std::string reason = errno_text();
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError("cannot write '" + path.string() + "': " + what + ": " + reason);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const std::string reason = errno_text();
    throw IoError("cannot write '" + path.string() + "': cannot create '" + tmp.string() + "': " + reason);
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", fd);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync", fd);
  if (::close(fd) != 0) fail("close", -1);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", -1);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void save_checkpoint(const Checkpoint& c, const std::filesystem::path& path) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kFormatTag));
  d.insert("version", c.version);
  d.insert("model_config", json_to_ivalue(c.model_config));
  d.insert("config", utf8::dump(c.config));
  d.insert("mel", utf8::dump(c.mel));
  c10::List<std::string> names;
  for (const auto& n : c.class_names) names.push_back(n);
  d.insert("class_names", names);
  d.insert("positive_class", c.positive_class);
  d.insert("positive_index", c.positive_index);
  d.insert("epoch", c.epoch);
  d.insert("step", c.step);
  d.insert("model", tensor_dict(c.model));
  d.insert("optimizer", tensor_dict(c.optimizer));
  d.insert("scaler", tensor_dict(c.scaler));
  d.insert("scheduler", utf8::dump(c.scheduler));
  d.insert("rng_state", c.rng_state.defined() ? c10::IValue(c.rng_state.detach().to(at::kCPU).contiguous())
                                              : c10::IValue());
  d.insert("cuda_rng_state", c.cuda_rng_state.defined()
                                 ? c10::IValue(c.cuda_rng_state.detach().to(at::kCPU).contiguous())
                                 : c10::IValue());
  d.insert("state", utf8::dump(c.state));
  const std::vector<char> bytes = torch_save_bytes(c10::IValue(d));
  write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

namespace {

/// A checkpoint's bytes for PyTorchStreamReader, every read bounded by their size. torch::jit::pickle_load's own
/// VectorReader copies whatever range the zip reader asks for: on a truncated file that ran past the end of its
/// buffer (AddressSanitizer, test_trainer_checkpoint). A short read here makes the zip reader fail with an error.
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - static_cast<size_t>(pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string bytes_;
};

/// The bytes each storage record of an archive really holds, by the address its DataPtr gives the storage.
struct RecordSizes {
  std::map<const void*, uint64_t> by_data;
  uint64_t total = 0;
};

/// torch::jit::readArchiveAndTensors (a torch.save archive's "data" pickle and its tensors), reading through
/// BoundedReader, and noting in `records` how many bytes each storage record holds: the unpickler gives a storage the
/// byte count the pickle declares (numel times the dtype's size) over the record's bytes, whatever the record holds.
/// A record named again is served from a DeserializationStorageContext, not read again; FormatError naming `path`
/// when the records read still add up to more bytes than the file has.
c10::IValue bounded_pickle_load(std::string bytes, const std::filesystem::path& path, RecordSizes& records) {
  const uint64_t file_bytes = bytes.size();
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedReader>(std::move(bytes)));
  auto pickle_record = reader.getRecord("data.pkl");
  const size_t pickle_size = std::get<1>(pickle_record);
  const char* pickle = static_cast<const char*>(std::get<0>(pickle_record).get());
  size_t done = 0;
  auto read_pickle = [&](char* buf, size_t n) -> size_t {
    n = std::min(n, pickle_size - done);
    std::memcpy(buf, pickle + done, n);
    done += n;
    return n;
  };
  auto read_record = [&](const std::string& name) {
    auto [ptr, size] = reader.getRecord("data/" + name);
    records.total += size;
    if (records.total > file_bytes)
      throw FormatError("checkpoint '" + utf8::for_terminal(path.string()) + "': its tensors read " +
                        std::to_string(records.total) + " bytes of storage records, more than the " +
                        std::to_string(file_bytes) + " bytes of the file (record 'data/" + utf8::for_terminal(name, 60) +
                        "' is read more than once)");
    records.by_data[ptr.get()] = size;
    return std::move(ptr);
  };
  torch::jit::Unpickler unpickler(read_pickle, nullptr, nullptr, read_record, std::nullopt, false,
                                  torch::jit::Unpickler::defaultTypeParser,
                                  std::make_shared<torch::jit::DeserializationStorageContext>());
  unpickler.set_version(reader.version());
  return unpickler.parse_ivalue();
}

/// Throws FormatError naming `where` (the file and the tensor's entry) unless `t` is a dense CPU tensor of a plain
/// dtype whose shape, strides and storage offset stay within the bytes its storage record holds in the file: checked
/// on the metadata alone, before any value is read.
void check_stored_tensor(const at::Tensor& t, const std::string& where, const RecordSizes& records) {
  auto fail = [&](const std::string& why) { throw FormatError(where + " " + why); };
  if (t.layout() != at::kStrided || t.is_quantized() || !t.device().is_cpu())
    fail("is not a dense CPU tensor (layout " + c10::str(t.layout()) + ")");
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kLong: case at::kInt:
    case at::kShort: case at::kChar: case at::kByte: case at::kBool: break;
    default: fail("has dtype " + std::string(c10::toString(t.scalar_type())) + ", not a real number type");
  }
  if (t.dim() > 8) fail("has " + std::to_string(t.dim()) + " dimensions");
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 0) fail("has a negative size in dimension " + std::to_string(d));
    if (t.size(d) > 1 && t.stride(d) <= 0)
      fail("has stride " + std::to_string(t.stride(d)) + " in dimension " + std::to_string(d) + " (shape " +
           shape_string(t.sizes()) + "): a stride of 0 or below repeats or reverses stored values");
  }
  if (t.numel() == 0) return;
  if (!t.is_contiguous())
    fail("has strides " + shape_string(t.strides()) + " for shape " + shape_string(t.sizes()) +
         ": overlapping or permuted views are refused (checkpoints store contiguous tensors)");
  if (t.storage_offset() < 0) fail("has a negative storage offset");
  uint64_t needed = 0;
  const bool overflow =
      __builtin_add_overflow(static_cast<uint64_t>(t.storage_offset()), static_cast<uint64_t>(t.numel()), &needed) ||
      __builtin_mul_overflow(needed, static_cast<uint64_t>(t.element_size()), &needed);
  const uint64_t declared = t.storage().nbytes();
  const auto it = records.by_data.find(t.storage().data());
  const uint64_t stored = it == records.by_data.end() ? 0 : it->second;
  if (overflow || needed > declared || declared > stored)
    fail("of shape " + shape_string(t.sizes()) + " (" + std::string(c10::toString(t.scalar_type())) +
         ", storage offset " + std::to_string(t.storage_offset()) + ") needs " +
         (overflow ? std::string("more than 2^64") : std::to_string(needed)) + " bytes, its storage declares " +
         std::to_string(declared) + " and the file stores " + std::to_string(stored) +
         ": the file is truncated or crafted");
}

/// check_stored_tensor on every tensor inside `v` (dicts, lists, tuples), `where` naming the entry
/// ("checkpoint 'x': entry 'model.fc.weight'").
void check_stored_tensors(const c10::IValue& v, const std::string& file, const std::string& name,
                          const RecordSizes& records, int depth = 0) {
  const std::string where = file + ": entry '" + name + "'";
  if (depth > 64) throw FormatError(where + " nests more than 64 levels deep");
  if (v.isTensor()) return check_stored_tensor(v.toTensor(), where, records);
  if (v.isGenericDict()) {
    for (const auto& item : v.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : item.key().tagKind();
      check_stored_tensors(item.value(), file, name + (depth ? "." : "") + utf8::for_terminal(key, 80), records,
                           depth + 1);
    }
    return;
  }
  if (v.isList() || v.isTuple()) {
    const auto& elements = v.isList() ? v.toListRef() : v.toTupleRef().elements();
    for (std::size_t i = 0; i < elements.size(); ++i)
      check_stored_tensors(elements[i], file, name + "[" + std::to_string(i) + "]", records, depth + 1);
  }
}

/// The error for a folder given as a checkpoint; for a run folder it names the checkpoints inside.
std::string folder_message(const std::filesystem::path& path) {
  std::string inside;
  for (const char* name : {"best.pt", "last.pt"}) {
    const std::filesystem::path p = path / "checkpoints" / name;
    if (std::filesystem::exists(p)) inside += (inside.empty() ? "" : " or ") + p.string();
  }
  return "'" + path.string() + "' is a folder, not a checkpoint file" +
         (inside.empty() ? "" : " (it is a run folder: pass " + inside + ")");
}

}  // namespace

c10::IValue read_torch_archive(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) throw IoError(folder_message(path));
  std::string bytes = read_regular_file(path, "checkpoint", kMaxCheckpointBytes);
  verify_zip_crcs(bytes, path);
  const std::string shown = utf8::for_terminal(path.string());
  c10::IValue root;
  RecordSizes records;
  try {
    root = bounded_pickle_load(std::move(bytes), path, records);
  } catch (const FormatError&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    throw FormatError("checkpoint '" + shown + "' is not a readable torch archive (truncated or corrupt?): " +
                      utf8::for_terminal(what));
  }
  check_stored_tensors(root, "checkpoint '" + shown + "'", "", records);
  return root;
}

Checkpoint load_checkpoint(const std::filesystem::path& path) {
  const c10::IValue root = read_torch_archive(path);
  if (!root.isGenericDict())
    throw FormatError("checkpoint '" + path.string() + "' is not a melforge checkpoint (it holds a " +
                      root.tagKind() + ", not a dict)");
  for (const auto& item : root.toGenericDict())
    if (!item.key().isString())
      throw FormatError("checkpoint '" + path.string() + "' is not a melforge checkpoint (a key is a " +
                        item.key().tagKind() + ")");
  const Reader r(path, root.toGenericDict());
  if (!r.has("format") || !r.get("format").isString() || r.string("format") != kFormatTag)
    r.fail("not a melforge checkpoint (no 'format': '" + std::string(kFormatTag) + "' entry)");
  Checkpoint c;
  c.version = r.integer("version");
  if (c.version < 1 || c.version > kCheckpointVersion)
    r.fail("format version " + std::to_string(c.version) + ", this build reads versions 1 to " +
           std::to_string(kCheckpointVersion));
  c.model_config = r.json_or_dict("model_config");
  c.config = r.json("config");
  c.mel = r.json("mel");
  c.class_names = r.strings("class_names");
  c.positive_class = r.string("positive_class");
  c.positive_index = r.integer("positive_index");
  c.epoch = r.integer("epoch");
  c.step = r.integer("step");
  c.model = r.tensors("model");
  c.optimizer = r.tensors("optimizer");
  c.scaler = r.tensors("scaler");
  for (const auto* group : {&c.model, &c.optimizer, &c.scaler})
    for (const auto& [name, t] : *group)
      if (t.is_floating_point() && !t.isfinite().all().item<bool>())
        r.fail("entry '" + std::string(group == &c.model ? "model" : group == &c.optimizer ? "optimizer" : "scaler") +
               "." + name + "' holds NaN or infinite values (the file is corrupt, or was saved from a diverged run)");
  c.scheduler = r.json("scheduler");
  c.rng_state = r.optional_tensor("rng_state");
  c.cuda_rng_state = r.optional_tensor("cuda_rng_state", /*may_be_absent=*/true);
  c.state = r.json("state");
  return c;
}

TensorMap state_dict(const torch::nn::Module& module) {
  TensorMap out;
  for (const auto& item : module.named_parameters(true))
    out[item.key()] = item.value().detach().to(at::kCPU).clone(at::MemoryFormat::Contiguous);
  for (const auto& item : module.named_buffers(true))
    out[item.key()] = item.value().detach().to(at::kCPU).clone(at::MemoryFormat::Contiguous);
  return out;
}

void load_state_dict(torch::nn::Module& module, const TensorMap& state, const std::string& what) {
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : module.named_parameters(true)) targets[item.key()] = item.value();
  for (const auto& item : module.named_buffers(true)) targets[item.key()] = item.value();
  for (const auto& [name, target] : targets) {
    auto it = state.find(name);
    if (it == state.end()) throw FormatError(what + ": missing entry '" + name + "' of the model");
    if (!it->second.defined()) throw FormatError(what + ": entry '" + name + "' is an undefined tensor");
    if (it->second.sizes() != target.sizes())
      throw FormatError(what + ": entry '" + name + "' has shape " + shape_string(it->second.sizes()) +
                        " but the model's is " + shape_string(target.sizes()));
    if (it->second.scalar_type() != target.scalar_type())
      throw FormatError(what + ": entry '" + name + "' has dtype " + c10::toString(it->second.scalar_type()) +
                        " but the model's is " + c10::toString(target.scalar_type()));
  }
  for (const auto& [name, t] : state)
    if (!targets.count(name)) throw FormatError(what + ": unexpected entry '" + name + "' (not in the model)");
  c10::NoGradGuard no_grad;
  for (auto& [name, target] : targets) target.copy_(state.at(name));
}

}  // namespace melforge::trainer
