# Shared settings and helpers for gsnap's scripts. Source it: `. "$(dirname "$0")/lib.sh"`.
#
# Everything expensive (cargo's target directory, cargo-pgrx, pgrx's home) lives in a cache
# outside the clone, so a second run on the same machine is fast and a fresh machine works.

set -euo pipefail

GSNAP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GSNAP_CACHE=${GSNAP_CACHE:-/var/cache/gsnap}
PGRX_VERSION=0.18.1
PG_MAJOR=15
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$PG_MAJOR/bin/pg_config}
PGBIN=/usr/lib/postgresql/$PG_MAJOR/bin
# The unprivileged OS user that runs PostgreSQL (the server refuses to run as root).
GSNAP_OS_USER=${GSNAP_OS_USER:-gsnap}

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$GSNAP_CACHE/target}
export PGRX_HOME=${PGRX_HOME:-$GSNAP_CACHE/pgrx-home}
export CARGO_PGRX_DISABLE_GC_SECTIONS_WORKAROUND=1
export PATH="$GSNAP_CACHE/tools/bin:$HOME/.cargo/bin:$PATH"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# A tool writing `-o /dev/null` as root can replace /dev/null with a regular file; initdb then
# fails for the unprivileged user. Put the device back.
ensure_dev_null() {
    if [ ! -c /dev/null ]; then
        is_root || die "/dev/null is not a character device; ask root to recreate it"
        rm -f /dev/null
        mknod -m 666 /dev/null c 1 3
    fi
}

# Runs a command as the unprivileged PostgreSQL user (or as ourselves when not root).
as_pg() {
    if is_root; then
        runuser -u "$GSNAP_OS_USER" -- "$@"
    else
        "$@"
    fi
}

ensure_os_user() {
    if is_root && ! id "$GSNAP_OS_USER" >/dev/null 2>&1; then
        log "creating OS user $GSNAP_OS_USER"
        useradd --system --create-home --shell /bin/bash "$GSNAP_OS_USER"
    fi
}

# Makes a directory owned by the PostgreSQL user.
pg_owned_dir() {
    mkdir -p "$1"
    if is_root; then chown "$GSNAP_OS_USER": "$1"; fi
}
