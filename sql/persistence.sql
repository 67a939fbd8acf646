--
-- Temporary and unlogged gsnap tables.
--
-- Temporary tables work like heap but are never snapshotted: only their own session can
-- read them and they disappear with it. Their writes are not recorded.
CREATE TEMP TABLE ps_temp (id int PRIMARY KEY, v text) USING gsnap;
SELECT FROM new_span();
INSERT INTO ps_temp SELECT i, 'temp' FROM generate_series(1, 500) i;
UPDATE ps_temp SET v = 'changed' WHERE id < 10;
SELECT count(*), count(*) FILTER (WHERE v = 'changed') FROM ps_temp;
SELECT written('ps_temp') AS recorded, gsnap_full_capture_pending('ps_temp') AS full;
TRUNCATE ps_temp;
SELECT gsnap_full_capture_pending('ps_temp') AS full_after_truncate;

-- Unlogged tables work and are tracked like logged ones.
CREATE UNLOGGED TABLE ps_unlogged (id int PRIMARY KEY, v text) USING gsnap;
SELECT FROM new_span();
INSERT INTO ps_unlogged SELECT i, 'u' FROM generate_series(1, 100) i;
SELECT written('ps_unlogged') AS recorded;
SELECT relpersistence FROM pg_class WHERE relname = 'ps_unlogged';
ALTER TABLE ps_unlogged SET LOGGED;
SELECT relpersistence FROM pg_class WHERE relname = 'ps_unlogged';
-- (SET LOGGED copies the rows into new storage behind the access method's back; the
-- snapshot notices the new relfilenode instead.)
SELECT gsnap_full_capture_pending('ps_unlogged') AS full_after_set_logged;
ALTER TABLE ps_unlogged SET UNLOGGED;
SELECT count(*) FROM ps_unlogged;

DROP TABLE ps_temp, ps_unlogged;
