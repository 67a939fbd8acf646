--
-- Naming a snapshot as a DBA would: gsnap_asof, gsnap_restore and gsnap_undrop take the
-- snapshot as text too, an id ('42'), a label given at declaration ('before the deploy') or
-- a time ('2026-11-17 14:00', 'yesterday'), tried in that order. An untyped literal picks
-- this form (it was ambiguous between the bigint and timestamptz forms).
--
CREATE TABLE sn (id int PRIMARY KEY, v text) USING gsnap;
INSERT INTO sn SELECT g, 'v' || g FROM generate_series(1, 20) g;
SELECT gsnap_snapshot(label => 'sn before the deploy') AS s1 \gset
UPDATE sn SET v = 'bad' WHERE id <= 5;
SELECT gsnap_snapshot(label => 'sn twice') AS s2 \gset
SELECT gsnap_snapshot(label => 'sn twice') AS s3 \gset

-- by label, in FROM (the AS OF scan) and outside it
SELECT count(*) FILTER (WHERE v = 'bad') AS bad, count(*) FROM gsnap_asof(NULL::sn, 'sn before the deploy');
EXPLAIN (COSTS OFF) SELECT * FROM gsnap_asof(NULL::sn, 'sn before the deploy');
SELECT (gsnap_asof(NULL::sn, 'sn before the deploy')).v ORDER BY 1 LIMIT 2;
-- by id written as text, and an untyped id
SELECT count(*) FILTER (WHERE v = 'bad') AS bad FROM gsnap_asof(NULL::sn, :'s2');
SELECT count(*) FILTER (WHERE v = 'bad') AS bad FROM gsnap_asof(NULL::sn, :s2);
-- by time written as text: the latest snapshot at or before it
SELECT count(*) FILTER (WHERE v = 'bad') AS bad FROM gsnap_asof(NULL::sn, 'now');
SELECT count(*) FILTER (WHERE v = 'bad') AS bad FROM gsnap_asof(NULL::sn, now()::text);
-- a prepared statement's text parameter: resolved at each execution
PREPARE sn_q(text) AS SELECT count(*) FILTER (WHERE v = 'bad') FROM gsnap_asof(NULL::sn, $1);
EXECUTE sn_q('sn before the deploy');
EXECUTE sn_q(:'s3');
DEALLOCATE sn_q;

-- what is refused, and how
SELECT regexp_replace(sqlstate_of($$SELECT * FROM gsnap_asof(NULL::sn, 'sn twice')$$),
                      ': \d+, \d+$', ': N, N+1') AS sqlstate_of;
SELECT sqlstate_of($$SELECT * FROM gsnap_asof(NULL::sn, 'no such label')$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_asof(NULL::sn, '1999-01-01')$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_asof(NULL::sn, '0')$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_asof(NULL::sn, NULL::text)$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_asof(NULL::sn, '2026-13-45 99:00')$$);

-- restore and undrop by label
SELECT * FROM gsnap_restore('sn', 'sn before the deploy');
SELECT count(*) FILTER (WHERE v = 'bad') AS bad, count(*) FROM sn;
SELECT * FROM gsnap_restore('sn', 'sn before the deploy', condition => 'id = 1');
DROP TABLE sn;
SET client_min_messages = warning;
SELECT gsnap_undrop('public.sn', 'sn before the deploy', 'sn_back');
RESET client_min_messages;
SELECT count(*) FILTER (WHERE v = 'bad') AS bad, count(*) FROM sn_back;
DROP TABLE sn_back;

