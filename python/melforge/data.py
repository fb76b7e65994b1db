"""melforge datasets in Python: `Dataset` (map-style, one example of a view per item) and `Loader` (batches assembled
by a C++ thread, chunk-aware). Both read the HDF5 split files `melforge-build` writes (docs/FORMAT.md) through the
same C++ reader and views as `melforge-train` (data/ in the repository).

A split stores each clip whole (schema 3) or, in datasets of schema 1 and 2, each file's valid short segments; a
*view* chooses how examples are cut from the clips when reading (docs/FORMAT.md, "Views"):

- ``"tiles"``: windows of `tile_seconds` every `tile_hop` over each clip, the last one padded (masked); a window with
  fewer than `min_real` of its frames real is not made unless it is the clip's only one.
- ``"crops"``: one window of `crop_seconds` per clip per epoch at a seeded random start; a shorter clip is padded
  (``short_clips="pad"``) or repeated (``"repeat"``). A split built with ``--augment-copies`` gives one crop per
  utterance (its clean copy and augmented copies, a *group*) per epoch: from one of the augmented copies, chosen
  uniformly, with probability `aug_prob`, else from the clean copy.
- ``"clips"``: whole clips; the Loader batches them by similar length under a frame budget.

Padding holds the dataset's silence value (the log of zero energy) and is never real: every example has its real
frames first, then padding, and carries its real length (`length`); batches carry `lengths` and a boolean `mask`.
"""
import collections
import json
import os

import numpy as np

from . import _core

__all__ = ["Dataset", "Loader", "Example", "Batch"]

_VIEWS = ("tiles", "crops", "clips")
_SHORT_CLIPS = ("pad", "repeat")


class Example(collections.namedtuple("Example", ["x", "label", "clip"])):
    """One example of a Dataset: unpacks as ``(x, label, clip)`` (as the segments of earlier versions did), with more
    as attributes.

    Attributes
    ----------
    x : numpy.ndarray
        float32 [n_mels, T], the log-mel values (float16 datasets converted): the first `length` frames are real, the
        rest the silence value.
    label : int
        Class index into `class_names` (of the example's clip).
    clip : int
        Row of the example's clip (file) in the split (index into `paths`, `labels`, `clip_frames`).
    length : int
        Real frames, in [1, T].
    start : int
        First clip frame of the example (a repeated crop reads the clip from there, round and round).
    targets : numpy.ndarray or None
        Multi-label targets of the clip, uint8 [classes]; None for a single-label dataset.
    """

    def __new__(cls, x, label, clip, length=None, start=0, targets=None):
        self = super().__new__(cls, x, label, clip)
        self.length = int(x.shape[-1] if length is None else length)
        self.start = int(start)
        self.targets = targets
        return self

    @property
    def mask(self):
        """bool [T]: True for the real frames."""
        return np.arange(self.x.shape[-1]) < self.length


class Batch(collections.namedtuple("Batch", ["x", "y", "clip"])):
    """One batch of a Loader: unpacks as ``(x, y, clip)`` (as in earlier versions: x, labels, file rows), with more
    as attributes. Arrays are torch tensors or NumPy arrays (the Loader's `as_torch`).

    Attributes
    ----------
    x : float32 [B, n_mels, T]
        T = the batch's longest example (tiles and crops: their length); row i's first lengths[i] frames are real,
        the rest the silence value.
    y : int64 [B]
        Class index of each row's clip.
    clip : int64 [B]
        Row of each example's clip in the split.
    lengths : int64 [B]
        Real frames per row, each >= 1.
    mask : bool [B, T]
        True for the real frames (``arange(T) < lengths[:, None]``).
    start : int64 [B]
        First clip frame of each example.
    targets : float32 [B, classes] or None
        Multi-label targets of each row's clip (0 or 1); None for a single-label dataset.
    index : int
        Index of the batch within its epoch.
    """

    def __new__(cls, x, y, clip, lengths=None, mask=None, start=None, targets=None, index=0):
        self = super().__new__(cls, x, y, clip)
        self.lengths = lengths
        self.mask = mask
        self.start = start
        self.targets = targets
        self.index = int(index)
        return self


