"""melforge.build: run a melforge-build from Python with the builder's own options, parser and code."""
import json
import os

from . import _core

__all__ = ["build"]


def _text(value):
    """A keyword's value as the command line spells it: paths through os.fspath, sequences joined by commas,
    floats in their shortest round-trip form."""
    if isinstance(value, (str, bytes, os.PathLike)):
        value = os.fspath(value)
        return value.decode() if isinstance(value, bytes) else value
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def build(output, input=None, manifest=None, **options):
    """Build a melforge dataset (train.h5, val.h5, test.h5 and build_report.json) from an audio corpus, exactly as
    ``melforge-build`` does: the same option registration, parser, validation and pipeline (C++), run in this
    process.

    Parameters
    ----------
    output : str or os.PathLike
        Output folder (``--output``): absent, empty, or pass ``overwrite=True``.
    input : str or os.PathLike, optional
        Corpus folder, ``root/<class>/**/<file>`` or ``root/{train,val,test}/<class>/...`` (``--input``).
    manifest : str or os.PathLike, optional
        CSV manifest ``path,label[,split]`` (``--manifest``); give exactly one of ``input`` and ``manifest``.
    **options
        Any flag of ``melforge-build --help``, spelled with underscores: ``n_fft=512``, ``hop_length=160``,
        ``sample_rate=16000``, ``n_mels=64``, ``norm="slaney"`` (torchaudio's name of ``--mel-norm``),
        ``long_seconds=2``, ``split="0.8,0.1,0.1"`` or ``split=(0.8, 0.1, 0.1)``, ``max_ram="1G"``,
        ``config="build.ini"``, ``device="cpu"``, ``threads=4``. A switch (``overwrite``, ``strict``, ``quiet``,
        ``include_hidden``) takes True or False; a true/false flag (``center``, ``shuffle``) takes a bool; a value
        of None leaves the flag at its default. ``help=True`` prints the options and returns None.
        A dataset's own metadata and protocol, as ``melforge-build`` reads them (docs/FORMAT.md, "Named columns",
        "Folds, groups and grouped splits"): ``layout="esc50"`` (with ``input`` the dataset's root),
        ``columns="path=fname,label=labels,split=split"``, ``label_sep=","``, ``audio_root=...``,
        ``classes="vocabulary.csv"`` (class order), ``group_by="src_file"`` or a regular expression,
        ``folds=5``. Speaker verification as the recipes build it: ``speed_speakers=(0.9, 1.1)`` (every train file
        once more per factor, as the new speaker ``<class>_sp<factor>``), ``split_by="class",
        test_trials="veri_test2.txt"`` (the list's speakers as the test split; copied to ``output/trials.txt``).

    Returns
    -------
    dict
        The build report, as written to ``output/build_report.json`` (files written and skipped, per-split
        counts, the effective configuration, timings in seconds, throughput).

    Raises
    ------
    melforge.InvalidArgument
        An unknown keyword (the message names the nearest flag: "did you mean --n-fft?"), a bad value, or bad
        folders; raised before any work.
    melforge.StrictError
        With ``strict=True``, the first file the build would skip (named in the message).
    melforge.IoError, melforge.AudioError, melforge.Error
        Failures during the build; nothing in ``output`` is replaced and the temporary files are removed.
    KeyboardInterrupt
        Ctrl-C stops the build at the next file or batch boundary (within about one batch of work); its temporary
        files are removed and nothing in ``output`` is replaced.

    Notes
    -----
    Progress and log lines are written by the C++ code to the process's standard error (file descriptor 2), as the
    binary prints them; ``quiet=True`` silences the progress. The GIL is released while the build runs.
    """
    keywords = [("output", _text(output), False)]
    if input is not None:
        keywords.append(("input", _text(input), False))
    if manifest is not None:
        keywords.append(("manifest", _text(manifest), False))
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            keywords.append((name, "true" if value else "false", True))
        else:
            keywords.append((name, _text(value), False))
    help_text, report = _core._build(keywords)
    if help_text:
        print(help_text)
        return None
    return json.loads(report)
