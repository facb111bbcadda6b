"""The house rules of DESIGN.md, checked: which part may import which, and what stays small.

- `sched` imports nothing of the project outside itself, and only the standard library (rule 1:
  the simulator and the control loop run the very same pure code).
- `runtime` and `recipes` import nothing of the control plane (rule 4: they work under plain
  `torchrun`); `contracts`, `states`, `ports`, `defaults` and `parsing` only the standard library
  (the rank wrappers load `contracts` by path with `python -I -S`; the CLI reads `states` cheaply).
- `api` → `services` → `store`: the store imports no part above it, services no api, control or
  CLI, the API no store (it goes through services) and no CLI.
- backends hold no policy (rule 2): no `sched`, `services`, `control`, `store` or `api`.
- `sim` replays the engine alone: no control plane.
- no module of `control/` is over 300 lines (the loop is split into one module per step).
- every module, test or file a docstring names in backquotes or by path exists.

Imports under `if TYPE_CHECKING:` are annotations only and do not count.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "trainyard"
PARTS = sorted({p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
               | {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"})
CONTROL_PLANE = {"api", "cli", "control", "services", "store", "backends", "demo"}
STDLIB_ONLY = {"sched", "contracts", "states", "ports", "defaults", "parsing"}

# part → the project's parts it may not import
FORBIDDEN: dict[str, set[str]] = {
    "sched": set(PARTS) - {"sched"},
    "runtime": CONTROL_PLANE | {"sched", "sim", "recipes", "plan"},
    "recipes": CONTROL_PLANE | {"sched", "sim", "plan"},
    "contracts": set(PARTS) - {"contracts"},
    "states": set(PARTS) - {"states"},
    "ports": set(PARTS) - {"ports"},
    "defaults": set(PARTS) - {"defaults"},
    "parsing": set(PARTS) - {"parsing"},
    "store": set(PARTS) - {"store", "states"},
    "services": {"api", "control", "cli", "demo", "recipes", "runtime"},
    "api": {"store", "cli", "demo"},
    "backends": {"sched", "services", "control", "store", "api", "cli", "sim", "plan"},
    "sim": CONTROL_PLANE | {"runtime", "recipes"},
    "spec": CONTROL_PLANE | {"runtime", "recipes", "sim"},
    "control": {"api", "cli", "demo"},
}


def _imports(path: Path, pkg: Path) -> list[tuple[int, str]]:
    """(line, module) of every import outside `if TYPE_CHECKING:` blocks; relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    here = list(path.relative_to(pkg.parent).with_suffix("").parts)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level]
                out.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            elif node.module:
                out.append((node.lineno, node.module))
    return out


def layering_violations(pkg: Path = PKG) -> list[str]:
    """Every import that breaks `FORBIDDEN` or `STDLIB_ONLY`, as `file:line: why`."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        part = path.relative_to(pkg).parts[0].removesuffix(".py")
        banned = FORBIDDEN.get(part, set())
        for line, mod in _imports(path, pkg):
            where = f"{path.relative_to(pkg.parent)}:{line}"
            names = mod.split(".")
            if names[0] == "trainyard" and len(names) > 1 and names[1] in banned:
                found.append(f"{where}: {part} imports trainyard.{names[1]}")
            elif part in STDLIB_ONLY and names[0] not in sys.stdlib_module_names and names[0] != "trainyard":
                found.append(f"{where}: {part} must use the standard library only, imports {mod}")
    return found


def test_the_layering_of_design_md_holds():
    assert layering_violations() == []


def test_the_check_catches_a_layering_break(tmp_path):
    """The rule test itself can fail: a scheduler module that imports the store is reported."""
    fake = tmp_path / "trainyard"
    (fake / "sched").mkdir(parents=True)
    (fake / "store").mkdir()
    for d in (fake, fake / "sched", fake / "store"):
        (d / "__init__.py").write_text("")
    (fake / "sched" / "bad.py").write_text("from trainyard.store.models import JobRow\nimport yaml\n")
    (fake / "sched" / "fine.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from trainyard.store.models import JobRow\n")
    found = layering_violations(fake)
    assert len(found) == 2, found
    assert "sched imports trainyard.store" in found[0] and "standard library only" in found[1]


@pytest.mark.parametrize("path", sorted((PKG / "control").rglob("*.py")), ids=lambda p: p.name)
def test_control_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 300, f"{path.relative_to(ROOT)} has {lines} lines; split it by responsibility"


# -- docstrings that name modules and files --------------------------------------------------------

_PATH_REF = re.compile(r"(?<![\w./-])((?:src/)?(?:trainyard/)?(?:tests|bench|scripts|docs|deploy|"
                       + "|".join(PARTS) + r")/[\w/.-]*\w\.(?:py|md|sh|yaml|json))\b")
# An event kind in backticks (a `store.unknown_work` event) looks like a module path; it is not one.
_DOTTED_REF = re.compile(r"`((?:trainyard\.)?(?:" + "|".join(PARTS) + r")\.[A-Za-z_][\w.]*)`(?!\s+events?\b)")


def _path_exists(ref: str) -> bool:
    return any((base / ref).exists() for base in (ROOT, ROOT / "src", PKG))


def _dotted_exists(ref: str) -> bool:
    """`services.jobs.submit`, `trainyard.control.loop`, `sched/engine.py`'s `TrainyardPolicy.cycle`…:
    the longest prefix that is a module, then attributes of it."""
    parts = ref.rstrip(".").split(".")
    if parts[-1] in ("py", "md", "yaml", "sh"):  # a file name written with dots (`contracts.py`)
        return _path_exists("/".join(parts[:-1]) + "." + parts[-1])
    if parts[0] != "trainyard":
        parts = ["trainyard", *parts]
    for i in range(len(parts), 1, -1):
        name = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            continue
        obj = importlib.import_module(name)
        for attr in parts[i:]:
            if attr in ("py",) or not hasattr(obj, attr):
                return attr in getattr(obj, "__annotations__", {})  # a dataclass field without a default
            obj = getattr(obj, attr)
        return True
    return False


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "lineno", 1), doc


def test_modules_and_files_named_in_docstrings_exist():
    files = sorted(PKG.rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    missing = []
    for path in files:
        for line, doc in _docstrings(path):
            for m in _PATH_REF.finditer(doc):
                if not _path_exists(m.group(1)):
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {m.group(1)}")
            for m in _DOTTED_REF.finditer(doc):
                if not _dotted_exists(m.group(1)):
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {m.group(1)}")
    assert missing == [], "docstrings name what does not exist:\n" + "\n".join(missing)