class Dataset:
    """Map-style view of one split of a melforge dataset: the examples of a view over its clips, clip by clip.

    Parameters
    ----------
    folder : str or os.PathLike
        Output folder of `melforge-build` (holding train.h5, val.h5, test.h5).
    split : str
        "train", "val" or "test".
    view : str
        "tiles" (default), "crops" or "clips" (module docstring). A dataset of schema 1 or 2 is read only as tiles of
        exactly its stored segments (n_frames frames, hop n_frames: the valid short segments, in file, long, short
        order); another view, `tile_seconds` or `tile_hop` raise InvalidArgument naming the schema.
    tile_seconds : float or None
        Tile length in seconds; None: the dataset's default tile (`info["short_seconds"]`, `n_frames` frames, the
        model input width).
    tile_hop : float or None
        Seconds between tile starts, in (0, tile_seconds]; None: tiles side by side.
    min_real : float
        Fraction in [0, 1]: a tile with fewer real frames than min_real * tile is not made unless it is the clip's only
        one. 0 covers every frame of every clip (evaluation).
    crop_seconds : float or None
        Crop length in seconds; None: 2 s, the default of melforge-train's --crop-seconds.
    short_clips : str
        "pad" or "repeat": the crop of a clip shorter than the crop.
    seed : int
        Seed of the crops (>= 0); a crop is a function of (seed, epoch, clip) only (with copies: of (seed, epoch,
        group)).
    aug_prob : float or None
        Crops of a split with augmented copies (`aug_copy`): probability in [0, 1] that a group's crop comes from one
        of its augmented copies; None: 0.6, the default of melforge-train's --aug-prob. Without copies it changes
        nothing: one crop per clip, as before.

    Item `i` (0 <= i < len(ds), negative indices count from the end) is an `Example`: it unpacks as
    ``(x, label, clip)`` with x float32 [n_mels, T] (T = the tile or crop length, or the clip's frames), and has
    `length` (real frames), `start`, `targets` and `mask`. Frames are hop_length samples at sample_rate Hz.

    Crops change with the epoch: `set_epoch(e)` picks the epoch items are drawn for (default 0).

    The HDF5 file is opened on first read, once per process: a Dataset pickles without an open handle, so it works
    in `torch.utils.data.DataLoader(num_workers=...)` workers (each opens its own; torch's default collate keeps
    ``(x, label, clip)`` and needs one T, so use `Loader` for lengths, masks and whole clips). Reading one example
    inflates the HDF5 chunks holding it; for random order at speed use `Loader`.

    Raises
    ------
    melforge.IoError
        The folder or the split file does not exist (the message names the path).
    melforge.FormatError
        The file is not a melforge dataset of a supported schema.
    melforge.InvalidArgument
        `split` is not train, val or test; a view argument is out of range or not available for the schema.
    """

    def __init__(self, folder, split, view="tiles", tile_seconds=None, tile_hop=None, min_real=0.5, crop_seconds=None,
                 short_clips="pad", seed=0, aug_prob=None):
        if view not in _VIEWS:
            raise _core.InvalidArgument(f"view must be one of {', '.join(_VIEWS)}, got {view!r}")
        if short_clips not in _SHORT_CLIPS:
            raise _core.InvalidArgument(f"short_clips must be 'pad' or 'repeat', got {short_clips!r}")
        if int(seed) < 0:
            raise _core.InvalidArgument(f"seed must be >= 0, got {seed}")
        self.folder = os.fspath(folder)
        self.split = str(split)
        self._view_args = {"view": view, "tile_seconds": None if tile_seconds is None else float(tile_seconds),
                           "tile_hop": 0.0 if tile_hop is None else float(tile_hop), "min_real": float(min_real),
                           "crop_seconds": None if crop_seconds is None else float(crop_seconds),
                           "short_clips": short_clips, "seed": int(seed),
                           "aug_prob": None if aug_prob is None else float(aug_prob)}
        self.epoch = 0
        self._native = None
        self._pid = None
        self._targets = None
        self._handle()

    def _handle(self):
        if self._native is None or self._pid != os.getpid():
            self._native = _core._Split(self.folder, self.split, **self._view_args)
            self._native.set_epoch(self.epoch)
            self._pid = os.getpid()
            self._targets = self._native.targets()
        return self._native

    def __getstate__(self):
        return {"folder": self.folder, "split": self.split, "view_args": self._view_args, "epoch": self.epoch}

    def __setstate__(self, state):
        self.folder = state["folder"]
        self.split = state["split"]
        self._view_args = state["view_args"]
        self.epoch = state["epoch"]
        self._native = None
        self._pid = None
        self._targets = None

    def set_epoch(self, epoch):
        """Sets the epoch (int >= 0) the items are drawn for: crops change with it, tiles and clips do not."""
        if int(epoch) < 0:
            raise _core.InvalidArgument(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)
        self._handle().set_epoch(self.epoch)

    def __len__(self):
        """Number of examples of the view (schema 1/2 tiles: the valid short segments)."""
        return len(self._handle())

    def __getitem__(self, index):
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"example {index} is outside a dataset of {n} examples")
        x, label, clip, length, start = self._handle().example(i)
        targets = None if self._targets is None else self._targets[clip]
        return Example(x, label, clip, length, start, targets)

    @property
    def path(self):
        """Path of the split's HDF5 file (str)."""
        return self._handle().path

    @property
    def view(self):
        """The view's name: "tiles", "crops" or "clips"."""
        return self._handle().view

    @property
    def view_args(self):
        """The view arguments as given (dict; None: the dataset's default)."""
        return dict(self._view_args)

    @property
    def schema_version(self):
        """The split file's schema version (int: 1, 2 or 3)."""
        return self._handle().schema_version

    @property
    def pad_value(self):
        """The value of padded frames: the log of zero energy under the dataset's parameters (float)."""
        return self._handle().pad_value

    @property
    def class_names(self):
        """Class names (list of str), indexed by label."""
        return self._handle().class_names

    @property
    def info(self):
        """The root attributes of the split file (dict: sample_rate in Hz, n_fft, hop_length in samples, n_mels,
        n_frames, short_seconds, max_seconds, dtype, log, ...; num_long and num_short 0 in schema 3; ``features``
        "mel" or "fbank", and with "fbank" the Kaldi filterbank's parameters under torchaudio's names: num_mel_bins,
        frame_length, frame_shift, window_type, ...; docs/FORMAT.md)."""
        return json.loads(self._handle().info_json)

    @property
    def features(self):
        """The feature front-end the split holds (str): "mel" (torchaudio's MelSpectrogram and a log) or "fbank"
        (Kaldi's filterbank as torchaudio.compliance.kaldi.fbank computes it; its parameters are in ``info``)."""
        return self.info["features"]

    @property
    def paths(self):
        """Path of each clip's audio file relative to the corpus root (list of str), [clips]."""
        return self._handle().paths

    @property
    def aug_copy(self):
        """Copy index of each clip (numpy int32 [clips]: 0 clean, k augmented copy k), empty without ``aug_copy``."""
        return self._handle().aug_copy()

    @property
    def group_offsets(self):
        """The groups of copies (numpy int64 [groups + 1]): group g is clips [offsets[g], offsets[g + 1]), a clean
        clip and its augmented copies; every clip its own group without ``aug_copy``."""
        return self._handle().group_offsets()

    @property
    def labels(self):
        """Class index per clip, int64 ndarray [clips]."""
        return self._handle().labels()

    @property
    def targets(self):
        """Multi-label targets, uint8 ndarray [clips, classes] (1 where the clip carries the class; row
        ``targets[clip]`` belongs to an example's ``clip``), or None when the dataset is single-label (no ``targets``
        matrix, docs/FORMAT.md)."""
        return self._handle().targets()

    @property
    def clip_frames(self):
        """Frames of each clip, int64 ndarray [clips] (schema 1/2: its valid short segments side by side)."""
        return self._handle().clip_frames()

    @property
    def num_samples(self):
        """Samples of each stored clip at sample_rate, int64 ndarray [clips] (schema 1/2: num_valid_long *
        long_samples)."""
        return self._handle().num_samples()

    @property
    def clip_flags(self):
        """Flags of each clip, uint8 ndarray [clips]: 1 the clip was shorter than one STFT frame and padded to one,
        2 it was capped by the build's --max-seconds (schema 1/2: 0)."""
        return self._handle().clip_flags()

    @property
    def num_valid_long(self):
        """Schema 1/2: long segments that hold audio per file, int64 ndarray [files], each in [1, num_long]; empty
        for schema 3."""
        return self._handle().num_valid_long()

    def __repr__(self):
        return f"melforge.Dataset({self.folder!r}, {self.split!r}, view={self.view!r}): {len(self)} examples"


