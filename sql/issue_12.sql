--
-- Issue 12: behaviour the reshaped read path keeps or corrects.
--
-- A column whose type modifier changed is converted as CAST(old::text AS new_type) with
-- today's modifier (the column plan copies a value only when type and modifier are equal).
CREATE TABLE tm (id int, c char(3), n numeric(6,1), v varchar(10)) USING gsnap;
INSERT INTO tm VALUES (1, 'ab', 12.3, 'short'), (2, 'xyz', 99.9, 'tenletters');
SELECT gsnap_snapshot() AS s \gset
ALTER TABLE tm ALTER COLUMN c TYPE char(6);
ALTER TABLE tm ALTER COLUMN n TYPE numeric(8,3);
SELECT id, c || '|' AS padded, n FROM gsnap_asof(NULL::tm, :s) ORDER BY id;
SELECT id, c || '|' AS padded, n FROM tm ORDER BY id;
-- the function path converts the same way
SELECT (r).id, (r).c || '|' AS padded, (r).n FROM (SELECT gsnap_asof(NULL::tm, :s) AS r) x ORDER BY 1;
SELECT snap_id = :s AS at_s, (rec).c || '|' AS padded, (rec).n FROM gsnap_range(NULL::tm, :s, :s) ORDER BY 3;
-- a modifier the old values do not fit is that type's input error
DELETE FROM tm WHERE id = 2;
ALTER TABLE tm ALTER COLUMN v TYPE varchar(5);
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::tm, %s)', :s));

-- Rescans: a correlated subquery re-evaluates the snapshot argument for every outer row.
CREATE TABLE rs (id int) USING gsnap;
INSERT INTO rs VALUES (1);
SELECT gsnap_snapshot() AS r1 \gset
INSERT INTO rs VALUES (2), (3);
SELECT gsnap_snapshot() AS r2 \gset
SELECT s.n, (SELECT count(*) FROM gsnap_asof(NULL::rs, s.snap)) AS rows,
       (SELECT count(*) FROM gsnap_range(NULL::rs, :r1, s.snap)) AS range_rows
FROM (VALUES (1, :r1::bigint), (2, :r2::bigint), (3, :r1::bigint)) s(n, snap) ORDER BY 1;

DROP TABLE tm, rs;
