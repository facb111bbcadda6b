#!/usr/bin/env bash
# Install what the dashboard's browser tests (tests/api/test_dashboard_browser.py) need: Debian's
# Chromium, which Playwright drives headless (`executable_path=/usr/bin/chromium`). Playwright's
# own browser download (`playwright install`) is never used: the tests take the system's browser.
#
# Idempotent: does nothing (and runs no apt-get at all) when Chromium is already there.
# Exit 0: installed. Exit non-zero, with the reason on stderr, when it cannot install.
set -euo pipefail
export PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"

browser="${TRAINYARD_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$browser" ]; then
    exit 0
fi

NAME=browser-setup
# shellcheck source=scripts/_apt-install.sh
source "$(dirname "$0")/_apt-install.sh"
apt_install "no Chromium at ${browser}" chromium fonts-dejavu-core

[ -x "$browser" ] || fail "installed chromium but ${browser} is still missing"
echo "browser-setup: installed $("$browser" --version 2>/dev/null || echo chromium)" >&2
