"""The model registry: every export (`yard export`, a recipe's `export:`) recorded in the data dir.

    <data dir>/models/          0700, this user's own; data dir = --data-dir, else $YARD_DATA_DIR,
                                else ~/.trainyard (the CLI's data dir, `trainyard.defaults`)
        <name>.json             one record per exported directory: name, path, user, when, and a
                                copy of its lineage (`trainyard.json`), so that a model whose
                                directory is gone still says what it was
        <name>/                 an export written here: `yard export RUN` without --to

`yard models` lists the records (and any export directory placed under `models/` by hand),
reading each model's own `trainyard.json` where it still exists: the directory is the truth,
the record the pointer and the memory. A record whose directory is gone is listed as `missing`;
a record that does not parse is listed as `damaged`; nothing here makes the listing fail.

Names: `[A-Za-z0-9][A-Za-z0-9._-]*` (at most 100), unique within the registry. An export gets the
name it is given (`yard export --name`), else the basename of its directory, else — for a
directory inside its own run dir, as a recipe's `export: hf` writes it — the run's id; a default
name already used by another directory gets `-2`, `-3`, … A name given explicitly and already
used by another directory is refused before anything is written. Exporting again into the same
directory updates its record and keeps its name. A new record is created with link(2), which
fails if the name exists, so two exports racing for one name both get one of their own.

Why per user, as Hugging Face's cache is (`~/.cache/huggingface`): the control plane's data dir is
the plane's own (0711, the jobs pass through it, `control/lifecycle/plane_files.py`), and a job runs as its
owner with the owner's HOME, so a recipe's export records itself in the owner's `~/.trainyard`,
never in the plane's files. A record is written only into a `models/` directory owned by the
user writing it (and made 0700 when created here); otherwise the export still succeeds and says
that it was not recorded (a shared team registry is not supported yet). Listing reads only this
one directory, and each model's `trainyard.json` as the invoking user may read it.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from trainyard.recipes.spec import RecipeError

MODELS_DIR = "models"
LINEAGE = "trainyard.json"
RECORD_FORMAT = "trainyard-model-record-v1"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def data_dir(explicit: str | Path | None = None) -> Path:
    from trainyard.defaults import default_data_dir

    return Path(explicit).expanduser() if explicit is not None else default_data_dir().expanduser()


def registry_dir(data: str | Path | None = None) -> Path:
    return data_dir(data) / MODELS_DIR


def check_name(name: str, field: str = "--name") -> str:
    """Raises RecipeError(field) unless `name` is a registry name (see the module docstring)."""
    if not NAME_RE.fullmatch(name) or name.endswith(".json"):
        raise RecipeError(f"{name!r} is not a model name: letters, digits, '.', '_', '-', starting with a letter "
                          "or digit, at most 100 characters", field)
    return name


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:100]
    return s or "model"


def default_name(dest: Path, run_dir: Path | None = None) -> str:
    """The basename of the export directory, or the run's id for a directory inside the run dir."""
    dest = Path(dest)
    if run_dir is not None and Path(run_dir) in dest.parents:
        return _slug(Path(run_dir).name)
    return _slug(dest.name)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _records(reg: Path) -> dict[str, tuple[Path, dict[str, Any] | None]]:
    """name → (record file, its content or None when it does not parse)."""
    out: dict[str, tuple[Path, dict[str, Any] | None]] = {}
    try:
        entries = sorted(os.scandir(reg), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        if e.name.startswith(".") or not e.name.endswith(".json"):
            continue
        out[e.name[: -len(".json")]] = (Path(e.path), _read_json(Path(e.path)))
    return out


def unwritable(reg: Path, *, create: bool = True) -> str | None:
    """Why records cannot be written into `reg` (None: they can). Creates it (0700) when missing,
    unless not `create`: then a missing `reg` is judged by the directory it would be made in."""
    if not create and not reg.exists():
        anc = reg.parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        ok = anc.is_dir() and os.access(anc, os.W_OK | os.X_OK)
        return None if ok else f"{reg} cannot be created in {anc}"
    try:
        if not reg.exists():
            reg.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            reg.mkdir(mode=0o700, exist_ok=True)
        st = os.stat(reg)
    except OSError as e:
        return f"{reg}: {e.strerror or e}"
    if not os.path.isdir(reg):
        return f"{reg} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{reg} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); records are written " \
               "only into the user's own registry"
    if not os.access(reg, os.W_OK | os.X_OK):
        return f"{reg} is not writable"
    return None


def name_for(dest: Path, *, name: str | None = None, run_dir: Path | None = None,
             data: str | Path | None = None) -> str:
    """The name `dest` would be registered under; checks an explicit `name` (bad input: RecipeError).

    Raises:
        RecipeError: `name` is not a valid name, or already names another directory (`--name`).
    """
    dest = Path(dest).resolve()
    reg = registry_dir(data).resolve()
    recs = _records(reg)
    for known, (_, rec) in recs.items():
        if rec is not None and rec.get("path") == str(dest):
            if name is not None and name != known:
                raise RecipeError(f"{dest} is registered as {known!r} already; export it under that name (or "
                                  "remove its record)", "--name")
            return known
    if name is not None:
        check_name(name)
        taken = recs.get(name)
        if taken is not None and (taken[1] or {}).get("path") != str(dest):
            where = (taken[1] or {}).get("path", "a damaged record")
            raise RecipeError(f"{name!r} already names {where} (`yard models {name}`); choose another name", "--name")
        if (reg / name).is_dir() and reg / name != dest:
            raise RecipeError(f"{name!r} already names the directory {reg / name}; choose another name", "--name")
        return name
    base, n = default_name(dest, run_dir), 1
    while True:
        cand = base if n == 1 else f"{base}-{n}"
        if cand not in recs and (not (reg / cand).exists() or reg / cand == dest):
            return cand
        n += 1


def default_dest(run_dir: Path, *, name: str | None = None, data: str | Path | None = None) -> Path:
    """Where `yard export RUN` without --to writes: `<registry>/<name>`, name = `name`, else the
    run's id, else the first of `<id>-2`, `<id>-3`, … that is free or already an export of this run."""
    reg = registry_dir(data).resolve()
    recs = _records(reg)
    base = name or _slug(Path(run_dir).name)
    n = 1
    while True:
        cand = base if n == 1 else f"{base}-{n}"
        d = reg / cand
        rec = recs.get(cand)
        rec_ok = rec is None or (rec[1] or {}).get("path") == str(d)
        prev = _read_json(d / LINEAGE) if d.is_dir() else None
        dir_ok = not d.exists() or (prev is not None and prev.get("run") == str(run_dir)) or (
            d.is_dir() and not any(d.iterdir()))
        if name is not None or (rec_ok and dir_ok):
            return d
        n += 1


def _write_record(path: Path, record: dict[str, Any], *, exclusive: bool) -> bool:
    """Write atomically (0600); `exclusive`: only if `path` does not exist (False if it does)."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, indent=1) + "\n")
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def register(dest: str | Path, lineage: dict[str, Any], *, name: str | None = None, run_dir: Path | None = None,
             data: str | Path | None = None) -> tuple[str | None, str]:
    """Record the export in `dest` in the registry. Returns (name, a line to print); name is None
    when it was not recorded (the line says why). Never raises for the registry's own state."""
    dest = Path(dest).resolve()
    reg = registry_dir(data)
    why = unwritable(reg)
    if why is not None:
        return None, f"not recorded in the model registry: {why}"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.geteuid())
    for _ in range(100):
        try:
            chosen = name_for(dest, name=name, run_dir=run_dir, data=data)
        except RecipeError as e:
            return None, f"not recorded in the model registry: {e}"
        path = reg / f"{chosen}.json"
        old = _read_json(path)
        record = {"format": RECORD_FORMAT, "name": chosen, "path": str(dest), "user": user,
                  "registered_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "lineage": lineage}
        same = old is not None and old.get("path") == str(dest)
        try:
            if same:
                if os.stat(path).st_uid != os.geteuid():
                    return None, f"not recorded in the model registry: {path} belongs to another user"
                _write_record(path, record, exclusive=False)
                return chosen, f"registered as {chosen!r} in {reg} (updated)"
            if _write_record(path, record, exclusive=True):
                return chosen, f"registered as {chosen!r} in {reg}"
        except OSError as e:
            return None, f"not recorded in the model registry: {path}: {e.strerror or e}"
        if name is not None:  # taken meanwhile by another export
            return None, f"not recorded in the model registry: {name!r} was taken meanwhile"
    return None, "not recorded in the model registry: no free name"


# -- listing ----------------------------------------------------------------------------------------


def _entry(name: str, path: str | None, state: str, lineage: dict[str, Any] | None,
           record: Path | None) -> dict[str, Any]:
    return {"name": name, "path": path, "state": state, "record": None if record is None else str(record),
            "lineage": lineage}


def entries(data: str | Path | None = None) -> list[dict[str, Any]]:
    """The registry's models, oldest export first: name, path, state (ok, missing, unreadable,
    damaged), the record file, and the lineage (the directory's own where it exists, else the
    record's copy)."""
    reg = registry_dir(data)
    out, seen = [], set()
    for name, (rec_path, rec) in _records(reg).items():
        if rec is None or not isinstance(rec.get("path"), str):
            out.append(_entry(name, None, "damaged", None, rec_path))
            continue
        path = rec["path"]
        seen.add(path)
        copy = rec.get("lineage") if isinstance(rec.get("lineage"), dict) else None
        lineage_file = Path(path) / LINEAGE
        try:
            current = json.loads(lineage_file.read_text())
            state = "ok" if isinstance(current, dict) else "damaged"
            current = current if isinstance(current, dict) else copy
        except FileNotFoundError:
            state, current = "missing", copy
        except NotADirectoryError:
            state, current = "missing", copy
        except PermissionError:
            state, current = "unreadable", copy
        except (OSError, ValueError, UnicodeDecodeError):
            state, current = "damaged", copy
        out.append(_entry(name, path, state, current, rec_path))
    try:
        dirs = sorted((e for e in os.scandir(reg) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")),
                      key=lambda e: e.name)
    except OSError:
        dirs = []
    for e in dirs:  # an export placed under models/ without a record (copied in by hand)
        p = str(Path(e.path).resolve())
        if p in seen:
            continue
        lineage = _read_json(Path(e.path) / LINEAGE)
        if lineage is not None:
            out.append(_entry(e.name, p, "ok", lineage, None))
    out.sort(key=lambda x: ((x["lineage"] or {}).get("exported_at") or "", x["name"]))
    return out


__all__ = ["LINEAGE", "MODELS_DIR", "check_name", "data_dir", "default_dest", "default_name", "entries", "name_for", "register",
           "registry_dir", "unwritable"]
