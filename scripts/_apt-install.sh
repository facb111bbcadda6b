# Sourced by the *-setup.sh scripts: install Debian packages for the tests, or fail with the reason.
#
#   NAME=slurm-setup; source "$(dirname "$0")/_apt-install.sh"
#   gone=$(missing_commands cmd…); [ -z "$gone" ] && exit 0
#   apt_install "why they are needed" package…
#
# Needs root and apt-get (says so and exits 1 otherwise); apt-get waits up to 5 min for a dpkg
# lock another installer holds; --no-install-recommends, since the recommended extras are never
# needed by the tests. The apt log is kept (and its tail shown) only when a step fails.
#
# Starts no daemon: the packages' postinst scripts would start system services (a prometheus on
# 9090, an alertmanager on 9093, a docker-registry, munge) while every test starts its own on
# its own ports. Where the machine has no /usr/sbin/policy-rc.d, one that refuses every start
# (exit 101, Debian's policy-rc.d interface, which invoke-rc.d and deb-systemd-invoke honour) is
# put there for the install and removed after it.

# The commands among the arguments that are not on PATH, space-separated (nothing when all are).
missing_commands() {
    local m=()
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || m+=("$c")
    done
    echo "${m[*]:-}"
}

fail() {
    echo "${NAME}: $*" >&2
    exit 1
}

apt_install() {
    local why="$1"
    shift
    [ "$(id -u)" = 0 ] || fail "${why}; installing $* needs root (run: sudo $0)"
    command -v apt-get >/dev/null 2>&1 || fail "${why}; no apt-get on this machine (need the Debian/Ubuntu packages $*)"
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)
    local log policy=/usr/sbin/policy-rc.d ours=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# put here by trainyard scripts/_apt-install.sh for one install\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        ours=1
        # shellcheck disable=SC2064  # the path is fixed now
        trap "rm -f '$policy'" EXIT
    fi
    log=$(mktemp "/tmp/${NAME}.XXXXXX.log")
    echo "${NAME}: installing $* (${why}); log in ${log}" >&2
    if ! apt-get "${apt_opts[@]}" update >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        fail "apt-get update failed (no network to the package mirror?)"
    fi
    if ! apt-get "${apt_opts[@]}" install --no-install-recommends "$@" >>"$log" 2>&1; then
        tail -n 20 "$log" >&2
        [ -z "$ours" ] || rm -f "$policy"
        fail "apt-get install $* failed"
    fi
    [ -z "$ours" ] || rm -f "$policy"
    rm -f "$log"
}
