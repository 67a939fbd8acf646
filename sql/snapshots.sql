--
-- Declaring snapshots and reading tables as of them.
--
CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric) USING gsnap;
INSERT INTO acct SELECT i, 'owner ' || i, i * 10 FROM generate_series(1, 2000) i;

-- gsnap_snapshot() returns once the snapshot is durable; ids increase.
SELECT gsnap_snapshot() AS s1 \gset
CREATE TEMP TABLE acct_at_s1 AS SELECT * FROM acct;
UPDATE acct SET balance = balance + 1 WHERE id % 3 = 0;
DELETE FROM acct WHERE id % 7 = 0;
INSERT INTO acct SELECT i, 'late ' || i, 0 FROM generate_series(2001, 2300) i;
SELECT gsnap_snapshot() AS s2 \gset
CREATE TEMP TABLE acct_at_s2 AS SELECT * FROM acct;
SELECT :s2 > :s1 AS ids_increase;

-- The table as of each snapshot is exactly what it held then.
SELECT asof_matches('acct', :s1, 'acct_at_s1') AS s1_exact,
       asof_matches('acct', :s2, 'acct_at_s2') AS s2_exact;
SELECT count(*), sum(balance) FROM gsnap_asof(NULL::acct, :s1);
SELECT count(*), sum(balance) FROM gsnap_asof(NULL::acct, :s2);
SELECT * FROM gsnap_asof(NULL::acct, :s1) WHERE id IN (3, 7, 2001) ORDER BY id;
SELECT * FROM gsnap_asof(NULL::acct, :s2) WHERE id IN (3, 7, 2001) ORDER BY id;

-- Snapshots can be joined, filtered and aggregated like any set of rows.
SELECT count(*) AS changed_owners
FROM gsnap_asof(NULL::acct, :s1) a JOIN gsnap_asof(NULL::acct, :s2) b USING (id)
WHERE a.balance <> b.balance;

-- A snapshot of a table that did not change reuses its pages.
SELECT gsnap_snapshot() AS s3 \gset
SELECT asof_matches('acct', :s3, 'acct_at_s2') AS s3_exact;
SELECT pages_captured, new_images FROM gsnap_snapshots() WHERE snap_id = :s3;

-- The listing
SELECT state, tables > 0 AS has_tables, pages_captured > 0 AS captured,
       taken_at <= now() AS in_the_past, lsn > '0/0'::pg_lsn AS has_lsn
FROM gsnap_snapshots() WHERE snap_id = :s1;
SELECT table_name, blocks > 0 AS has_blocks FROM gsnap_snapshot_tables(:s1)
WHERE table_oid = 'acct'::regclass;

-- As of a time: the latest snapshot taken at or before it.
SELECT taken_at AS s2_time FROM gsnap_snapshots() WHERE snap_id = :s2 \gset
SELECT asof_matches('acct', :s2, 'acct_at_s2') AS by_id,
       (SELECT count(*) FROM gsnap_asof(NULL::acct, :'s2_time'::timestamptz))
     = (SELECT count(*) FROM acct_at_s2) AS by_time;
SELECT count(*) = (SELECT count(*) FROM acct_at_s1) AS just_before_s2
FROM gsnap_asof(NULL::acct, :'s2_time'::timestamptz - interval '1 microsecond');

-- gsnap_snapshot(false) returns right after declaring; the capture finishes in the
-- background and the snapshot then reads like any other.
UPDATE acct SET owner = 'async' WHERE id = 1;
SELECT gsnap_snapshot(false) AS s4 \gset
UPDATE acct SET owner = 'after s4' WHERE id = 1;
SELECT gsnap_snapshot() > :s4 AS later_snapshot;
SELECT owner FROM gsnap_asof(NULL::acct, :s4) WHERE id = 1;

-- Uncommitted and rolled-back work is not in a snapshot, committed work is.
BEGIN;
UPDATE acct SET owner = 'uncommitted' WHERE id = 2;
SELECT gsnap_snapshot(false) AS s5 \gset
ROLLBACK;
-- (its capture may still run: the read waits for it, with a NOTICE that depends on timing)
SET client_min_messages = warning;
SELECT owner FROM gsnap_asof(NULL::acct, :s5) WHERE id = 2;
RESET client_min_messages;

-- Progress: idle, and it knows the last durable snapshot.
SELECT worker, phase, last_durable >= :s4 AS recent FROM gsnap_progress();

DROP TABLE acct;
