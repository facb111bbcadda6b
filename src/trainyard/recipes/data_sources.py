"""The user's data files (`data.path`) and their records, whatever the format.

`data.path` is one file or a directory. The formats:

- `.jsonl`: one JSON object per line (blank lines skipped); a record is the object.
- `.txt`: the whole file is one document (a record with `text` only, no fields).
- `.parquet`: each row is a record (its columns are the fields), read in row-group batches.
- a dataset saved with `datasets.Dataset.save_to_disk` (a directory holding `state.json` and
  `dataset_info.json`), or a `DatasetDict` (`dataset_dict.json`: its `train` split, or its only
  one); each row is a record. Read with `datasets.load_from_disk` (memory-mapped Arrow).

A directory's sources (recursively, hidden names skipped; a saved dataset is one source and is
not looked into further) are read in the order of their relative paths, so the corpus is the
same on every machine that has the same files. `data_digest` hashes every source's relative
path and bytes: the key of the token caches built from them (`user_data`, `chat_data`).

Why one module: pretraining reads the `text` field, SFT the `messages`, RL the `prompt` and
`answer`; they all need the same list of files, the same order, the same fingerprint and the
same error for a file that cannot be read. Errors are `RecipeError(…, "data.path")` naming the
file (and line or row).

A dataset of the catalogue (issue 41): `data.path: $TRAINYARD_DATASET_CORPUS` (or
`${TRAINYARD_DATASET_CORPUS}/train`) is the copy the plane staged on the rank's own node, expanded
here when the files are read (`local_path`), never in the recipe: the run's recipe.yaml keeps the
variable, so an attempt on other nodes (another cache, another path) resumes the same run, and the
token cache's key (`data_digest`: paths relative to the data's root and their bytes) is the same on
every node. Only the `TRAINYARD_DATASET_` variables are expanded. A one-object dataset is staged as a
file named `data`, without a suffix: a file with none of `SUFFIXES` is read by its first bytes
(`PAR1`: parquet; `{`: JSON lines; else text), which is what `sniff` decides.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.recipes.spec import RecipeError

SUFFIXES = (".jsonl", ".txt", ".parquet")
DATASET_MARKERS = (("state.json", "dataset_info.json"), ("dataset_dict.json",))
PARQUET_BATCH = 1024  # rows per read of a parquet file
# `$TRAINYARD_DATASET_X` or `${TRAINYARD_DATASET_X}` heading a data.path, alone or before `/…`
_DATASET_VAR = re.compile(r"^\$(?:\{(TRAINYARD_DATASET_[A-Z0-9_]+)\}|(TRAINYARD_DATASET_[A-Z0-9_]+))(?=/|$)")
SNIFF_BYTES = 4096  # read of a suffixless file's head to tell its format


@dataclass(frozen=True)
class Record:
    """One record of the data: `row` (a JSON object, a parquet or dataset row) or, for a `.txt`
    file, `text` (the whole file). `where` names it in errors: 'FILE line N', 'FILE row N', 'FILE'."""

    where: str
    row: dict[str, Any] | None = None
    text: str | None = None


def is_saved_dataset(p: Path) -> bool:
    """A directory written by `datasets`' `save_to_disk` (a Dataset or a DatasetDict)."""
    return p.is_dir() and any(all((p / m).is_file() for m in marks) for marks in DATASET_MARKERS)


def _describe_formats() -> str:
    return f"{', '.join(SUFFIXES)} files or a datasets save_to_disk directory"


def dataset_variable(path: str | Path) -> str | None:
    """The `TRAINYARD_DATASET_<NAME>` variable a data.path starts with (a catalogue dataset), else None."""
    m = _DATASET_VAR.match(str(path))
    return None if m is None else m.group(1) or m.group(2)


def local_path(path: str | Path, environ: dict[str, str] | None = None) -> Path:
    """`path` on this machine: a leading `$TRAINYARD_DATASET_<NAME>` replaced by its value (the
    dataset's copy on this node), `~` expanded.

    Raises:
        RecipeError (data.path): the variable is not set (the job did not ask for the dataset).
    """
    var = dataset_variable(path)
    if var is None:
        return Path(path).expanduser()
    env = os.environ if environ is None else environ
    value = env.get(var)
    if not value:
        name = var.removeprefix("TRAINYARD_DATASET_").lower().replace("_", "-")
        raise RecipeError(f"{path}: ${var} is not set here: it is the copy of a catalogue dataset that the plane "
                          f"stages for a job that asks for it (yard submit --dataset {name}[:VERSION])", "data.path")
    return Path(value + _DATASET_VAR.sub("", str(path)))


