"""The house rules of docs/design.md, checked: which part may import which, and what stays small.

- `sched` imports nothing of the project outside itself, and only the standard library (rule 1:
  the simulator and the control loop run the very same pure code).
- `runtime` and `recipes` import nothing of the control plane (rule 4: they work under plain
  `torchrun`); `contracts`, `states`, `ports`, `defaults`, `clock`, `disk`, `figures`, `jobfs` and the
  option parsers of `spec` (`spec.parsing`, …) only the standard library (the rank wrappers load
  `contracts` by path with `python -I -S`; the CLI reads `states` and parses options cheaply).
- `api` → `services` → `store`: the store imports no part above it, services no api, control or
  CLI, the API no store (it goes through services), no CLI and no control (the plane reaches it as
  `services.plane_facade.Plane`).
- no part imports another part's private module (`_name`).
- a router function (api/routers/) is at most 15 lines from its `def` to its end and holds no
  lock: the lock, the transaction and the loop's wake are a service's (`services/units.py`).
- backends hold no policy (rule 2): no `sched`, `services`, `control`, `store` or `api`.
- `sim` and `plan` replay the engine alone: no control plane; `demo` is a job (runtime, models).
- every part has a rule (`test_every_part_has_a_rule`); sub-packages have theirs where it matters:
  the run-dir layer (`backends/rundir/`) imports neither the local nor the Slurm backend, which
  import neither each other; `control/rules/` and `control/jobfiles/` do not drive the plane.
- no module of `control/` is over 300 lines (the loop is split into one module per step).
- no module of `sched/` is over 500 lines and no class in it over 300 (the engine's cycle is split
  into its state and steps, `sched/cycle/`, and one module per reclaim strategy, `sched/reclaim/`).
- the plane (`control`, `services`, `api`, the plane's side of `backends`) touches what a job's
  owner can change through `jobfs` alone (rule 7); `jobfs` uses the standard library only.
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
# whole parts, and modules or sub-packages by dotted name (`spec.parsing`), that use the standard library only
STDLIB_ONLY = {"sched", "contracts", "states", "ports", "defaults", "jobfs", "clock", "disk", "figures",
               "spec.parsing", "spec.io_patterns", "spec.mail_types", "spec.signals", "spec.image_ref",
               "spec.container_mounts", "spec.container", "spec.container_flags", "images.types",
               "staging.types"}

# part (or sub-package, by dotted name) → the project's parts and sub-packages it may not import
FORBIDDEN: dict[str, set[str]] = {
    "sched": set(PARTS) - {"sched"},
    "runtime": CONTROL_PLANE | {"sched", "sim", "recipes", "plan", "spec"},
    "recipes": CONTROL_PLANE | {"sched", "sim", "plan", "spec"},
    "contracts": set(PARTS) - {"contracts"},
    "states": set(PARTS) - {"states"},
    "ports": set(PARTS) - {"ports"},
    "defaults": set(PARTS) - {"defaults"},
    "clock": set(PARTS) - {"clock"},
    "disk": set(PARTS) - {"disk"},
    "figures": set(PARTS) - {"figures"},
    "jobfs": set(PARTS) - {"jobfs"},
    "spec": CONTROL_PLANE | {"runtime", "recipes", "sim", "plan", "jobfs"},
    # what the CLI parses with, without pydantic or YAML: none of the models
    **{f"spec.{m}": set(PARTS) for m in ("parsing", "io_patterns", "mail_types", "signals", "image_ref", "container_mounts",
                                          "container_flags")},
    "spec.container": set(PARTS) - {"spec"},  # its mounts are spec.container_mounts'
    # the images on the nodes: below the plane and the backends, which both use it
    "images": CONTROL_PLANE | {"sched", "sim", "plan", "runtime", "recipes"},
    # datasets on the nodes (issue 41: trainyard.staging): below the plane and the backends, which both use it
    "staging": CONTROL_PLANE | {"sched", "sim", "plan", "runtime", "recipes", "images"},
    "store": set(PARTS) - {"store", "states"},
    "services": {"api", "control", "cli", "demo", "recipes", "runtime"},
    "api": {"store", "cli", "demo", "control"},
    "backends": {"sched", "services", "control", "store", "api", "cli", "sim", "plan", "recipes", "runtime", "demo"},
    # the shared run-dir layer serves both real backends and knows neither; neither knows the other
    "backends.rundir": {"backends.local.backend", "backends.slurm.backend", "backends.fake"},
    "backends.contain": {"backends.local.backend", "backends.slurm.backend", "backends.rundir", "backends.fake"},
    "backends.local.backend": {"backends.slurm.backend", "backends.fake"},
    "backends.slurm.backend": {"backends.local.backend", "backends.fake", "backends.contain"},
    "sim": CONTROL_PLANE | {"runtime", "recipes"},
    "plan": CONTROL_PLANE | {"runtime", "recipes"},
    "demo": CONTROL_PLANE - {"demo"} | {"sched", "sim", "plan"},  # `make demo`'s job: the runtime and the models
    "control": {"api", "cli", "demo"},
    # the rules and the job files are the loop's tools, not its drivers; a report only reads
    "control.rules": {"control.lifecycle", "control.reports", "control.jobfiles", "control.health"},
    "control.jobfiles": {"control.loop.orchestrator", "control.lifecycle", "control.reports", "control.health"},
    "control.reports": {"control.lifecycle", "control.health", "control.jobfiles"},
    "control.loop.orchestrator": {"control.reports"},
    "control.health": {"control.loop.orchestrator", "control.rules", "control.jobfiles", "control.reports"},
    "cli": set(),  # the top: `yard` may start any part (`yard up`, `yard sim`, `yard plan`, `make demo`)
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
            if node.module and not node.level and node.module.startswith("trainyard"):
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]  # maybe a module
    return out


def _owners(path: Path, pkg: Path) -> list[str]:
    """The dotted names a file belongs to, widest first: `backends`, `backends.rundir`, `backends.rundir.by_path`."""
    names = list(path.relative_to(pkg).with_suffix("").parts)
    if names[-1] == "__init__":
        names.pop()
    return [".".join(names[:i]) for i in range(1, len(names) + 1)]


def _within(mod: str, name: str) -> bool:
    return mod == name or mod.startswith(name + ".")


def layering_violations(pkg: Path = PKG) -> list[str]:
    """Every import that breaks `FORBIDDEN` or `STDLIB_ONLY`, as `file:line: why`."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        owners = _owners(path, pkg)
        banned = {(owner, b) for owner in owners for b in FORBIDDEN.get(owner, set())}
        stdlib_only = next((o for o in owners if o in STDLIB_ONLY), None)
        for line, mod in _imports(path, pkg):
            where = f"{path.relative_to(pkg.parent)}:{line}"
            names = mod.split(".")
            inner = ".".join(names[1:])
            if names[0] == "trainyard" and inner:
                hit = next(((o, b) for o, b in sorted(banned) if _within(inner, b) and not _within(inner, o)), None)
                if hit and f"{where}: {hit[0]} imports trainyard.{hit[1]}" not in found:
                    found.append(f"{where}: {hit[0]} imports trainyard.{hit[1]}")
            elif stdlib_only and names[0] not in sys.stdlib_module_names and names[0] != "trainyard":
                found.append(f"{where}: {stdlib_only} must use the standard library only, imports {mod}")
    return found


