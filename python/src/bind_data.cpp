/// Dataset reading and the batch loader (data/): melforge._core._Split (one split's metadata and segment reads) and
/// melforge._core._Loader (SegmentLoader). The public classes are melforge.Dataset and melforge.Loader
/// (python/melforge/data.py), which open these lazily per process.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings.h"
#include "loader/segment_loader.h"
#include "reader/mel_reader.h"
#include "reader/split_info.h"

namespace nb = nanobind;

namespace melforge::python {

namespace {

using FloatArray = nb::ndarray<nb::numpy, float>;
using LongArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;

/// A NumPy int64 copy of `v`.
LongArray long_array(const std::vector<int64_t>& v) {
  auto* copy = new std::vector<int64_t>(v);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return LongArray(copy->data(), {copy->size()}, owner);
}

/// One split's metadata, and reads of its segments through a MelReader opened on first use.
class SplitHandle {
 public:
  SplitHandle(const std::string& folder, const std::string& split)
      : info_(data::read_split_info(data::split_file(folder, split), split)), offsets_(info_.segment_offsets()) {}

  const data::SplitInfo& info() const { return info_; }
  int64_t size() const { return offsets_.back(); }

  nb::tuple segment(int64_t position) {
    const data::SegmentRef ref = data::segment_at(offsets_, info_.info.num_short, position);
    const auto m = static_cast<size_t>(info_.info.n_mels), t = static_cast<size_t>(info_.info.n_frames);
    auto* out = new std::vector<float>(m * t);
    nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    {
      nb::gil_scoped_release release;
      reader().read_segment(ref.file, ref.long_index, ref.short_index, out->data());
      info_.check_finite_segment(ref, out->data());
    }
    FloatArray x(out->data(), {m, t}, owner);
    return nb::make_tuple(x, info_.labels[static_cast<size_t>(ref.file)], ref.file);
  }

 private:
  const data::MelReader& reader() {
    std::lock_guard lock(mutex_);
    if (!reader_) reader_ = std::make_unique<data::MelReader>(info_.path, 0);
    return *reader_;
  }

  data::SplitInfo info_;
  std::vector<int64_t> offsets_;
  std::mutex mutex_;
  std::unique_ptr<data::MelReader> reader_;
};

/// A batch as (x, y, file) NumPy arrays that keep the batch's buffers alive (they return to the loader when the
/// last array is released).
nb::tuple batch_arrays(std::shared_ptr<const data::Batch> b, int64_t n_mels, int64_t n_frames) {
  auto owner_of = [&b]() {
    auto* keep = new std::shared_ptr<const data::Batch>(b);
    return nb::capsule(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const data::Batch>*>(p); });
  };
  const auto n = static_cast<size_t>(b->size);
  FloatArray x(const_cast<float*>(b->x.data()), {n, static_cast<size_t>(n_mels), static_cast<size_t>(n_frames)},
               owner_of());
  LongArray y(const_cast<int64_t*>(b->y.data()), {n}, owner_of());
  LongArray file(const_cast<int64_t*>(b->file.data()), {n}, owner_of());
  return nb::make_tuple(x, y, file);
}

}  // namespace

void bind_data(nb::module_& m) {
  nb::class_<SplitHandle>(m, "_Split", "One split of a melforge dataset (internal: use melforge.Dataset).")
      .def(nb::init<const std::string&, const std::string&>(), nb::arg("folder"), nb::arg("split"))
      .def("__len__", &SplitHandle::size)
      .def("segment", &SplitHandle::segment, nb::arg("index"),
           "(spectrogram float32 [n_mels, n_frames], label, file row) of valid segment `index`.")
      .def_prop_ro("path", [](const SplitHandle& s) { return s.info().path.string(); })
      .def_prop_ro("name", [](const SplitHandle& s) { return s.info().name; })
      .def_prop_ro("class_names", [](const SplitHandle& s) { return s.info().class_names; })
      .def_prop_ro("paths", [](const SplitHandle& s) { return s.info().paths; })
      .def("labels", [](const SplitHandle& s) { return long_array(s.info().labels); })
      .def("num_valid_long", [](const SplitHandle& s) { return long_array(s.info().num_valid_long); })
      .def(
          "targets",
          [](const SplitHandle& s) -> nb::object {
            const data::SplitInfo& i = s.info();
            if (!i.multilabel()) return nb::none();
            auto* copy = new std::vector<uint8_t>(i.targets);
            nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
            return nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(
                copy->data(), {static_cast<size_t>(i.files()), i.class_names.size()}, owner));
          },
          "Multi-label targets, uint8 [files, classes], or None for a single-label dataset.")
      .def_prop_ro("info_json", [](const SplitHandle& s) { return s.info().info.to_json().dump(); });

  nb::class_<data::SegmentLoader>(m, "_Loader", "SegmentLoader (internal: use melforge.Loader).")
      .def(
          "__init__",
          [](data::SegmentLoader* self, const std::string& folder, const std::string& split, int64_t batch_size,
             bool shuffle, uint64_t seed, int64_t prefetch, bool drop_last, int64_t pool_chunks, int in_memory) {
            data::LoaderOptions o;
            o.batch_size = batch_size;
            o.shuffle = shuffle;
            o.seed = seed;
            o.prefetch = prefetch;
            o.drop_last = drop_last;
            o.pool_chunks = pool_chunks;
            o.in_memory = in_memory;
            o.validate();
            new (self) data::SegmentLoader(data::read_split_info(data::split_file(folder, split), split), o);
          },
          nb::arg("folder"), nb::arg("split"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"),
          nb::arg("prefetch"), nb::arg("drop_last"), nb::arg("pool_chunks"),
          nb::arg("in_memory"))
      .def("__len__", &data::SegmentLoader::batches_per_epoch)
      .def_prop_ro("segments", &data::SegmentLoader::segments)
      .def_prop_ro("files_per_chunk", &data::SegmentLoader::files_per_chunk)
      .def_prop_ro("pool_bytes", &data::SegmentLoader::pool_bytes)
      .def_prop_ro("resident_bytes", &data::SegmentLoader::resident_bytes)
      .def_prop_ro("in_memory", &data::SegmentLoader::in_memory)
      .def_prop_ro("chunks_read", &data::SegmentLoader::chunks_read)
      .def("order", [](const data::SegmentLoader& l, int64_t epoch) { return long_array(l.plan(epoch).order); },
           nb::arg("epoch"), "The valid-segment positions of epoch `epoch`, int64 [N], in delivery order.")
      .def(
          "start_epoch",
          [](data::SegmentLoader& l, int64_t epoch) {
            nb::gil_scoped_release release;
            l.start_epoch(epoch);
          },
          nb::arg("epoch"))
      .def("next",
           [](data::SegmentLoader& l) -> nb::object {
             std::shared_ptr<const data::Batch> b;
             {
               nb::gil_scoped_release release;
               b = l.next();
             }
             if (!b) return nb::none();
             return batch_arrays(std::move(b), l.split().info.n_mels, l.split().info.n_frames);
           })
      .def("stop", [](data::SegmentLoader& l) {
        nb::gil_scoped_release release;
        l.stop();
      });
}

}  // namespace melforge::python