-- ranges and diffs: bounds written as ids, labels or times (a range from a time starts at
-- the first snapshot taken at or after it, and ends at the last taken at or before its end)
CREATE TABLE sr (id int PRIMARY KEY, v int) USING gsnap;
INSERT INTO sr SELECT g, g FROM generate_series(1, 100) g;
SELECT clock_timestamp() AS before_r1 \gset
SELECT gsnap_snapshot(label => 'sr month end') AS r1 \gset
SELECT clock_timestamp() AS after_r1 \gset
UPDATE sr SET v = v + 1 WHERE id <= 10;
SELECT gsnap_snapshot() AS r2 \gset
UPDATE sr SET v = v + 1 WHERE id <= 20;
SELECT gsnap_snapshot(label => 'sr today') AS r3 \gset
SELECT clock_timestamp() AS after_r3 \gset
SELECT snap_id - :r1 AS n, count(*), sum((rec).v) FROM gsnap_range(NULL::sr, 'sr month end', 'sr today')
GROUP BY 1 ORDER BY 1;
SELECT snap_id - :r1 AS n, count(*) FROM gsnap_range(NULL::sr, :'after_r1', :'after_r3') GROUP BY 1 ORDER BY 1;
SELECT snap_id - :r1 AS n, count(*) FROM gsnap_range(NULL::sr, :'r2', 'sr today') GROUP BY 1 ORDER BY 1;
SELECT count(*) FROM gsnap_versions(NULL::sr, 'sr month end', :'after_r3');
SELECT change, count(*) FROM gsnap_diff(NULL::sr, 'sr month end', 'sr today') GROUP BY 1 ORDER BY 1;
SELECT count(*) FROM gsnap_diff_by_key(NULL::sr, 'sr month end', :'r2');
SELECT count(*) FROM gsnap_diff_at(NULL::sr, :'r2', 'sr today');
-- a range starting after the last snapshot
SELECT sqlstate_of($$SELECT * FROM gsnap_range(NULL::sr, '2999-01-01', '2999-12-31')$$);
-- bounds of type timestamptz (now(), an expression, a driver's parameter): the same rules
SELECT snap_id - :r1 AS n, count(*) FROM gsnap_range(NULL::sr, :'before_r1'::timestamptz, now())
GROUP BY 1 ORDER BY 1;
SELECT snap_id - :r1 AS n, count(*)
FROM gsnap_range(NULL::sr, :'after_r1'::timestamptz, now() + interval '1 hour') GROUP BY 1 ORDER BY 1;
SELECT snap_id - :r1 AS n, count(*)
FROM gsnap_range(NULL::sr, :'before_r1'::timestamptz, :'after_r1'::timestamptz) GROUP BY 1 ORDER BY 1;
EXPLAIN (COSTS OFF) SELECT * FROM gsnap_range(NULL::sr, now() - interval '1 hour', now());
SELECT first_snap - :r1 AS f, last_snap - :r1 AS l, count(*)
FROM gsnap_versions(NULL::sr, :'before_r1'::timestamptz, now()) GROUP BY 1, 2 ORDER BY 1, 2;
SELECT change, count(*) FROM gsnap_diff(NULL::sr, :'after_r1'::timestamptz, now()) GROUP BY 1 ORDER BY 1;
SELECT change, count(*) FROM gsnap_diff_by_key(NULL::sr, :'after_r1'::timestamptz, now()) GROUP BY 1;
SELECT count(*) FROM gsnap_diff_at(NULL::sr, :'after_r1'::timestamptz, now());
SELECT count(*) FROM (SELECT gsnap_range(NULL::sr, :'after_r1'::timestamptz, now())) AS outside_from;
PREPARE sr_q(timestamptz, timestamptz) AS
    SELECT count(DISTINCT snap_id) FROM gsnap_range(NULL::sr, $1, $2);
EXECUTE sr_q(:'before_r1', now());
EXECUTE sr_q(:'after_r1', :'after_r3');
DEALLOCATE sr_q;
SELECT sqlstate_of($$SELECT * FROM gsnap_range(NULL::sr, now() + interval '1 day', now() + interval '2 days')$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_range(NULL::sr, NULL::timestamptz, now())$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_diff(NULL::sr, '1999-01-01'::timestamptz, now())$$);
-- an id and a text (a label or a time) mixed: each bound read by its own kind
SELECT snap_id - :r1 AS n, count(*) FROM gsnap_range(NULL::sr, :r1, 'sr today') GROUP BY 1 ORDER BY 1;
SELECT snap_id - :r1 AS n, count(*) FROM gsnap_range(NULL::sr, 'sr month end', :r2) GROUP BY 1 ORDER BY 1;
SELECT count(*) FROM gsnap_versions(NULL::sr, :r1, :'after_r3');
SELECT change, count(*) FROM gsnap_diff(NULL::sr, 'sr month end', :r3) GROUP BY 1 ORDER BY 1;
SELECT count(*) FROM gsnap_diff_by_key(NULL::sr, :r1, 'sr today');
SELECT count(*) FROM gsnap_diff_at(NULL::sr, 'sr month end', :r2);
-- an id and a timestamptz value do not mix (give the time as text, or both as times)
SELECT sqlstate_of($$SELECT * FROM gsnap_range(NULL::sr, 1, now())$$);
DROP TABLE sr;

-- a dropped table's rows by label
CREATE TABLE sd (id int, v text) USING gsnap;
INSERT INTO sd VALUES (1, 'kept');
SELECT gsnap_snapshot(label => 'sd before drop') IS NOT NULL AS taken;
DROP TABLE sd;
SELECT * FROM gsnap_asof_dropped('public.sd', 'sd before drop') AS t(id int, v text);
-- a NULL snapshot, in each form, names the argument
SELECT sqlstate_of($$SELECT * FROM gsnap_asof_dropped('public.sd', NULL::text) AS t(id int, v text)$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_asof_dropped('public.sd', NULL::bigint) AS t(id int, v text)$$);
SELECT sqlstate_of($$SELECT gsnap_table_definition('public.sd', NULL)$$);
SELECT sqlstate_of($$SELECT gsnap_undrop('public.sd', NULL::bigint)$$);
SELECT sqlstate_of($$SELECT gsnap_undrop('public.sd', NULL::text)$$);
