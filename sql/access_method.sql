--
-- Moving tables to and from gsnap with ALTER TABLE ... SET ACCESS METHOD, and the
-- default_table_access_method setting.
--
CREATE TABLE am_t (id int PRIMARY KEY, v text) USING heap;
INSERT INTO am_t SELECT i, 'row ' || i FROM generate_series(1, 1000) i;
CREATE INDEX am_t_v ON am_t (v);
CREATE TEMP TABLE am_before AS SELECT * FROM am_t;

ALTER TABLE am_t SET ACCESS METHOD gsnap;
SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.relname = 'am_t';
SELECT count(*) AS same FROM am_t JOIN am_before USING (id, v);
SET enable_seqscan = off;
SELECT id FROM am_t WHERE v = 'row 500';
RESET enable_seqscan;
UPDATE am_t SET v = v || '*' WHERE id <= 10;

ALTER TABLE am_t SET ACCESS METHOD heap;
SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.relname = 'am_t';
SELECT count(*), count(*) FILTER (WHERE v LIKE '%*') AS updated FROM am_t;

-- default_table_access_method makes new tables gsnap
SET default_table_access_method = gsnap;
CREATE TABLE am_default (id int);
CREATE TABLE am_ctas AS SELECT * FROM am_t;
CREATE MATERIALIZED VIEW am_mv AS SELECT id FROM am_t WHERE id < 10;
RESET default_table_access_method;
SELECT c.relname, a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE c.relname IN ('am_default', 'am_ctas', 'am_mv') ORDER BY 1;
REFRESH MATERIALIZED VIEW am_mv;
CREATE UNIQUE INDEX am_mv_id ON am_mv (id);
SET default_table_access_method = gsnap;
REFRESH MATERIALIZED VIEW CONCURRENTLY am_mv;
RESET default_table_access_method;
SELECT count(*) FROM am_mv;

-- a rewriting ALTER TABLE keeps the access method
ALTER TABLE am_ctas ALTER COLUMN v TYPE varchar(40);
ALTER TABLE am_ctas ADD COLUMN extra int DEFAULT 7;
SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.relname = 'am_ctas';
SELECT count(*), sum(extra) FROM am_ctas;

-- the access method cannot be dropped while tables use it
DROP ACCESS METHOD gsnap;

DROP MATERIALIZED VIEW am_mv;
DROP TABLE am_t, am_default, am_ctas;
