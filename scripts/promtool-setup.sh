#!/usr/bin/env bash
# Install what tests/api/test_metrics.py's lint test needs: Prometheus's `promtool` (Debian's
# `prometheus` package ships it), which checks our /metrics text the way Prometheus reads it.
#
# Idempotent: does nothing (and runs no apt-get at all) when promtool is already there.
# Exit 0: installed. Exit non-zero, with the reason on stderr, when it cannot install.
set -euo pipefail
export PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"

if command -v promtool >/dev/null 2>&1; then
    exit 0
fi

NAME=promtool-setup
# shellcheck source=scripts/_apt-install.sh
source "$(dirname "$0")/_apt-install.sh"
apt_install "no promtool" prometheus

command -v promtool >/dev/null 2>&1 || fail "installed prometheus but promtool is still missing"
echo "promtool-setup: installed $(promtool --version 2>&1 | head -1)" >&2
