"""A real headless Chromium for the dashboard tests: Playwright driving the system's browser.

The browser is Debian's `chromium` (`/usr/bin/chromium`, or `TRAINYARD_CHROMIUM`), installed by
`scripts/browser-setup.sh`; Playwright's own browser download is never used. When the browser is
missing and we are root, `browser_available()` runs the set-up script once (under a file lock, so
parallel test workers do not race on dpkg), unless TRAINYARD_BROWSER_NO_INSTALL=1; otherwise the
tests skip with the reason.

Screenshots go to `$TRAINYARD_ARTIFACTS/dashboard/` (default: `test-artifacts/dashboard/` in the
repository, which git ignores).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.setup_once import install_once

REPO = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = REPO / "scripts" / "browser-setup.sh"
NO_INSTALL_ENV = "TRAINYARD_BROWSER_NO_INSTALL"
_availability: list[str | None] = []


def chromium_path() -> Path:
    return Path(os.environ.get("TRAINYARD_CHROMIUM", "/usr/bin/chromium"))


def artifacts_dir() -> Path:
    base = Path(os.environ["TRAINYARD_ARTIFACTS"]) if os.environ.get("TRAINYARD_ARTIFACTS") else REPO / "test-artifacts"
    d = base / "dashboard"
    d.mkdir(parents=True, exist_ok=True)
    return d


def browser_available() -> str | None:
    """None when Playwright can drive a Chromium here; otherwise why not (a message for pytest.skip)."""
    if not _availability:
        _availability.append(_check())
    return _availability[0]


def _check() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the dashboard's browser tests need Playwright: pip install -e '.[test]'"
    browser = chromium_path()
    failed = install_once(SETUP_SCRIPT, lambda: not _runs(browser), NO_INSTALL_ENV)
    if failed is not None:
        return f"Chromium not installable here: {browser} still missing after scripts/{SETUP_SCRIPT.name}: {failed}"
    if not _runs(browser):
        how = "set" if os.environ.get(NO_INSTALL_ENV) == "1" else "not set"
        return (f"no Chromium at {browser}; run `sudo scripts/browser-setup.sh` (installs Debian's chromium) or set "
                f"TRAINYARD_CHROMIUM to a Chromium binary ({NO_INSTALL_ENV} is {how})")
    return None


def _runs(browser: Path) -> bool:
    return browser.is_file() and os.access(browser, os.X_OK)
