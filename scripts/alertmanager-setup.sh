#!/usr/bin/env bash
# Install what tests/deploy/test_alerts_live.py needs to run a real Prometheus and Alertmanager
# against a live `yard up`: Debian's `prometheus` (prometheus, promtool) and
# `prometheus-alertmanager` (prometheus-alertmanager, amtool).
#
# Idempotent: does nothing (and runs no apt-get at all) when every binary is already there.
# Exit 0: installed. Exit non-zero, with the reason on stderr, when it cannot install.
#
# Starts no daemon: the packages' postinst would start the system's prometheus (port 9090) and
# alertmanager (9093), and the test starts its own on free loopback ports: _apt-install.sh keeps
# the postinst from starting them (policy-rc.d). Where a service runs all the same afterwards (a
# machine's own policy-rc.d allows it), it is stopped and disabled.
set -euo pipefail
export PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"

needed=(prometheus promtool prometheus-alertmanager amtool)
SERVICES=(prometheus prometheus-alertmanager)

NAME=alertmanager-setup
# shellcheck source=scripts/_apt-install.sh
source "$(dirname "$0")/_apt-install.sh"
gone=$(missing_commands "${needed[@]}")
if [ -z "$gone" ]; then
    exit 0
fi

apt_install "missing: ${gone}" prometheus prometheus-alertmanager

# A service started all the same (a policy-rc.d that allows it): stop it, and keep it from boot.
for svc in "${SERVICES[@]}"; do
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif [ -x "/etc/init.d/$svc" ]; then
        "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
        command -v update-rc.d >/dev/null 2>&1 && update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
done

gone=$(missing_commands "${needed[@]}")
[ -z "$gone" ] || fail "installed prometheus and prometheus-alertmanager but still missing: ${gone}"
echo "${NAME}: installed $(prometheus --version 2>&1 | head -1); $(prometheus-alertmanager --version 2>&1 | head -1)" >&2
