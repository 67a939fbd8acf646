--
-- Issue 7: lifetimes. Labels and ranks at declaration, pins, sparse deletion (logical and
-- immediate), the rules that protect snapshots, the retention preview, the store's
-- accounting. Reclamation itself runs in the background (gsnap.reclaim_delay), and is tested
-- with timing in tests/test_lifetimes.py.
--
CREATE TABLE lt (id int PRIMARY KEY, v text) USING gsnap;
INSERT INTO lt SELECT g, 'v' || g FROM generate_series(1, 300) g;
SELECT gsnap_snapshot(label => 'before the deploy', rank => 'daily') AS s1 \gset
UPDATE lt SET v = v || '+' WHERE id <= 100;
SELECT gsnap_snapshot() AS s2 \gset
DELETE FROM lt WHERE id > 250;
SELECT gsnap_snapshot(label => 'after') AS s3 \gset
UPDATE lt SET v = v || '!' WHERE id % 7 = 0;
SELECT gsnap_snapshot() AS s4 \gset

-- the label and the explicit rank (the rank is at least the one asked for)
SELECT snap_id - :s1 AS n, label, rank IN ('daily', 'weekly', 'monthly', 'yearly') AS daily_or_more,
       pinned_by, deleted_at IS NULL AS live
FROM gsnap_snapshots() WHERE snap_id >= :s1 ORDER BY 1;

-- pins: many tags per snapshot, each protects it
SELECT gsnap_pin(:s2, 'audit');
SELECT gsnap_pin(:s2, 'legal hold', now() + interval '1 year');
SELECT pinned_by FROM gsnap_snapshots() WHERE snap_id = :s2;
SELECT tag, pinned_until IS NULL AS for_ever, pinned_until > now() + interval '364 days' AS a_year,
       active FROM gsnap_pins() WHERE snap_id = :s2 ORDER BY tag;
SELECT sqlstate_of(format('SELECT gsnap_delete(%s)', :s2));
SELECT sqlstate_of(format('SELECT gsnap_delete(ARRAY[%s, %s])', :s1, :s2));
SELECT sqlstate_of(format('SELECT gsnap_unpin(%s, %L)', :s2, 'nobody'));
-- all or nothing: s1 was not deleted by the refused call
SELECT state FROM gsnap_snapshots() WHERE snap_id = :s1;
SELECT gsnap_unpin(:s2, 'audit');
SELECT gsnap_unpin(:s2, 'legal hold');

-- the newest snapshot only with force
SELECT sqlstate_of(format('SELECT gsnap_delete(%s)', :s4));

-- a sparse delete: s1 and s3 go, s2 and s4 stay
SELECT gsnap_delete(ARRAY[:s1, :s3]::bigint[]);
SELECT snap_id - :s1 AS n, state IN ('deleted', 'reclaimed') AS deleted, deleted_at IS NOT NULL AS stamped
FROM gsnap_snapshots() WHERE snap_id >= :s1 ORDER BY 1;
-- deleting again is a no-op (with a NOTICE, hidden here: it names the snapshot)
SET client_min_messages = warning;
SELECT gsnap_delete(:s1);
RESET client_min_messages;
-- deleted snapshots are unreadable at once, by every reader
SELECT sqlstate_of(format('SELECT count(*) FROM gsnap_asof(NULL::lt, %s)', :s1));
SELECT sqlstate_of(format('SELECT count(*) FROM gsnap_diff(NULL::lt, %s, %s)', :s3, :s4));
SELECT sqlstate_of(format('SELECT gsnap_asof(NULL::lt, %s)', :s3));
-- retained snapshots read what they held; a range skips the deleted ones
SELECT count(*), count(*) FILTER (WHERE v LIKE '%+') AS plus FROM gsnap_asof(NULL::lt, :s2);
SELECT count(*), count(*) FILTER (WHERE v LIKE '%!') AS bang FROM gsnap_asof(NULL::lt, :s4);
SELECT snap_id - :s1 AS n, count(*) FROM gsnap_range(NULL::lt, :s1, :s4) GROUP BY 1 ORDER BY 1;
-- AS OF a time when s3 was the newest: the newest retained snapshot before it (s2)
SELECT count(*) FILTER (WHERE v LIKE '%+') AS plus, count(*)
FROM gsnap_asof(NULL::lt, (SELECT taken_at FROM gsnap_snapshots() WHERE snap_id = :s3));