def test_every_part_has_a_rule():
    """A new part (a package or a root module) says what it may not import."""
    assert sorted(set(PARTS) - set(FORBIDDEN)) == []
    assert all(k.split(".")[0] in PARTS for k in FORBIDDEN), sorted(k for k in FORBIDDEN if k.split(".")[0] not in PARTS)


def test_named_sub_packages_exist():
    """A rule on a sub-package that was moved or renamed would check nothing."""
    for name in sorted({k for k in FORBIDDEN if "." in k} | {b for v in FORBIDDEN.values() for b in v if "." in b}
                       | {k for k in STDLIB_ONLY if "." in k}):
        rel = PKG / name.replace(".", "/")
        assert rel.with_suffix(".py").exists() or (rel / "__init__.py").exists(), name


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


def test_the_check_catches_a_sub_package_break(tmp_path):
    """A rule on a sub-package holds: the run-dir layer importing the local backend is reported,
    the local backend importing the run-dir layer is not."""
    fake = tmp_path / "trainyard"
    for d in ("", "backends", "backends/rundir", "backends/local"):
        (fake / d).mkdir(exist_ok=True)
        (fake / d / "__init__.py").write_text("")
    (fake / "backends" / "rundir" / "bad.py").write_text("from trainyard.backends.local.backend import backend\n")
    (fake / "backends" / "local" / "fine.py").write_text("from trainyard.backends.rundir import bad\n")
    found = layering_violations(fake)
    assert len(found) == 1 and "backends.rundir imports trainyard.backends.local.backend" in found[0], found


