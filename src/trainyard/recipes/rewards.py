"""Verifiable rewards for GRPO on the user's prompt/answer data (`rl.reward`).

A reward scores one completion: `reward(prompt, completion, answer) -> float`, where `prompt`
is the record's prompt as it was (a string, or a list of chat messages), `completion` the
sampled text up to the end-of-sequence token (special tokens dropped) and `answer` the
record's reference answer (a string; a number in the data arrives as its text).

- `exact`: 1.0 when `completion.strip() == answer.strip()`, else 0.0.
- `regex` (`rl.reward_pattern`, Python `re` syntax, searched anywhere in the completion):
  `{answer}` in the pattern stands for the answer, escaped (`The answer is {answer}\\b`); a
  pattern with a capturing group scores 1.0 when the first match's group 1, stripped, equals the
  answer stripped (`#### (\\S+)`, `\\\\boxed\\{(.*?)\\}`: the answer extracted, then compared);
  otherwise any match scores 1.0 (a format reward).
- `python` (`rl.reward_function`): `path/to/file.py:name` (the file is loaded as a module of its
  own; a relative path is taken from the working directory) or `package.module:name` (imported
  from `sys.path`); `name(prompt, completion, answer)` must return a number (a bool counts as 0 or 1).

Why the checks come in two steps: `check(rl)` is static (the file exists and defines `name`
at its top level, found without running it; the module can be found), so `yard run` refuses a
misspelled function before any rank starts without executing user code in the launcher; each
rank then imports it (`load(rl)`), and a name that is not callable there is an error too, all
before anything is written (exit 2).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.recipes.spec import RecipeError, RLSpec

Reward = Callable[[Any, str, str], float]
FIELD = "rl.reward_function"


def exact(prompt: Any, completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def regex(pattern: str) -> Reward:
    """The `regex` reward for `pattern` (see the module docstring)."""
    templated = "{answer}" in pattern
    fixed = None if templated else re.compile(pattern)

    def reward(prompt: Any, completion: str, answer: str) -> float:
        rx = fixed if fixed is not None else re.compile(pattern.replace("{answer}", re.escape(answer.strip())))
        m = rx.search(completion)
        if m is None:
            return 0.0
        if rx.groups and not templated:
            got = m.group(1)
            return 1.0 if got is not None and got.strip() == answer.strip() else 0.0
        return 1.0

    return reward


def _split(ref: str) -> tuple[str, str]:
    where, _, name = ref.rpartition(":")
    return where, name


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where


def _defines(tree: ast.Module, name: str) -> bool:
    """`name` bound at the module's top level (def, class, assignment, import)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)):
                    return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def check(rl: RLSpec) -> None:
    """Static checks of the reward (no user code runs). Raises RecipeError (rl.reward_function)."""
    if rl.reward != "python":
        return
    assert rl.reward_function is not None
    where, name = _split(rl.reward_function)
    if _is_file(where):
        path = Path(where).expanduser()
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as e:
            raise RecipeError(f"{path}: {e.strerror or 'not readable'} (the reward function's file)", FIELD) from None
        try:
            tree = ast.parse(source, filename=str(path))
        except SyntaxError as e:
            raise RecipeError(f"{path} line {e.lineno}: not valid Python ({e.msg})", FIELD) from None
        if not _defines(tree, name):
            raise RecipeError(f"{path}: no function {name!r} at its top level", FIELD)
        return
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as e:
        raise RecipeError(f"module {where!r} cannot be found ({e})", FIELD) from None
    if found is None:
        raise RecipeError(f"no module {where!r} on the Python path (give FILE.py:NAME for a file)", FIELD)


def _load_function(ref: str) -> Callable[..., Any]:
    where, name = _split(ref)
    if _is_file(where):
        path = Path(where).expanduser().resolve()
        check_spec = importlib.util.spec_from_file_location("trainyard_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:12], path)
        if check_spec is None or check_spec.loader is None:
            raise RecipeError(f"{path}: not loadable as a Python module", FIELD)
        module = importlib.util.module_from_spec(check_spec)
        sys.modules[check_spec.name] = module
        try:
            check_spec.loader.exec_module(module)
        except FileNotFoundError:
            raise RecipeError(f"{path}: no such file (the reward function's file)", FIELD) from None
        origin = str(path)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise RecipeError(f"no module {where!r} on the Python path ({e})", FIELD) from None
        origin = f"module {where}"
    fn = getattr(module, name, None)
    if fn is None:
        raise RecipeError(f"{origin}: no function {name!r}", FIELD)
    if not callable(fn):
        raise RecipeError(f"{origin}: {name!r} is {type(fn).__name__}, not a function", FIELD)
    return fn


def load(rl: RLSpec) -> Reward:
    """The reward `rl` names, ready to call. Raises RecipeError (a bad file or function name)."""
    if rl.reward == "exact":
        return exact
    if rl.reward == "regex":
        assert rl.reward_pattern is not None
        return regex(rl.reward_pattern)
    assert rl.reward_function is not None
    check(rl)
    fn = _load_function(rl.reward_function)
    ref = rl.reward_function

    def reward(prompt: Any, completion: str, answer: str) -> float:
        value = fn(prompt, completion, answer)
        if not isinstance(value, (int, float)) or not math.isfinite(value):  # a bool is 0 or 1
            raise TypeError(f"the reward function {ref} returned {value!r}; it must return a finite number")
        return float(value)

    return reward


__all__ = ["Reward", "check", "exact", "load", "regex"]
