#!/usr/bin/env bash
# The main job: installs everything, starts a PostgreSQL 15 cluster with gsnap (a snapshot
# of every gsnap table every 10 s), initializes pgbench on gsnap tables, runs pgbench with
# those periodic snapshots, and shows AS OF queries over them. Safe to run again: the
# cluster and its data are kept under $GSNAP_DEMO_DIR and reused.
#
#   scripts/demo.sh        (GSNAP_DEMO_SCALE=10 GSNAP_DEMO_SECONDS=40 GSNAP_DEMO_PORT=5433)
. "$(dirname "$0")/lib.sh"

DEMO_DIR=${GSNAP_DEMO_DIR:-$GSNAP_CACHE/demo}
PORT=${GSNAP_DEMO_PORT:-5433}
SCALE=${GSNAP_DEMO_SCALE:-10}
SECONDS_TO_RUN=${GSNAP_DEMO_SECONDS:-40}

"$GSNAP_ROOT/scripts/install.sh"
pg_owned_dir "$DEMO_DIR"
"$GSNAP_ROOT/scripts/cluster.sh" start "$DEMO_DIR/data" "$PORT" "gsnap.snapshot_interval = 10"

export PGHOST="$DEMO_DIR/data" PGPORT="$PORT" PGUSER=postgres PGDATABASE=postgres
psql() { "$PGBIN/psql" -X -v ON_ERROR_STOP=1 "$@"; }

# A demo cluster kept from an earlier build has that build's SQL functions: when the
# extension's install script changed since, the demo's extension and tables are made again
# (the demo's data is disposable; a real database would use ALTER EXTENSION ... UPDATE).
script_hash=$(cat "$("$PG_CONFIG" --sharedir)"/extension/gsnap--*.sql | sha256sum | cut -c1-16)
if [ -f "$DEMO_DIR/extension-script" ] && [ "$(cat "$DEMO_DIR/extension-script")" != "$script_hash" ]; then
    log "gsnap's SQL changed since this demo cluster was made: recreating the extension and the pgbench tables"
    psql -q -c "DROP EXTENSION IF EXISTS gsnap CASCADE"
fi
psql -q -c "CREATE EXTENSION IF NOT EXISTS gsnap"
echo "$script_hash" > "$DEMO_DIR/extension-script"
if [ "$(psql -tAc "SELECT to_regclass('pgbench_accounts') IS NOT NULL")" != t ]; then
    log "pgbench -i at scale $SCALE on gsnap tables"
    PGOPTIONS="-c default_table_access_method=gsnap" "$PGBIN/pgbench" -i -s "$SCALE" -q
fi
psql -c "SELECT c.relname AS table, a.amname AS access_method,
                pg_size_pretty(pg_relation_size(c.oid)) AS size
         FROM pg_class c JOIN pg_am a ON a.oid = c.relam
         WHERE c.relname LIKE 'pgbench%' ORDER BY 1"

log "a first snapshot (it waits until the capture is durable)"
first=$(psql -tAc "SELECT gsnap_snapshot()")
echo "snapshot $first"

log "pgbench for $SECONDS_TO_RUN s on gsnap tables, with a snapshot every 10 s"
"$PGBIN/pgbench" -c 4 -j 2 -T "$SECONDS_TO_RUN" -P 10 -n
last=$(psql -tAc "SELECT gsnap_snapshot()")

log "the snapshots"
psql -c "SELECT snap_id, taken_at, lsn, state, pages_captured,
                pg_size_pretty(bytes_stored) AS stored
         FROM gsnap_snapshots() WHERE snap_id >= $first ORDER BY snap_id"

log "every snapshot is transactionally consistent: accounts, tellers and branches balance"
psql -c "SELECT s.snap_id,
                (SELECT sum(abalance) FROM gsnap_asof(NULL::pgbench_accounts, s.snap_id)) AS accounts,
                (SELECT sum(tbalance) FROM gsnap_asof(NULL::pgbench_tellers, s.snap_id)) AS tellers,
                (SELECT sum(bbalance) FROM gsnap_asof(NULL::pgbench_branches, s.snap_id)) AS branches
         FROM gsnap_snapshots() s
         WHERE s.state = 'committed' AND s.snap_id >= $first ORDER BY s.snap_id"