def _private_module(names: list[str], pkg: Path) -> bool:
    """Whether `trainyard.a._b…` (as names, `trainyard` left out) is in a module or package whose
    name starts with one underscore (a private name such as `_DIR` of a public module is not)."""
    for i, n in enumerate(names):
        if n.startswith("_") and not n.startswith("__"):
            p = pkg.joinpath(*names[:i + 1])
            return p.with_suffix(".py").exists() or p.is_dir()
    return False


def private_imports(pkg: Path = PKG) -> list[str]:
    """Every import of another part's private module (`from trainyard.backends import _files`,
    `import trainyard.backends._files`), as `file:line: why`."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        part = path.relative_to(pkg).parts[0].removesuffix(".py")
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            mods: list[list[str]] = []
            if isinstance(node, ast.Import):
                mods = [a.name.split(".")[1:] for a in node.names if a.name.startswith("trainyard.")]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainyard.") \
                    and not node.level:
                base = node.module.split(".")[1:]
                mods = [base + [a.name] for a in node.names]
            for names in mods:
                if names and names[0] != part and _private_module(names, pkg):
                    found.append(f"{path.relative_to(pkg.parent)}:{node.lineno}: {part} imports the private "
                                 f"trainyard.{'.'.join(names)}")
    return found


def test_no_part_imports_another_parts_private_module():
    assert private_imports() == []


ROUTER_MAX_LINES = 15


def router_violations(routers: Path = PKG / "api" / "routers") -> list[str]:
    """Every function in the routers longer than ROUTER_MAX_LINES (from `def` to its end, its
    decorators not counted) or touching a lock (`with cp.lock`, `.lock` anywhere)."""
    found = []
    for path in sorted(routers.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            where = f"{path.name}:{fn.lineno}: {fn.name}"
            lines = fn.end_lineno - fn.lineno + 1
            if lines > ROUTER_MAX_LINES:
                found.append(f"{where} has {lines} lines (at most {ROUTER_MAX_LINES}: move the work to a service)")
            if any(isinstance(n, ast.Attribute) and n.attr in ("lock", "_lock") for n in ast.walk(fn)) \
                    or any(isinstance(n, (ast.With, ast.AsyncWith)) and "lock" in ast.unparse(n.items[0].context_expr)
                           for n in ast.walk(fn)):
                found.append(f"{where} holds a lock (the plane's transaction is a service's: services/units.py)")
    return found


def test_routers_are_short_and_hold_no_lock():
    assert router_violations() == []


def test_the_router_and_private_checks_catch_a_break(tmp_path):
    """The rule tests can fail: a long route that takes the plane's lock, and an API module that
    imports another part's private module, are reported; a short route is not."""
    routers = tmp_path / "routers"
    routers.mkdir()
    long_body = "".join(f"    x{i} = {i}\n" for i in range(14))
    (routers / "bad.py").write_text("@router.post('')\n"
                                    "def submit(cp):\n    with cp.lock, cp.store.session.begin() as s:\n"
                                    "        pass\n" + long_body)
    (routers / "fine.py").write_text("@router.get('')\n@other\ndef read(cp):\n" + long_body[:-len('    x13 = 13\n')])
    found = router_violations(routers)
    assert len(found) == 2 and "bad.py:2: submit has 17 lines" in found[0] and "holds a lock" in found[1], found
    fake = tmp_path / "trainyard"
    for d in (fake / "api", fake / "backends"):
        d.mkdir(parents=True)
        (d / "__init__.py").write_text("")
    (fake / "backends" / "_files.py").write_text("")
    (fake / "backends" / "local.py").write_text("from trainyard.backends import _files\n")
    (fake / "api" / "app.py").write_text("from trainyard.backends import _files\nimport trainyard.backends._files\n"
                                         "from trainyard.backends import local\n")
    found = private_imports(fake)
    assert found == ["trainyard/api/app.py:1: api imports the private trainyard.backends._files",
                     "trainyard/api/app.py:2: api imports the private trainyard.backends._files"], found