def _torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Loader:
    """Batches of a Dataset's examples (its view), assembled by a C++ background thread.

    Parameters
    ----------
    dataset : Dataset
        The split and view to read (only its folder, split and view arguments are used: the loader opens the file
        itself).
    batch_size : int
        Examples per batch, an integer >= 1 (whole clips: at most this many). With drop_last, at most the split's
        examples: a loader that could serve no batch is refused (InvalidArgument), never silently empty.
    shuffle : bool
        Chunk-aware shuffle (below), or whole-clip batches in random order; False keeps the Dataset's order (whole
        clips: by ascending length).
    seed : int
        Seed of the shuffle (>= 0); the order is a function of (seed, epoch) only, whatever `prefetch` is.
    prefetch : int
        Batches kept ready ahead of the consumer, >= 0 (0: each batch is assembled when asked for).
    drop_last : bool
        Drop the final batch of an epoch when it is smaller than batch_size (tiles and crops only).
    pool_chunks : int
        HDF5 chunks per shuffle pool, >= 1 (default 16).
    in_memory : bool or "auto"
        Keep the split's frames in RAM as float32 after the first epoch has read them (each chunk once): later epochs
        gather batches from RAM. "auto": when they take at most half of the available memory (`resident_bytes`).
        The order is the same either way.
    as_torch : bool or None
        Yield torch tensors (zero-copy `torch.from_numpy`) when True, NumPy arrays when False; None: torch tensors
        when torch can be imported.
    batch_seconds : float or None
        The clips view: padded frames a batch may hold (rows x its longest clip), as seconds (None: 128 s); a longer
        clip is alone in its batch.

    Iterating yields `Batch` objects that unpack as ``(x, y, clip)``: x float32 [B, n_mels, T], y int64 [B] class
    indices, clip int64 [B] rows of the examples' clips in the split; B = batch_size except in a smaller last batch
    (whole clips: batches of similar length under the budget). They also carry `lengths` int64 [B], `mask` bool
    [B, T], `start` int64 [B], `targets` float32 [B, classes] (multi-label) and `index`. T is the tile or crop length,
    or for whole clips the batch's longest clip; shorter rows are padded with the silence value and masked. The arrays
    own their memory until released (then the loader reuses it); keep them as long as needed.

    Shuffle: the clips are grouped by HDF5 chunk (about 1 MiB by default), the chunks are permuted, taken
    `pool_chunks` at a time into a pool, and the pool's examples are permuted. Each chunk is thus inflated about once
    per epoch, where a uniformly random order inflates a whole chunk per example. What this gives up: a batch draws
    from at most pool_chunks chunks, and clips stored in one chunk arrive in the same pool. Memory, streamed: up to
    three pools of float32 frames (`pool_bytes` each); in RAM: `resident_bytes` once the first epoch has read the
    file; plus prefetch + 1 batches and those the caller holds.

    Epochs: each `iter(loader)` runs the epoch `loader.epoch` and then increments it, so consecutive loops get new
    orders and new crops (the crops from the Dataset's seed, the order from this seed); `set_epoch(e)` sets the epoch
    of the next iteration (as with DistributedSampler). Starting a new iteration stops an unfinished one. The GIL is
    released while waiting for a batch.
    """

    def __init__(self, dataset, batch_size=64, shuffle=True, seed=0, prefetch=2, drop_last=False, pool_chunks=16,
                 in_memory="auto", as_torch=None, batch_seconds=None):
        if not isinstance(dataset, Dataset):
            raise _core.InvalidArgument(f"Loader needs a melforge.Dataset, got {type(dataset).__name__}")
        if int(seed) < 0:
            raise _core.InvalidArgument(f"seed must be >= 0, got {seed}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise _core.InvalidArgument(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if batch_size < 1:
            raise _core.InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.epoch = 0
        self._generation = 0
        self._as_torch = _torch_available() if as_torch is None else bool(as_torch)
        if in_memory == "auto":
            resident = -1
        elif isinstance(in_memory, bool):
            resident = int(in_memory)
        else:
            raise _core.InvalidArgument(f"in_memory must be True, False or 'auto', got {in_memory!r}")
        view_args = dict(dataset.view_args)
        view_args["view_seed"] = view_args.pop("seed")
        self._native = _core._Loader(dataset.folder, dataset.split, **view_args, batch_size=self.batch_size,
                                     shuffle=bool(shuffle), seed=int(seed), prefetch=int(prefetch),
                                     drop_last=bool(drop_last), pool_chunks=int(pool_chunks), in_memory=resident,
                                     batch_seconds=None if batch_seconds is None else float(batch_seconds))
        examples = len(dataset)
        if examples > 0 and len(self._native) == 0:
            raise _core.InvalidArgument(
                f"batch_size {self.batch_size} is larger than the {examples} examples of split "
                f"'{dataset.split}' with drop_last=True: every epoch would yield no batch; lower batch_size to at "
                f"most {examples} or pass drop_last=False")

    def __len__(self):
        """Batches per epoch: ceil(examples / batch_size), or floor with drop_last; whole clips: the length batches."""
        return len(self._native)

    @property
    def in_memory(self):
        """Whether the frames are held in RAM after the first epoch (bool)."""
        return self._native.in_memory

    @property
    def resident_bytes(self):
        """Bytes of the split's float32 frames (what in_memory holds)."""
        return self._native.resident_bytes

    @property
    def pool_bytes(self):
        """Bytes of float32 frames in one shuffle pool, at most."""
        return self._native.pool_bytes

    def set_epoch(self, epoch):
        """Sets the epoch (int >= 0) the next iteration runs; with the seeds it picks the order and the crops."""
        if int(epoch) < 0:
            raise _core.InvalidArgument(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        self._generation += 1
        generation = self._generation
        native = self._native
        native.start_epoch(epoch)
        if self._as_torch:
            import torch
            convert = torch.from_numpy
        else:
            def convert(a):
                return a
        try:
            while True:
                batch = native.next()
                if batch is None:
                    return
                x, lengths, y, clip, start, targets, index = batch
                mask = np.arange(x.shape[2]) < lengths[:, None]
                yield Batch(convert(x), convert(y), convert(clip), lengths=convert(lengths), mask=convert(mask),
                            start=convert(start), targets=None if targets is None else convert(targets),
                            index=index)
        finally:
            if self._generation == generation:
                native.stop()