def sniff(f: Path) -> str:
    """A suffixless file's format as its suffix: `.parquet` (starts with PAR1), `.jsonl` (its first
    non-blank byte is `{`) or `.txt`."""
    try:
        with open(f, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as e:
        raise RecipeError(f"{f}: {e.strerror or e}", "data.path") from None
    if head.startswith(b"PAR1"):
        return ".parquet"
    return ".jsonl" if head.lstrip()[:1] == b"{" else ".txt"


def file_format(f: Path) -> str:
    """A source file's format as a suffix: its own, else what `sniff` reads."""
    return f.suffix if f.suffix in SUFFIXES else sniff(f)


def data_files(path: str | Path) -> list[Path]:
    """The data's sources in their fixed order (files, or saved-dataset directories). `path` may
    start with a dataset's variable (`local_path`).

    Raises:
        RecipeError (data.path): a missing path, an unsupported file, a directory without data.
    """
    p = local_path(path)
    if p.is_file():
        if p.suffix not in SUFFIXES and (p.suffix or dataset_variable(path) is None):
            raise RecipeError(f"{p}: not a supported format ({_describe_formats()})", "data.path")
        return [p.resolve()]
    if not p.is_dir():
        raise RecipeError(f"{p}: no such file or directory", "data.path")
    if is_saved_dataset(p):
        return [p.resolve()]
    found = []
    for dirpath, dirnames, filenames in os.walk(p):
        here = Path(dirpath)
        datasets_here = [d for d in dirnames if not d.startswith(".") and is_saved_dataset(here / d)]
        for d in datasets_here:
            found.append(((here / d).relative_to(p).as_posix(), (here / d).resolve()))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in datasets_here)
        for name in filenames:
            if not name.startswith(".") and name.endswith(SUFFIXES):
                f = here / name
                found.append((f.relative_to(p).as_posix(), f.resolve()))
    if not found:
        raise RecipeError(f"{p}: no {_describe_formats()} in this directory", "data.path")
    return [f for _, f in sorted(found)]


def records(sources: list[Path]) -> Iterator[Record]:
    """Every record of the sources, in order. Raises RecipeError naming the file (and line)."""
    for src in sources:
        if src.is_dir():
            yield from _dataset_records(src)
        elif file_format(src) == ".txt":
            try:
                yield Record(str(src), text=src.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as e:
                raise RecipeError(f"{src}: not readable as UTF-8 text ({e})", "data.path") from None
        elif file_format(src) == ".parquet":
            yield from _parquet_records(src)
        else:
            yield from _jsonl_records(src)


def _jsonl_records(f: Path) -> Iterator[Record]:
    try:
        fh = open(f, encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{f}: {e.strerror or e}", "data.path") from None
    with fh:
        try:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    raise RecipeError(f"{f} line {n}: not a JSON object", "data.path") from None
                if not isinstance(row, dict):
                    raise RecipeError(f"{f} line {n}: not a JSON object", "data.path")
                yield Record(f"{f} line {n}", row=row)
        except UnicodeDecodeError as e:
            raise RecipeError(f"{f}: not UTF-8 ({e})", "data.path") from None


def _parquet_records(f: Path) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RecipeError(f"{f}: reading parquet needs pyarrow (pip install 'trainyard[train]')",
                          "data.path") from None
    try:
        pf = pq.ParquetFile(f)
        batches = pf.iter_batches(batch_size=PARQUET_BATCH)
        n = 0
        for batch in batches:
            for row in batch.to_pylist():
                n += 1
                yield Record(f"{f} row {n}", row=row)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
        raise RecipeError(f"{f}: not a readable parquet file ({str(e).splitlines()[0]})", "data.path") from None


def _dataset_records(d: Path) -> Iterator[Record]:
    try:
        import datasets
    except ImportError:
        raise RecipeError(f"{d}: reading a save_to_disk dataset needs datasets (pip install 'trainyard[train]')",
                          "data.path") from None
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_from_disk(str(d))
    except (OSError, ValueError, KeyError, FileNotFoundError) as e:
        raise RecipeError(f"{d}: not a readable datasets directory ({str(e).splitlines()[0]})",
                          "data.path") from None
    where = str(d)
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if "train" in ds:
            name = "train"
        elif len(splits) == 1:
            name = splits[0]
        else:
            raise RecipeError(f"{d}: a DatasetDict without a 'train' split (splits: {', '.join(splits)}); give "
                              "one split's directory", "data.path")
        ds, where = ds[name], f"{d} split {name}"
    for n, row in enumerate(ds, 1):
        yield Record(f"{where} row {n}", row=dict(row))


def data_digest(sources: list[Path], root: str | Path) -> str:
    """sha256 of the data: each source file's path relative to `root` and its bytes (a saved
    dataset: every file under it, in sorted order). `root` may start with a dataset's variable: the
    paths are relative to its copy on this node, so the digest is the same on every node."""
    base = local_path(root).resolve()
    base = base if base.is_dir() and not is_saved_dataset(base) else base.parent
    h = hashlib.sha256()
    for src in sources:
        files = [src] if src.is_file() else sorted(f for f in src.rglob("*") if f.is_file())
        for f in files:
            h.update(f.relative_to(base).as_posix().encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            h.update(b"\0")
    return h.hexdigest()


__all__ = ["DATASET_MARKERS", "PARQUET_BATCH", "Record", "SUFFIXES", "data_digest", "data_files", "dataset_variable",
           "file_format", "is_saved_dataset", "local_path", "records", "sniff"]
