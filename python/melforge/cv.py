"""Cross-validation membership of a dataset with folds (issue 30): `melforge.cv_splits`, the same split membership as
`melforge-train cv` (both compute it through the C++ function data::cv_splits, data/protocol/cv_splits.h)."""
from . import _core

__all__ = ["cv_splits"]


def cv_splits(data_dir, val="fold-offset", seed=42, folds=None):
    """Per test fold of the dataset folder `data_dir` (built with folds: `melforge-build --folds K`, a manifest's fold
    column or a `--layout` with folds), the files of its train, val and test splits, as `melforge-train cv --val VAL
    --seed SEED --folds FOLDS` uses them.

    The three split files are pooled, whatever split each file was stored in: test is fold f; val is the next fold
    that holds files (``val="fold-offset"``, fold K wraps to 1) or a share of the training folds' files
    (``val="ratio"`` for 0.1, ``"ratio:R"`` or a float R in (0, 0.5]) drawn as whole groups (the dataset's `group`;
    a file without one is a group of its own), stratified by class and seeded by `seed` (melforge-train's --seed,
    default 42) and the fold; train is the rest.

    Returns a list, one dict per test fold in fold order: ``{"fold": f, "val_fold": f2 or None (ratio), "train":
    [...], "val": [...], "test": [...]}``, each list holding ``(split_name, row)`` tuples: the file's split file
    (``"train"``, ``"val"`` or ``"test"``) and its row there (``melforge.Dataset(data_dir, split_name).paths[row]``
    is its path). Tuples rather than paths, because they name a row even when two files share a path.

    `folds`: the test folds to list (an iterable of ints), None for every fold that holds files. Raises
    melforge.FormatError for a dataset without folds, melforge.InvalidArgument for a bad `val` or a fold the
    dataset lacks."""
    if isinstance(val, (int, float)) and not isinstance(val, bool):
        val = f"ratio:{float(val)!r}"
    fold_list = [] if folds is None else [int(f) for f in folds]
    if folds is not None and not fold_list:
        raise _core.InvalidArgument("cv_splits: folds is empty (None lists every fold)")
    return _core._cv_splits(str(data_dir), str(val), int(seed), fold_list)
