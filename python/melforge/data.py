"""melforge datasets in Python: `Dataset` (map-style, one valid short segment per item) and `Loader` (batches
assembled by a C++ thread with a chunk-aware shuffle). Both read the HDF5 split files `melforge-build` writes
(docs/FORMAT.md) through the same C++ reader as `melforge-train` (data/ in the repository)."""
import json
import os

from . import _core

__all__ = ["Dataset", "Loader"]


class Dataset:
    """Map-style view of one split of a melforge dataset: its valid short segments, file by file.

    Parameters
    ----------
    folder : str or os.PathLike
        Output folder of `melforge-build` (holding train.h5, val.h5, test.h5).
    split : str
        "train", "val" or "test".

    Item `i` (0 <= i < len(ds), negative indices count from the end) is a tuple
    ``(spectrogram, label, file_index)``:

    - spectrogram: float32 ndarray [n_mels, n_frames], the stored log-mel values (float16 datasets converted to
      float32); n_frames frames of hop_length samples at sample_rate Hz.
    - label: int, class index into `class_names`.
    - file_index: int, row of the segment's audio file in the split (index into `paths`, `labels`).

    Segments are ordered by file, then long segment, then short segment; only long segments below
    num_valid_long[file] (those holding audio) are included.

    The HDF5 file is opened on first read, once per process: a Dataset pickles without an open handle, so it works
    in `torch.utils.data.DataLoader(num_workers=...)` workers (each opens its own). Reading a single segment inflates
    the HDF5 chunk holding it; for random order at speed use `Loader`.

    Raises
    ------
    melforge.IoError
        The folder or the split file does not exist (the message names the path).
    melforge.FormatError
        The file is not a melforge dataset of a supported schema.
    melforge.InvalidArgument
        `split` is not train, val or test.
    """

    def __init__(self, folder, split):
        self.folder = os.fspath(folder)
        self.split = str(split)
        self._native = None
        self._pid = None
        self._handle()

    def _handle(self):
        if self._native is None or self._pid != os.getpid():
            self._native = _core._Split(self.folder, self.split)
            self._pid = os.getpid()
        return self._native

    def __getstate__(self):
        return {"folder": self.folder, "split": self.split}

    def __setstate__(self, state):
        self.folder = state["folder"]
        self.split = state["split"]
        self._native = None
        self._pid = None

    def __len__(self):
        """Number of valid short segments: sum over files of num_valid_long * num_short."""
        return len(self._handle())

    def __getitem__(self, index):
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"segment {index} is outside a dataset of {n} segments")
        return self._handle().segment(i)

    @property
    def path(self):
        """Path of the split's HDF5 file (str)."""
        return self._handle().path

    @property
    def class_names(self):
        """Class names (list of str), indexed by label."""
        return self._handle().class_names

    @property
    def info(self):
        """The root attributes of the split file (dict: sample_rate in Hz, n_fft, hop_length in samples, n_mels,
        n_frames, num_long, num_short, dtype, log, ...; docs/FORMAT.md)."""
        return json.loads(self._handle().info_json)

    @property
    def paths(self):
        """Path of each audio file relative to the corpus root (list of str), [files]."""
        return self._handle().paths

    @property
    def labels(self):
        """Class index per file, int64 ndarray [files]."""
        return self._handle().labels()

    @property
    def targets(self):
        """Multi-label targets, uint8 ndarray [files, classes] (1 where the file carries the class; row
        ``targets[file_index]`` belongs to a segment's ``file_index``), or None when the dataset is single-label (no
        ``targets`` matrix, docs/FORMAT.md)."""
        return self._handle().targets()

    @property
    def num_valid_long(self):
        """Long segments that hold audio per file, int64 ndarray [files], each in [1, num_long]."""
        return self._handle().num_valid_long()

    def __repr__(self):
        return f"melforge.Dataset({self.folder!r}, {self.split!r}): {len(self)} segments"


