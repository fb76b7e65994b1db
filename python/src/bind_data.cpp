/// Dataset reading and the batch loader (data/): melforge._core._Split (one split's metadata and its examples through
/// a view), melforge._core._Loader (ExampleLoader) and melforge._core._cv_splits (data/protocol/cv_splits). The public classes are melforge.Dataset and melforge.Loader
/// (python/melforge/data.py), which open these lazily per process.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "loader/example_loader.h"
#include "protocol/cv_splits.h"
#include "reader/clip_reader.h"
#include "reader/split_info.h"
#include "views/gather.h"
#include "views/split_view.h"

namespace nb = nanobind;

namespace melforge::python {

namespace {

using FloatArray = nb::ndarray<nb::numpy, float>;
using LongArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;

/// A NumPy array of `shape` owning a copy of `v`.
template <typename T>
nb::ndarray<nb::numpy, T> array_copy(const std::vector<T>& v, std::vector<size_t> shape) {
  auto* copy = new std::vector<T>(v);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(copy->data(), shape.size(), shape.data(), owner);
}

/// A NumPy int64 copy of `v`.
LongArray long_array(const std::vector<int64_t>& v) {
  auto* copy = new std::vector<int64_t>(v);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return LongArray(copy->data(), {copy->size()}, owner);
}

/// The view arguments of melforge.Dataset; tile_seconds None: the split's default tile (its short_seconds);
/// crop_seconds and aug_prob None: ViewOptions' defaults, as melforge-train's --crop-seconds and --aug-prob.
struct ViewArgs {
  std::string view = "tiles";
  std::optional<double> tile_seconds;
  double tile_hop = 0;
  double min_real = 0.5;
  std::optional<double> crop_seconds;
  std::string short_clips = "pad";
  uint64_t seed = 0;
  std::optional<double> aug_prob;

  /// The split's view (data::views::make_split_view), its options checked.
  std::shared_ptr<const data::views::View> make(const data::SplitInfo& split) const {
    data::views::ViewOptions o;
    o.view = view;
    o.tile_seconds = tile_seconds.value_or(split.info.short_seconds);
    o.tile_hop = tile_hop;
    o.min_real = min_real;
    o.crop_seconds = crop_seconds.value_or(data::views::ViewOptions{}.crop_seconds);
    o.short_clips = data::views::parse_short_clips(short_clips);
    o.aug_prob = aug_prob.value_or(data::views::ViewOptions{}.aug_prob);
    return data::views::make_split_view(split, o, !tile_seconds.has_value(), false);
  }
};

/// One split's metadata and its examples through a view, read through a ClipReader opened on first use.
class SplitHandle {
 public:
  SplitHandle(const std::string& folder, const std::string& split, ViewArgs args)
      : info_(data::read_split_info(data::split_file(folder, split), split)),
        args_(std::move(args)),
        view_(args_.make(info_)),
        pad_(data::views::pad_value(info_)) {
    set_epoch(0);
  }

  const data::SplitInfo& info() const { return info_; }
  const ViewArgs& args() const { return args_; }
  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  float pad() const { return pad_; }
  std::string view_name() const { return std::string(view_->name()); }

  void set_epoch(int64_t epoch) {
    if (epoch == epoch_ && !examples_.empty()) return;
    examples_ = view_->examples(info_.clip_frame_counts(), args_.seed, epoch, info_.group_offsets());
    epoch_ = epoch;
  }

  /// (x float32 [n_mels, length], label, clip, real frames, start) of example `index`.
  nb::tuple example(int64_t index) {
    data::views::Example e = examples_.at(static_cast<size_t>(index));
    const int64_t m = info_.info.n_mels;
    auto* out = new std::vector<float>(static_cast<size_t>(m * e.length));
    nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    {
      nb::gil_scoped_release release;
      const int64_t first = e.repeat ? 0 : e.start, count = e.repeat ? e.clip_frames : e.real;
      std::vector<float> frames(static_cast<size_t>(count * m));
      reader().read_frames(e.clip, first, count, frames.data());
      data::views::Example local = e;
      if (!e.repeat) local = {.clip = e.clip, .start = 0, .length = e.length, .real = e.real, .clip_frames = e.real};
      data::views::gather_example(local, frames.data(), m, e.length, pad_, out->data());
    }
    FloatArray x(out->data(), {static_cast<size_t>(m), static_cast<size_t>(e.length)}, owner);
    return nb::make_tuple(x, info_.labels[static_cast<size_t>(e.clip)], e.clip, e.real, e.start);
  }

 private:
  const data::ClipReader& reader() {
    std::lock_guard lock(mutex_);
    if (!reader_) reader_ = std::make_unique<data::ClipReader>(info_, 0);
    return *reader_;
  }