-- ranks can be raised later
SELECT gsnap_set_rank(:s2, 'monthly');
SELECT rank IN ('monthly', 'yearly') AS monthly_or_more FROM gsnap_snapshots() WHERE snap_id = :s2;
SELECT sqlstate_of(format('SELECT gsnap_set_rank(%s, %L)', :s1, 'daily'));

-- the preview: every readable snapshot with the rule that decided
SELECT snap_id - :s1 AS n, action, rule
FROM gsnap_retention_preview('within=1h') WHERE snap_id >= :s1 ORDER BY 1;
-- yearly=1 keeps the members of this year's bucket (every snapshot ranked yearly: s2 now)
-- and the newest (gsnap.min_snapshots = 1); everything else is "not selected"
SELECT gsnap_set_rank(:s2, 'yearly');
SELECT snap_id - :s1 AS n, action, regexp_replace(rule, '\(.*\)', '(this year)') AS rule
FROM gsnap_retention_preview('yearly=1') WHERE snap_id >= :s1 ORDER BY 1;
-- (over every snapshot of the database, whatever earlier tests took)
SELECT count(*) FILTER (WHERE rule NOT LIKE 'yearly%' AND rule NOT LIKE 'newest%'
                          AND (rule, action) <> ('not selected', 'delete')) AS other_rules
FROM gsnap_retention_preview('yearly=1');
SELECT sqlstate_of($$SELECT * FROM gsnap_retention_preview('hourly=0')$$);
SELECT count(*) = (SELECT count(*) FROM gsnap_snapshots() WHERE state = 'committed') AS all_listed
FROM gsnap_retention_preview('');

-- bad arguments
SELECT sqlstate_of('SELECT gsnap_delete(NULL::bigint[])');
SELECT sqlstate_of('SELECT gsnap_delete(ARRAY[NULL]::bigint[])');
SELECT sqlstate_of('SELECT gsnap_delete(987654321)');
SELECT sqlstate_of(format('SELECT gsnap_pin(%s, %L)', :s2, ''));
SELECT sqlstate_of(format('SELECT gsnap_pin(%s, NULL)', :s2));
SELECT sqlstate_of(format('SELECT gsnap_pin(%s, %L, %L)', :s2, 'x', '-infinity'));
SELECT sqlstate_of(format('SELECT gsnap_set_rank(%s, %L)', :s2, 'fortnightly'));
SELECT sqlstate_of($$SELECT gsnap_snapshot(label => E'two\nlines')$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_retention_preview('hourly=many')$$);
SELECT sqlstate_of($$SELECT * FROM gsnap_retention_preview('fortnightly=2')$$);

-- the store's accounting: nothing leaked, nothing missing
SELECT leaked_images + leaked_toast_values + missing_images + missing_toast_values + wrong_counts AS damage,
       repaired FROM gsnap_verify();
SELECT images > 0 AS has_images, disk_bytes > 0 AS has_disk, deleted_unreclaimed >= 0 AS counted
FROM gsnap_store_stats();

-- administration is for gsnap_admin
CREATE ROLE lt_reader;
SET ROLE lt_reader;
SELECT sqlstate_of(format('SELECT gsnap_delete(%s)', :s2));
SELECT sqlstate_of(format('SELECT gsnap_pin(%s, %L)', :s2, 'mine'));
SELECT sqlstate_of('SELECT * FROM gsnap_verify()');
RESET ROLE;
DROP ROLE lt_reader;
DROP TABLE lt;