@pytest.mark.parametrize("path", sorted((PKG / "control").rglob("*.py")), ids=lambda p: p.name)
def test_control_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 300, f"{path.relative_to(ROOT)} has {lines} lines; split it by responsibility"


SCHED_MODULE_MAX, SCHED_CLASS_MAX = 500, 300


def oversized(path: Path, module_max: int, class_max: int) -> list[str]:
    """The module (if over `module_max` lines) and each class in it over `class_max` lines."""
    source = path.read_text()
    found = []
    lines = len(source.splitlines())
    if lines > module_max:
        found.append(f"{path.name} has {lines} lines (at most {module_max})")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            n = node.end_lineno - node.lineno + 1
            if n > class_max:
                found.append(f"class {node.name} has {n} lines (at most {class_max})")
    return found


@pytest.mark.parametrize("path", sorted((PKG / "sched").rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_sched_modules_and_classes_stay_small(path):
    found = oversized(path, SCHED_MODULE_MAX, SCHED_CLASS_MAX)
    assert found == [], f"{path.relative_to(ROOT)}: {'; '.join(found)}; split it by responsibility"


def test_the_size_check_catches_a_large_class(tmp_path):
    """The rule test can fail: a 301-line class and a 501-line module are reported."""
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "    x = 1\n" * 300 + "\n" * 200)
    assert oversized(big, SCHED_MODULE_MAX, SCHED_CLASS_MAX) == [
        "big.py has 501 lines (at most 500)", "class Big has 301 lines (at most 300)"]


# -- docstrings that name modules and files --------------------------------------------------------

_PATH_REF = re.compile(r"(?<![\w./-])((?:src/)?(?:trainyard/)?(?:tests|bench|scripts|docs|deploy|"
                       + "|".join(PARTS) + r")/[\w/.-]*\w\.(?:py|md|sh|yaml|json))\b")
# An event kind in backticks (a `store.unknown_work` event) looks like a module path; it is not one.
_DOTTED_REF = re.compile(r"`((?:trainyard\.)?(?:" + "|".join(PARTS) + r")\.[A-Za-z_][\w.]*)`(?!\s+events?\b)")


def _path_exists(ref: str) -> bool:
    return any((base / ref).exists() for base in (ROOT, ROOT / "src", PKG))


def _dotted_exists(ref: str) -> bool:
    """`services.jobs.submit`, `trainyard.control.loop.orchestrator`, `sched/engine.py`'s `TrainyardPolicy.cycle`…:
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


# -- the plane touches what a job's owner can change through `jobfs` alone -------------------------
# design rule 7, issue 34: a root plane that opens, stats, lists, links, makes or removes a path
# under a job dir, a workdir or an `--output` any other way can be made to follow a link, block on
# a FIFO or read without end. Every such call in the plane's code must go through `trainyard.jobfs`;
# a call on a path that is the plane's own (its data dir, the store's files, admin.token, the
# package's own files, an NVML session) says so on its line with a `# plane's own: <why>` comment.

PLANE_SIDE = (sorted((PKG / "control").rglob("*.py")) + sorted((PKG / "services").rglob("*.py"))
              + sorted((PKG / "api").rglob("*.py"))
              + [PKG / "backends" / f"{m}.py" for m in ("local/backend", "slurm/backend", "local/batch", "rundir/exit_watch",
                                                        "slurm/env")])
# Whole modules whose one job is the plane's own files (their docstrings say why).
PLANE_OWN_MODULES = {"control/lifecycle/plane_files.py"}
OWN_MARK = "# plane's own"
FS_OS = {"open", "symlink", "link", "makedirs", "mkdir", "chown", "lchown", "chmod", "listdir", "scandir", "walk",
         "stat", "lstat", "unlink", "remove", "rmdir", "rename", "replace", "access", "mkfifo", "truncate",
         "readlink", "chdir", "removedirs", "utime"}
FS_OS_PATH = {"exists", "lexists", "isdir", "isfile", "islink", "realpath", "getsize", "getmtime", "getatime",
              "getctime", "samefile", "ismount"}
FS_SHUTIL = {"rmtree", "copy", "copy2", "copyfile", "copytree", "move", "chown", "disk_usage"}
# pathlib's methods that touch the file system (and `open`, which opens anything a path names)
FS_METHODS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "resolve", "mkdir", "rmdir", "unlink",
              "symlink_to", "hardlink_to", "iterdir", "glob", "rglob", "exists", "is_dir", "is_file", "is_symlink",
              "stat", "lstat", "chmod", "touch", "rename", "samefile", "readlink", "expanduser"}  # not `replace`: str's


def _tree_values(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to a `jobfs.Tree`, functions that return one) in a module: an assignment from
    `jobfs.Tree(...)` or from such a function, or a parameter annotated `jobfs.Tree`."""
    makers = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.returns is not None
              and ast.unparse(n.returns).endswith("jobfs.Tree")}

    def makes_tree(v: ast.AST) -> bool:
        return isinstance(v, ast.Call) and (ast.unparse(v.func) in ("jobfs.Tree", "Tree")
                                            or ast.unparse(v.func) in makers)

    names = {a.arg for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             for a in n.args.args + n.args.kwonlyargs if a.annotation is not None
             and ast.unparse(a.annotation).endswith("jobfs.Tree")}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and makes_tree(n.value):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return names, makers


