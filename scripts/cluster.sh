#!/usr/bin/env bash
# Creates (if needed) and starts a PostgreSQL 15 cluster with gsnap preloaded, run by the
# unprivileged user $GSNAP_OS_USER.
#
#   scripts/cluster.sh start DATADIR PORT [extra postgresql.conf lines...]
#   scripts/cluster.sh stop DATADIR
#
# With GSNAP_TEST_CORES=1 in the environment, the server may write core files (else not).
#
# The server listens on localhost and on a Unix socket in DATADIR.
. "$(dirname "$0")/lib.sh"

cmd=${1:-}; datadir=${2:-}
[ -n "$cmd" ] && [ -n "$datadir" ] || die "usage: $0 start|stop DATADIR [PORT [conf lines...]]"

case "$cmd" in
start)
    port=${3:?port}; shift 3
    ensure_dev_null
    ensure_os_user
    if [ ! -f "$datadir/PG_VERSION" ]; then
        pg_owned_dir "$datadir"
        chmod 700 "$datadir"
        as_pg "$PGBIN/initdb" -D "$datadir" -A trust -U postgres --no-instructions >/dev/null
        {
            echo "# gsnap test/demo settings"
            echo "shared_preload_libraries = 'gsnap'"
            echo "port = $port"
            echo "listen_addresses = 'localhost'"
            echo "unix_socket_directories = '$datadir'"
            echo "logging_collector = off"
            echo "max_connections = 60"
            echo "shared_buffers = 256MB"
            for line in "$@"; do echo "$line"; done
        } >> "$datadir/postgresql.conf"
    fi
    if ! as_pg "$PGBIN/pg_ctl" -D "$datadir" status >/dev/null 2>&1; then
        # GSNAP_TEST_CORES=1: a crashing server process leaves a core file (where the kernel's
        # core_pattern says; "core" puts it in the data directory, which the tests then keep):
        # pg_ctl -c raises the soft limit to the hard one. Otherwise none: a core holds shared
        # memory, hundreds of MB per crash (runuser's PAM session sets the soft limit to 0).
        cores=()
        if [ -n "${GSNAP_TEST_CORES:-}" ]; then cores=(-c); else ulimit -S -c 0; fi
        as_pg "$PGBIN/pg_ctl" -D "$datadir" -l "$datadir/server.log" -w -t 60 "${cores[@]}" start >/dev/null \
            || { tail -n 30 "$datadir/server.log" >&2; die "the server did not start"; }
    fi
    ;;
stop)
    if [ -f "$datadir/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$datadir" -m fast -w stop >/dev/null || true
    fi
    ;;
*) die "unknown command $cmd" ;;
esac
