"""The image tools (`skopeo`, `umoci`) run as the plane runs them: found on PATH, with a timeout, in
a clean environment, their output bounded.

The plane is root and its own environment holds what no tool should see (tokens, proxies, the
caller's HOME and its registries' login files): a tool gets PATH, LANG=C and a private HOME made
for the call, nothing else. A tool that hangs is killed at its timeout; what it printed is read up
to a bound (`OUTPUT_MAX`), enough for the one-line message of an `ImagePullError`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainyard.images.types import TOOL_MISSING, UNREACHABLE, ImagePullError

OUTPUT_MAX = 64 * 1024
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ToolResult:
    returncode: int
    stdout: bytes  # at most `stdout_max` bytes (`truncated` when there was more)
    stderr: str  # at most about `OUTPUT_MAX` characters
    truncated: bool = False


def find(tool: str, image: str = "") -> str:
    """The absolute path of `tool` on the plane's PATH or the standard one.

    Raises:
        ImagePullError: TOOL_MISSING, naming the tool and the package to install.
    """
    found = shutil.which(tool) or shutil.which(tool, path=SAFE_PATH)
    if found is None:
        raise ImagePullError(TOOL_MISSING, image or tool,
                             f"{tool} is not installed on this node (scripts/images-setup.sh installs it)")
    return found


def _bounded(data: bytes) -> str:
    if len(data) > OUTPUT_MAX:
        data = data[:OUTPUT_MAX // 2] + b"\n...\n" + data[-OUTPUT_MAX // 2:]
    return data.decode("utf-8", "replace")


def run(argv: Sequence[str], *, timeout: float, image: str = "", home: Path | None = None,
        stdout_max: int = OUTPUT_MAX) -> ToolResult:
    """Run `argv` (its first word found with `find`) with a minimal environment and `timeout`
    seconds; stdout and stderr go to private temporary files and are read back bounded (a tool
    that writes without end fills a file of the plane's temp dir, never its memory).
    `stdout_max`: how much of stdout to keep (a manifest can be larger than an error message).

    Raises:
        ImagePullError: TOOL_MISSING when the tool is absent; UNREACHABLE when it ran past `timeout`
            (a registry that hangs: the tool and its children are killed).
    """
    exe = find(argv[0], image)
    with tempfile.TemporaryDirectory(prefix="trainyard-tool-") as scratch:
        env = {"PATH": SAFE_PATH, "LANG": "C", "HOME": str(home or scratch), "TMPDIR": scratch}
        with open(os.path.join(scratch, "out"), "w+b") as out, open(os.path.join(scratch, "err"), "w+b") as err:
            proc = subprocess.Popen([exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                    cwd=scratch, start_new_session=True, close_fds=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise ImagePullError(UNREACHABLE, image or argv[0],
                                     f"{argv[0]} {argv[1] if len(argv) > 1 else ''} ran past {timeout:g} s "
                                     "(the registry does not answer)") from None
            out.seek(0)
            err.seek(0)
            data = out.read(stdout_max + 1)
            return ToolResult(rc, data[:stdout_max], _bounded(err.read(OUTPUT_MAX + 1)), len(data) > stdout_max)


def last_line(text: str) -> str:
    """The last non-empty line of a tool's message, trimmed (one line for an error)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no message")[:500]