log "the history table as of 20 seconds ago, and what changed since the first snapshot"
psql -c "SELECT count(*) AS history_rows_20_seconds_ago
         FROM gsnap_asof(NULL::pgbench_history, now() - interval '20 seconds')"
psql -c "SELECT count(*) AS accounts_changed, sum(b.abalance - a.abalance) AS net_change
         FROM gsnap_asof(NULL::pgbench_accounts, $first) a
         JOIN gsnap_asof(NULL::pgbench_accounts, $last) b USING (aid)
         WHERE a.abalance <> b.abalance"
log "one teller's balance at every snapshot, and what the last snapshot changed"
psql -c "SELECT snap_id, (rec).tbalance FROM gsnap_range(NULL::pgbench_tellers, $first, $last)
         WHERE (rec).tid = 1 ORDER BY snap_id"
psql -c "SELECT change, count(*) FROM gsnap_diff(NULL::pgbench_accounts,
                (SELECT max(snap_id) FROM gsnap_snapshots()
                 WHERE state = 'committed' AND snap_id < $last), $last)
         GROUP BY change ORDER BY change"
log "history at the cost of the change: each version of teller 1 once, and the branches' total per snapshot"
psql -c "SELECT first_snap, last_snap, (rec).tbalance FROM gsnap_versions(NULL::pgbench_tellers, $first, $last)
         WHERE (rec).tid = 1 ORDER BY first_snap"
psql -c "EXPLAIN (COSTS OFF) SELECT snap_id, sum((rec).bbalance) FROM gsnap_range(NULL::pgbench_branches, $first, $last)
         GROUP BY snap_id"
psql -c "SELECT snap_id, count(*) AS branches, sum((rec).bbalance) AS total
         FROM gsnap_range(NULL::pgbench_branches, $first, $last) GROUP BY snap_id ORDER BY snap_id"
log "undoing a bad deploy: the tellers of branch 1 zeroed, then put back as they were at the last snapshot"
psql -c "UPDATE pgbench_tellers SET tbalance = 0 WHERE bid = 1"
psql -c "SELECT * FROM gsnap_restore('pgbench_tellers', $last, condition => 'bid = 1')"
psql -c "SELECT count(*) AS tellers_as_at_the_snapshot
         FROM pgbench_tellers t JOIN gsnap_asof(NULL::pgbench_tellers, $last) s USING (tid)
         WHERE t.tbalance = s.tbalance"
log "a table dropped by mistake: listed as dropped in the snapshot, then brought back as it was"
psql -c "DROP TABLE pgbench_branches"
psql -c "SELECT table_name, dropped FROM gsnap_snapshot_tables($last) WHERE dropped"
psql -c "SELECT gsnap_undrop('public.pgbench_branches', $last) AS rows_loaded"
psql -c "SELECT count(*) AS branches_as_at_the_snapshot
         FROM pgbench_branches b
         JOIN gsnap_asof_dropped('public.pgbench_branches', $last) AS s(bid int, bbalance int, filler char(88))
         USING (bid) WHERE b.bbalance = s.bbalance"
log "lifetimes: what a policy would keep (gsnap.retention), and what deleting each snapshot frees"
psql -c "SELECT p.snap_id, p.rank, p.action, p.rule, pg_size_pretty(s.frees_bytes) AS deleting_frees
         FROM gsnap_retention_preview('within=20s minutely=1') p JOIN gsnap_snapshots() s USING (snap_id)
         WHERE p.snap_id >= $first ORDER BY p.snap_id"
psql -c "SELECT pg_size_pretty(content_bytes) AS live_content, pg_size_pretty(disk_bytes) AS on_disk
         FROM gsnap_store_stats()"
psql -c "SELECT worker, phase, last_durable, last_durable_at FROM gsnap_progress()"

log "the cluster is still running: psql -h $DEMO_DIR/data -p $PORT -U postgres"
log "stop it with: bash scripts/cluster.sh stop $DEMO_DIR/data"
