"""Text from the store, made safe for a terminal before the CLI prints it.

Job names, commands, reasons, event messages, drain reasons and token users are typed by other
people; printed raw, an ESC starts a terminal control sequence (recolour, move the cursor, clear
the screen, retitle the window, write a hyperlink, on some terminals answer back as keystrokes),
a CR overwrites what the line showed, and bidirectional overrides make text read as something
else. `clean` shows each such character as a visible escape instead:

    \\t \\n \\r          tab, line feed, carriage return
    \\xHH               any other C0 control, DEL, and the C1 controls (U+0080..U+009F)
    \\uHHHH             Unicode's line and paragraph separators and bidirectional controls

Plain spaces and every printable character (accents, CJK, emoji) are left alone; a backslash is
left as it is (so `a\\x1bb` typed literally looks the same as an escaped ESC: it is text either
way, never a control). JSON output (`--json`) is not cleaned: JSON escapes controls itself, and
scripts get the values exactly. Logs (`yard logs`) are not cleaned either: they are the job's
own output, to its owner, as `cat` would show them (progress bars use CR).
"""

from __future__ import annotations

import re
from typing import Any

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def clean(value: Any) -> str:
    """`str(value)` with every control character escaped (see the module docstring)."""
    text = "" if value is None else str(value)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def clean_lines(text: str) -> str:
    """Multi-line text (a YAML configuration, a diff) with its line feeds kept and every other
    control character escaped."""
    return "\n".join(clean(line) for line in text.split("\n"))