def job_file_access(path: Path) -> list[tuple[int, str]]:
    """(line, call) of every file-system call in `path` that bypasses `jobfs` and is not marked as
    the plane's own."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    trees, makers = _tree_values(tree)
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f, name = n.func, None
        if isinstance(f, ast.Name) and f.id == "open":
            name = "open"
        elif isinstance(f, ast.Attribute):
            recv = ast.unparse(f.value)
            if recv == "os" and f.attr in FS_OS or recv == "os.path" and f.attr in FS_OS_PATH \
                    or recv == "shutil" and f.attr in FS_SHUTIL:
                name = f"{recv}.{f.attr}"
            elif f.attr in FS_METHODS and recv not in modules and recv.split(".")[0] not in ("os", "shutil") \
                    and recv not in trees and not recv.startswith(("jobfs.", "Tree(")) \
                    and not (isinstance(f.value, ast.Call) and ast.unparse(f.value.func) in makers):
                name = f"{recv}.{f.attr}"
        if name and OWN_MARK not in lines[n.lineno - 1]:
            found.append((n.lineno, name))
    return sorted(found)


def test_the_plane_touches_job_files_only_through_jobfs():
    found = [f"{p.relative_to(PKG)}:{line}: {call}" for p in PLANE_SIDE
             if str(p.relative_to(PKG)) not in PLANE_OWN_MODULES for line, call in job_file_access(p)]
    assert found == [], ("file-system calls outside trainyard.jobfs (use jobfs.Tree / jobfs.as_owner, or mark a "
                         "path that is the plane's own with `# plane's own: <why>`):\n" + "\n".join(found))


def test_the_jobfs_check_catches_a_plain_open(tmp_path):
    """The rule test can fail: a plain open, a Path.resolve and a shutil.rmtree are found; calls
    on a jobfs.Tree, on an imported module and on a line marked as the plane's own are not."""
    bad = tmp_path / "bad.py"
    bad.write_text("import shutil\nfrom trainyard import jobfs\nfrom trainyard.services import owners\n"
                   "def f(jd, spec):\n"
                   "    open(jd.metrics_file).read()\n"
                   "    p = jd.root.resolve()\n"
                   "    shutil.rmtree(jd.root)\n"
                   "    t = jobfs.Tree(jd.root)\n"
                   "    t.lstat('metrics')\n"
                   "    jobfs.Tree(jd.root).exists('logs')\n"
                   "    owners.resolve(spec, 'u', 't')\n"
                   "    (jd.root / 'x').unlink()  # plane's own: a test\n")
    assert job_file_access(bad) == [(5, "open"), (6, "jd.root.resolve"), (7, "shutil.rmtree")]


def test_jobfs_uses_the_standard_library_only():
    mods = [m for path in (PKG / "jobfs").glob("*.py") for _, m in _imports(path, PKG)]
    assert mods and all(m.split(".")[0] in sys.stdlib_module_names or m.startswith("trainyard.jobfs") for m in mods)
