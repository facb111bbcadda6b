#!/usr/bin/env bash
# Install what the container-image tests (issue 37) need, from Debian's packages:
#   docker-registry  the CNCF distribution registry, run on loopback by the tests;
#   skopeo           the client that copies images between a registry and an OCI layout;
#   umoci            builds OCI images from a root file system, unpacks them into bundles;
#   runc             the OCI runtime (crun refuses this machine's hybrid cgroup v1 layout);
#   mmdebstrap       builds the Debian root file systems the test images start from;
#   uidmap           newuidmap/newgidmap, for rootless unpacking and user-namespaced containers.
#
# Idempotent: does nothing (and runs no apt-get at all) when every binary is already there.
# Exit 0: installed. Exit non-zero, with the reason on stderr, when it cannot install.
# Starts no daemon: the tests start their own registry with their own config under their work dir
# (the package's systemd unit, where systemd runs, is stopped and disabled here so that it does not
# hold port 5000).
set -euo pipefail
export PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"

needed=(docker-registry skopeo umoci runc mmdebstrap newuidmap newgidmap)

NAME=images-setup
# shellcheck source=scripts/_apt-install.sh
source "$(dirname "$0")/_apt-install.sh"
gone=$(missing_commands "${needed[@]}")
if [ -z "$gone" ]; then
    exit 0
fi

apt_install "missing: ${gone}" docker-registry skopeo umoci runc mmdebstrap uidmap

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
fi

gone=$(missing_commands "${needed[@]}")
[ -z "$gone" ] || fail "installed docker-registry, skopeo, umoci, runc, mmdebstrap and uidmap but still missing: ${gone}"
echo "images-setup: installed runc $(runc --version 2>/dev/null | sed -n 's/^runc version //p'), $(skopeo --version 2>/dev/null), umoci $(umoci --version 2>/dev/null | awk '{print $NF}')" >&2
