#!/usr/bin/env bash
# Install what tests/slurm_cluster.py needs to run a throwaway Slurm cluster on this machine:
# Debian's slurm-wlm (slurmctld, slurmd, slurm-client) and munge.
#
# Idempotent: does nothing (and runs no apt-get at all) when every binary is already there.
# Exit 0: installed. Exit non-zero, with the reason on stderr, when it cannot install.
# Starts no daemon: the test harness starts its own munged/slurmctld/slurmd under its work dir.
set -euo pipefail
export PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"

needed=(munged munge slurmctld slurmd sinfo squeue sbatch srun scontrol scancel sacct)

missing() {
    local m=()
    for c in "${needed[@]}"; do
        command -v "$c" >/dev/null 2>&1 || m+=("$c")
    done
    echo "${m[*]:-}"
}

gone=$(missing)
if [ -z "$gone" ]; then
    exit 0
fi

fail() {
    echo "slurm-setup: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || fail "missing ${gone}; installing slurm-wlm and munge needs root (run: sudo $0)"
command -v apt-get >/dev/null 2>&1 || fail "missing ${gone}; no apt-get on this machine (need Debian/Ubuntu packages slurm-wlm and munge)"

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)
log=$(mktemp /tmp/slurm-setup.XXXXXX.log)
echo "slurm-setup: installing slurm-wlm munge (missing: ${gone}); log in ${log}" >&2
if ! apt-get "${apt_opts[@]}" update >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "apt-get update failed (no network to the package mirror?)"
fi
# --no-install-recommends: slurm-wlm otherwise pulls ~40 plugin and -dev packages the tests do not use.
if ! apt-get "${apt_opts[@]}" install --no-install-recommends slurm-wlm munge >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "apt-get install slurm-wlm munge failed"
fi

gone=$(missing)
[ -z "$gone" ] || fail "installed slurm-wlm and munge but still missing: ${gone}"
rm -f "$log"
echo "slurm-setup: installed $(slurmd -V 2>/dev/null || echo slurm)" >&2
