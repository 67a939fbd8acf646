--
-- TOASTed values read as of a snapshot are the old values, even after the live rows were
-- updated, deleted and vacuumed (the snapshot copied them into its store).
--
CREATE TABLE ta (id int PRIMARY KEY, doc text, js jsonb, raw bytea) USING gsnap;
INSERT INTO ta
SELECT i,
       repeat('compressible text ' || i, 5000),
       (SELECT jsonb_agg(jsonb_build_object('k', g, 'h', md5((i * g)::text))) FROM generate_series(1, 300) g),
       (SELECT string_agg(decode(md5((i + g)::text), 'hex'), ''::bytea) FROM generate_series(1, 800) g)
FROM generate_series(1, 12) i;
SELECT gsnap_snapshot() AS s \gset
CREATE TEMP TABLE ta_sums AS
SELECT id, md5(doc) AS doc, md5(js::text) AS js, md5(raw) AS raw, length(doc) AS len FROM ta;

UPDATE ta SET doc = 'short now', js = '{}', raw = '\x00' WHERE id <= 6;
DELETE FROM ta WHERE id > 9;
VACUUM ta;
VACUUM FULL ta;
SELECT count(*) AS live_rows, sum(length(doc)) AS live_text FROM ta;

SELECT count(*) AS rows_as_of_s,
       count(*) FILTER (WHERE md5(a.doc) = s.doc AND md5(a.js::text) = s.js AND md5(a.raw) = s.raw)
           AS identical
FROM gsnap_asof(NULL::ta, :s) a JOIN ta_sums s USING (id);
SELECT id, length(doc), jsonb_array_length(js), length(raw), left(doc, 20)
FROM gsnap_asof(NULL::ta, :s) WHERE id IN (1, 12) ORDER BY id;

-- a large value is stored once: after VACUUM FULL every page is captured again, but the
-- three unchanged rows' values are already in the store
SELECT gsnap_snapshot() AS s2 \gset
SELECT count(*) AS rows_at_s2 FROM gsnap_asof(NULL::ta, :s2);
SELECT (SELECT bytes_stored FROM gsnap_snapshots() WHERE snap_id = :s2) * 10
     < (SELECT bytes_stored FROM gsnap_snapshots() WHERE snap_id = :s) AS stored_once;
DROP TABLE ta;