  data::SplitInfo info_;
  ViewArgs args_;
  std::shared_ptr<const data::views::View> view_;
  float pad_ = 0;
  int64_t epoch_ = 0;
  std::vector<data::views::Example> examples_;
  std::mutex mutex_;
  std::unique_ptr<data::ClipReader> reader_;
};

/// A batch as (x, lengths, y, clip, start, targets or None) NumPy arrays that keep the batch's buffers alive (they
/// return to the loader when the last array is released).
nb::tuple batch_arrays(std::shared_ptr<const data::Batch> b, int64_t n_mels, int64_t classes) {
  auto owner_of = [&b]() {
    auto* keep = new std::shared_ptr<const data::Batch>(b);
    return nb::capsule(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const data::Batch>*>(p); });
  };
  const auto n = static_cast<size_t>(b->size);
  FloatArray x(const_cast<float*>(b->x.data()), {n, static_cast<size_t>(n_mels), static_cast<size_t>(b->length)},
               owner_of());
  auto longs = [&](const std::vector<int64_t>& v) {
    return LongArray(const_cast<int64_t*>(v.data()), {n}, owner_of());
  };
  nb::object targets = nb::none();
  if (classes > 0)
    targets = nb::cast(
        FloatArray(const_cast<float*>(b->targets.data()), {n, static_cast<size_t>(classes)}, owner_of()));
  return nb::make_tuple(x, longs(b->lengths), longs(b->y), longs(b->clip), longs(b->start), targets, b->index);
}

void bind_split(nb::module_& m) {
  nb::class_<SplitHandle>(m, "_Split", "One split of a melforge dataset read through a view (internal: use "
                                       "melforge.Dataset).")
      .def(
          "__init__",
          [](SplitHandle* self, const std::string& folder, const std::string& split, const std::string& view,
             std::optional<double> tile_seconds, double tile_hop, double min_real, std::optional<double> crop_seconds,
             const std::string& short_clips, uint64_t seed, std::optional<double> aug_prob) {
            new (self) SplitHandle(folder, split,
                                   {view, tile_seconds, tile_hop, min_real, crop_seconds, short_clips, seed, aug_prob});
          },
          nb::arg("folder"), nb::arg("split"), nb::arg("view"), nb::arg("tile_seconds").none(), nb::arg("tile_hop"),
          nb::arg("min_real"), nb::arg("crop_seconds").none(), nb::arg("short_clips"), nb::arg("seed"),
          nb::arg("aug_prob").none() = nb::none())
      .def("__len__", &SplitHandle::size)
      .def("set_epoch", &SplitHandle::set_epoch, nb::arg("epoch"))
      .def("example", &SplitHandle::example, nb::arg("index"),
           "(x float32 [n_mels, length], label, clip row, real frames, first clip frame) of example `index`.")
      .def_prop_ro("path", [](const SplitHandle& s) { return s.info().path.string(); })
      .def_prop_ro("name", [](const SplitHandle& s) { return s.info().name; })
      .def_prop_ro("view", &SplitHandle::view_name)
      .def_prop_ro("pad_value", &SplitHandle::pad)
      .def_prop_ro("schema_version", [](const SplitHandle& s) { return s.info().schema_version; })
      .def_prop_ro("class_names", [](const SplitHandle& s) { return s.info().class_names; })
      .def_prop_ro("paths", [](const SplitHandle& s) { return s.info().paths; })
      .def("labels", [](const SplitHandle& s) { return long_array(s.info().labels); })
      .def("num_valid_long", [](const SplitHandle& s) { return long_array(s.info().num_valid_long); })
      .def("clip_frames", [](const SplitHandle& s) { return long_array(s.info().clip_frame_counts()); })
      .def("aug_copy", [](const SplitHandle& s) { return array_copy(s.info().aug_copy, {s.info().aug_copy.size()}); })
      .def("group_offsets", [](const SplitHandle& s) { return long_array(s.info().group_offsets()); })
      .def("frame_offset", [](const SplitHandle& s) { return long_array(s.info().frame_offset); })
      .def("num_samples", [](const SplitHandle& s) { return long_array(s.info().num_samples); })
      .def("clip_flags", [](const SplitHandle& s) {
        return array_copy(s.info().clip_flags, {s.info().clip_flags.size()});
      })
      .def(
          "targets",
          [](const SplitHandle& s) -> nb::object {
            const data::SplitInfo& i = s.info();
            if (!i.multilabel()) return nb::none();
            return nb::cast(array_copy(i.targets, {static_cast<size_t>(i.files()), i.class_names.size()}));
          },
          "Multi-label targets, uint8 [files, classes], or None for a single-label dataset.")
      .def_prop_ro("info_json", [](const SplitHandle& s) { return s.info().info.to_json().dump(); });
}

/// The ExampleLoader of `folder`/`split` through `args`'s view; clips are batched by length under batch_seconds of
/// frames (None: ViewOptions' default).
void make_loader(void* where, const std::string& folder, const std::string& split, const ViewArgs& args,
                 data::LoaderOptions o, std::optional<double> batch_seconds) {
  data::SplitInfo info = data::read_split_info(data::split_file(folder, split), split);
  std::shared_ptr<const data::views::View> view = args.make(info);
  if (view->name() == "clips") {
    data::views::ViewOptions defaults;
    defaults.view = "clips";
    defaults.clip_batch_seconds = batch_seconds.value_or(defaults.clip_batch_seconds);
    const data::views::FrameRate rate = data::views::split_frame_rate(info);
    defaults.validate(rate);
    o.frame_budget = rate.frames(defaults.clip_batch_seconds);
  }
  o.validate();
  const float pad = data::views::pad_value(info);
  new (where) data::ExampleLoader(std::move(info), std::move(view), args.seed, o, pad);
}

/// Per test fold of `folder` (data::cv_splits with `val` parsed as --val, `seed`, `folds` as --folds, empty: every
/// fold): {"fold", "val_fold" (None with ratio), "train", "val", "test"}, each a list of (split name, row) tuples.
nb::list cv_splits(const std::string& folder, const std::string& val, uint64_t seed, const std::vector<int64_t>& folds) {
  data::CvOptions o;
  data::parse_val_option(val, o);
  o.seed = seed;
  o.folds = folds;
  std::sort(o.folds.begin(), o.folds.end());
  const data::FoldPool pool = data::read_fold_pool(folder);
  nb::list out;
  for (const data::CvFold& f : data::cv_splits(pool, o)) {
    const auto members = [&](const std::vector<int64_t>& indices) {
      nb::list list;
      for (const int64_t i : indices) {
        const auto u = static_cast<std::size_t>(i);
        list.append(nb::make_tuple(data::kSplitNames[static_cast<std::size_t>(pool.split[u])], pool.row[u]));
      }
      return list;
    };
    nb::dict d;
    d["fold"] = f.fold;
    d["val_fold"] = f.val_fold > 0 ? nb::cast(f.val_fold) : nb::none();
    d["train"] = members(f.train);
    d["val"] = members(f.val);
    d["test"] = members(f.test);
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_data(nb::module_& m) {
  bind_split(m);
  m.def("_cv_splits", &cv_splits, nb::arg("folder"), nb::arg("val"), nb::arg("seed"), nb::arg("folds"),
        "Cross-validation membership of a dataset with folds (internal: use melforge.cv_splits).");
  nb::class_<data::ExampleLoader>(m, "_Loader", "ExampleLoader (internal: use melforge.Loader).")
      .def(
          "__init__",
          [](data::ExampleLoader* self, const std::string& folder, const std::string& split, const std::string& view,
             std::optional<double> tile_seconds, double tile_hop, double min_real, std::optional<double> crop_seconds,
             const std::string& short_clips, uint64_t view_seed, int64_t batch_size, bool shuffle, uint64_t seed,
             int64_t prefetch, bool drop_last, int64_t pool_chunks, int in_memory,
             std::optional<double> batch_seconds, std::optional<double> aug_prob) {
            data::LoaderOptions o;
            o.batch_size = batch_size;
            o.shuffle = shuffle;
            o.seed = seed;
            o.prefetch = prefetch;
            o.drop_last = drop_last;
            o.pool_chunks = pool_chunks;
            o.in_memory = in_memory;
            make_loader(self, folder, split,
                        {view, tile_seconds, tile_hop, min_real, crop_seconds, short_clips, view_seed, aug_prob}, o,
                        batch_seconds);
          },
          nb::arg("folder"), nb::arg("split"), nb::arg("view"), nb::arg("tile_seconds").none(), nb::arg("tile_hop"),
          nb::arg("min_real"), nb::arg("crop_seconds").none(), nb::arg("short_clips"), nb::arg("view_seed"),
          nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"), nb::arg("prefetch"), nb::arg("drop_last"),
          nb::arg("pool_chunks"), nb::arg("in_memory"), nb::arg("batch_seconds").none(),
          nb::arg("aug_prob").none() = nb::none())
      .def("__len__", &data::ExampleLoader::batches_per_epoch)
      .def_prop_ro("examples", &data::ExampleLoader::size)
      .def_prop_ro("frame_budget", [](const data::ExampleLoader& l) { return l.options().frame_budget; })
      .def_prop_ro("pool_bytes", &data::ExampleLoader::pool_bytes)
      .def_prop_ro("resident_bytes", &data::ExampleLoader::resident_bytes)
      .def_prop_ro("in_memory", &data::ExampleLoader::in_memory)
      .def_prop_ro("chunks_read", &data::ExampleLoader::chunks_read)
      .def("order", [](const data::ExampleLoader& l, int64_t epoch) { return long_array(l.order(epoch)); },
           nb::arg("epoch"), "The example indices of epoch `epoch`, int64 [E], in delivery order.")
      .def(
          "start_epoch",
          [](data::ExampleLoader& l, int64_t epoch) {
            nb::gil_scoped_release release;
            l.start_epoch(epoch);
          },
          nb::arg("epoch"))
      .def("next",
           [](data::ExampleLoader& l) -> nb::object {
             std::shared_ptr<const data::Batch> b;
             {
               nb::gil_scoped_release release;
               b = l.next();
             }
             if (!b) return nb::none();
             const data::SplitInfo& s = l.split();
             return batch_arrays(std::move(b), s.info.n_mels,
                                 s.multilabel() ? static_cast<int64_t>(s.class_names.size()) : 0);
           })
      .def("stop", [](data::ExampleLoader& l) {
        nb::gil_scoped_release release;
        l.stop();
      });
}

}  // namespace melforge::python
