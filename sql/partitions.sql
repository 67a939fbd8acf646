--
-- Partitioned tables with gsnap partitions (alone and mixed with heap partitions).
--
CREATE TABLE pt (id int, region text, amount numeric) PARTITION BY LIST (region);
CREATE TABLE pt_eu PARTITION OF pt FOR VALUES IN ('eu') USING gsnap;
CREATE TABLE pt_us PARTITION OF pt FOR VALUES IN ('us') USING gsnap;
CREATE TABLE pt_other PARTITION OF pt DEFAULT USING heap;
-- the access method cannot be set on the partitioned table itself (as for any table AM)
CREATE TABLE pt_bad (id int) PARTITION BY RANGE (id) USING gsnap;
SELECT c.relname, a.amname FROM pg_class c LEFT JOIN pg_am a ON a.oid = c.relam
WHERE c.relname LIKE 'pt%' ORDER BY 1;

INSERT INTO pt SELECT i, (ARRAY['eu', 'us', 'apac'])[1 + i % 3], i * 1.5
FROM generate_series(1, 3000) i;
SELECT tableoid::regclass, count(*), sum(amount) FROM pt GROUP BY 1 ORDER BY 1;

-- an UPDATE that moves rows across partitions (delete + insert) records both tables
SELECT FROM new_span();
UPDATE pt SET region = 'us' WHERE id BETWEEN 1 AND 30 AND region = 'eu';
SELECT cardinality(written('pt_eu')) > 0 AS eu_written,
       cardinality(written('pt_us')) > 0 AS us_written;
SELECT tableoid::regclass, count(*) FROM pt GROUP BY 1 ORDER BY 1;

-- COPY routes rows to partitions
COPY pt FROM STDIN (FORMAT csv);
5001,eu,1
5002,us,2
5003,latam,3
\.
SELECT tableoid::regclass, id FROM pt WHERE id > 5000 ORDER BY id;

-- an index on the partitioned table is built on each partition
CREATE INDEX pt_id ON pt (id);
SET enable_seqscan = off;
SELECT tableoid::regclass, id FROM pt WHERE id = 5002;
RESET enable_seqscan;

-- attach and detach a gsnap partition
CREATE TABLE pt_apac (LIKE pt) USING gsnap;
DELETE FROM pt WHERE region = 'apac';
ALTER TABLE pt ATTACH PARTITION pt_apac FOR VALUES IN ('apac');
INSERT INTO pt VALUES (6000, 'apac', 1);
SELECT tableoid::regclass, id FROM pt WHERE region = 'apac';
ALTER TABLE pt DETACH PARTITION pt_eu;
SELECT count(*) AS detached_rows FROM pt_eu;
SELECT count(*) AS remaining FROM pt;

-- range partitions, pruning, and a gsnap partition as the default
CREATE TABLE pr (d date, v int) PARTITION BY RANGE (d);
CREATE TABLE pr_2025 PARTITION OF pr FOR VALUES FROM ('2025-01-01') TO ('2026-01-01') USING gsnap;
CREATE TABLE pr_def PARTITION OF pr DEFAULT USING gsnap;
INSERT INTO pr SELECT DATE '2025-01-01' + i, i FROM generate_series(0, 500) i;
EXPLAIN (COSTS OFF) SELECT count(*) FROM pr WHERE d >= '2025-02-01' AND d < '2025-06-01';
SELECT tableoid::regclass, count(*) FROM pr GROUP BY 1 ORDER BY 1;

DROP TABLE pt, pt_eu, pr;
