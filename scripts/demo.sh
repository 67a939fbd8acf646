#!/usr/bin/env bash
# The main job: installs everything, starts a PostgreSQL 15 cluster with gsnap, initializes
# pgbench on gsnap tables, runs pgbench, and shows a few queries. Safe to run again (the
# cluster and its data are kept under $GSNAP_DEMO_DIR and reused).
#
#   scripts/demo.sh            GSNAP_DEMO_SCALE=10 GSNAP_DEMO_SECONDS=30 GSNAP_DEMO_PORT=5433
. "$(dirname "$0")/lib.sh"

DEMO_DIR=${GSNAP_DEMO_DIR:-$GSNAP_CACHE/demo}
PORT=${GSNAP_DEMO_PORT:-5433}
SCALE=${GSNAP_DEMO_SCALE:-10}
SECONDS_TO_RUN=${GSNAP_DEMO_SECONDS:-30}

"$GSNAP_ROOT/scripts/install.sh"
pg_owned_dir "$DEMO_DIR"
"$GSNAP_ROOT/scripts/cluster.sh" start "$DEMO_DIR/data" "$PORT"

export PGHOST="$DEMO_DIR/data" PGPORT="$PORT" PGUSER=postgres PGDATABASE=postgres
psql() { "$PGBIN/psql" -X -v ON_ERROR_STOP=1 "$@"; }

psql -q -c "CREATE EXTENSION IF NOT EXISTS gsnap"
if [ "$(psql -tAc "SELECT to_regclass('pgbench_accounts') IS NOT NULL")" != t ]; then
    log "pgbench -i at scale $SCALE on gsnap tables"
    PGOPTIONS="-c default_table_access_method=gsnap" "$PGBIN/pgbench" -i -s "$SCALE" -q
fi
psql -c "SELECT c.relname AS table, a.amname AS access_method,
                pg_size_pretty(pg_relation_size(c.oid)) AS size
         FROM pg_class c JOIN pg_am a ON a.oid = c.relam
         WHERE c.relname LIKE 'pgbench%' ORDER BY 1"

log "pgbench for $SECONDS_TO_RUN s on gsnap tables"
"$PGBIN/pgbench" -c 4 -j 2 -T "$SECONDS_TO_RUN" -P 5 -n

log "a few queries"
psql -c "SELECT count(*) AS accounts, sum(abalance) AS total_balance FROM pgbench_accounts"
psql -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(bbalance) FROM pgbench_branches) AS balances_consistent"

log "the cluster is still running: psql -h $DEMO_DIR/data -p $PORT -U postgres"
log "stop it with: bash scripts/cluster.sh stop $DEMO_DIR/data"
