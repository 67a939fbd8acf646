#!/usr/bin/env bash
# Runs the pg_regress suite (sql/*.sql against expected/*.out, in the order of sql/schedule)
# on a fresh temporary cluster with gsnap preloaded. Prints the diffs when a test fails.
#
#   scripts/regress.sh [test ...]      (default: every test in sql/schedule)
#
# Assumes the extension is installed (scripts/install.sh). Exit status 0 only if all pass.
. "$(dirname "$0")/lib.sh"

ensure_os_user
ensure_dev_null
work=$(mktemp -d /tmp/gsnap-regress.XXXXXX)
chmod 755 "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data="$work/data"
cleanup() { "$GSNAP_ROOT/scripts/cluster.sh" stop "$data" || true; }
trap cleanup EXIT

# The test files are copied so the unprivileged server user can read them wherever the
# clone lives (for example under /root).
cp -r "$GSNAP_ROOT/sql" "$GSNAP_ROOT/expected" "$work/"
pg_owned_dir "$work/out"
if is_root; then chown -R "$GSNAP_OS_USER": "$work"; fi

"$GSNAP_ROOT/scripts/cluster.sh" start "$data" "$port" \
    "gsnap.database = 'postgres'" "log_min_messages = warning"

if [ $# -gt 0 ]; then tests=("$@"); else tests=(--schedule="$work/sql/schedule"); fi
status=0
as_pg "$PGBIN/../lib/pgxs/src/test/regress/pg_regress" \
    --bindir="$PGBIN" --host="$data" --port="$port" --use-existing --dbname=postgres --user=postgres \
    --inputdir="$work" --outputdir="$work/out" "${tests[@]}" || status=$?
if [ -f "$work/out/regression.diffs" ] && [ $status -ne 0 ]; then
    echo "---- regression.diffs ----"
    cat "$work/out/regression.diffs"
fi
if [ $status -ne 0 ]; then
    echo "---- server log (last 50 lines) ----"
    tail -n 50 "$data/server.log"
fi
exit $status