def _torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Loader:
    """Batches of a Dataset's valid short segments, assembled by a C++ background thread.

    Parameters
    ----------
    dataset : Dataset
        The split to read (only its folder and split name are used: the loader opens the file itself).
    batch_size : int
        Segments per batch, >= 1.
    shuffle : bool
        Chunk-aware shuffle (below); False keeps the Dataset's order.
    seed : int
        Seed of the shuffle (>= 0); the order is a function of (seed, epoch) only, whatever `prefetch` is.
    prefetch : int
        Batches kept ready ahead of the consumer, >= 0 (0: each batch is assembled when asked for).
    drop_last : bool
        Drop the final batch of an epoch when it is smaller than batch_size.
    pool_chunks : int
        HDF5 chunks per shuffle pool, >= 1 (default 16).
    in_memory : bool or "auto"
        Keep the split's valid segments in RAM as float32 after the first epoch has read them (each chunk once):
        later epochs copy batches from RAM. "auto": when they take at most half of the available memory
        (`resident_bytes`). The order is the same either way; in RAM, a pool_chunks of at least the number of chunks
        gives a uniform permutation at no extra memory.
    as_torch : bool or None
        Yield torch tensors (zero-copy `torch.from_numpy`) when True, NumPy arrays when False; None: torch tensors
        when torch can be imported.

    Iterating yields ``(x, y, file_index)``: x float32 [B, n_mels, n_frames] (log-mel values), y int64 [B] class
    indices, file_index int64 [B] rows of the segments' files in the split; B = batch_size except in a smaller last
    batch. The arrays own their memory until released (then the loader reuses it); keep them as long as needed.

    Shuffle: the files are grouped by HDF5 chunk (a chunk holds whole files, about 1 MiB by default), the chunks are
    permuted, taken `pool_chunks` at a time into a pool, and the pool's segments are permuted. Each chunk is thus
    inflated once per epoch, where a uniformly random order inflates a whole chunk per segment. What this gives up:
    a batch draws from at most pool_chunks chunks, and files stored in one chunk arrive in the same pool. Memory,
    streamed: up to three pools of float32 spectrograms (`pool_bytes` each); in RAM: `resident_bytes` once the first
    epoch has read the file; plus prefetch + 1 batches and those the caller holds.

    Epochs: each `iter(loader)` runs the epoch `loader.epoch` and then increments it, so consecutive loops get new
    orders; `set_epoch(e)` sets the epoch of the next iteration (as with DistributedSampler). Starting a new
    iteration stops an unfinished one. The GIL is released while waiting for a batch.
    """

    def __init__(self, dataset, batch_size=64, shuffle=True, seed=0, prefetch=2, drop_last=False, pool_chunks=16,
                 in_memory="auto", as_torch=None):
        if not isinstance(dataset, Dataset):
            raise _core.InvalidArgument(f"Loader needs a melforge.Dataset, got {type(dataset).__name__}")
        if int(seed) < 0:
            raise _core.InvalidArgument(f"seed must be >= 0, got {seed}")
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
        self._native = _core._Loader(dataset.folder, dataset.split, self.batch_size, bool(shuffle), int(seed),
                                     int(prefetch), bool(drop_last), int(pool_chunks), resident)

    def __len__(self):
        """Batches per epoch: ceil(segments / batch_size), or floor with drop_last."""
        return len(self._native)

    @property
    def in_memory(self):
        """Whether the segments are held in RAM after the first epoch (bool)."""
        return self._native.in_memory

    @property
    def resident_bytes(self):
        """Bytes of float32 spectrograms of the split's valid segments (what in_memory holds)."""
        return self._native.resident_bytes

    @property
    def pool_bytes(self):
        """Bytes of float32 spectrograms in one shuffle pool."""
        return self._native.pool_bytes

    def set_epoch(self, epoch):
        """Sets the epoch (int >= 0) the next iteration runs; it picks the shuffle order with the seed."""
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
                x, y, f = batch
                yield convert(x), convert(y), convert(f)
        finally:
            if self._generation == generation:
                native.stop()
