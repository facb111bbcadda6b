#!/usr/bin/env bash
# Install what tests/slurm_cluster.py needs to run a throwaway Slurm cluster on this machine:
# Debian's slurm-wlm (slurmctld, slurmd, slurm-client), slurmdbd (accounting: `sacct` by user and
# account, associations made with sacctmgr; it stores them in MariaDB) and munge.
#
# Idempotent: does nothing (and runs no apt-get at all) when every binary is already there.
# Exit 0: installed. Exit non-zero, with the reason on stderr, when it cannot install.
# Starts no daemon: the test harness starts its own munged/slurmctld/slurmd under its work dir.
set -euo pipefail
export PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"

needed=(munged munge slurmctld slurmd slurmdbd sinfo squeue sbatch srun scontrol scancel sacct sacctmgr)

NAME=slurm-setup
# shellcheck source=scripts/_apt-install.sh
source "$(dirname "$0")/_apt-install.sh"
gone=$(missing_commands "${needed[@]}")
if [ -z "$gone" ]; then
    exit 0
fi

# slurm-wlm otherwise pulls ~40 plugin and -dev packages the tests do not use (no recommends).
apt_install "missing: ${gone}" slurm-wlm slurmdbd munge

gone=$(missing_commands "${needed[@]}")
[ -z "$gone" ] || fail "installed slurm-wlm, slurmdbd and munge but still missing: ${gone}"
echo "slurm-setup: installed $(slurmd -V 2>/dev/null || echo slurm)" >&2
