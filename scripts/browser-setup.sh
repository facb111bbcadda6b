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

fail() {
    echo "browser-setup: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || fail "no Chromium at ${browser}; installing it needs root (run: sudo $0)"
command -v apt-get >/dev/null 2>&1 || fail "no Chromium at ${browser}; no apt-get on this machine (install Chromium and set TRAINYARD_CHROMIUM to its path)"

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)
log=$(mktemp /tmp/browser-setup.XXXXXX.log)
echo "browser-setup: installing chromium; log in ${log}" >&2
if ! apt-get "${apt_opts[@]}" update >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "apt-get update failed (no network to the package mirror?)"
fi
# --no-install-recommends: the recommended extras (sandbox helpers, l10n, drivers) are not needed headless.
if ! apt-get "${apt_opts[@]}" install --no-install-recommends chromium fonts-dejavu-core >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "apt-get install chromium failed"
fi

[ -x "$browser" ] || fail "installed chromium but ${browser} is still missing"
rm -f "$log"
echo "browser-setup: installed $("$browser" --version 2>/dev/null || echo chromium)" >&2
