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
