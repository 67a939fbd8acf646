--
-- Setup shared by every test: the extension and small helpers.
--
CREATE EXTENSION gsnap;
SELECT amname, amtype FROM pg_am WHERE amname = 'gsnap';

-- same_rows(a, b): do the two tables hold the same rows at the same TIDs?
-- (gsnap is heap underneath, so identical operations must give identical pages.)
CREATE FUNCTION same_rows(a regclass, b regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format(
        'SELECT count(*) FROM ('
        '  (SELECT ctid::text AS tid, t::text AS r FROM %1$s t'
        '   EXCEPT ALL SELECT ctid::text, t::text FROM %2$s t)'
        '  UNION ALL'
        '  (SELECT ctid::text, t::text FROM %2$s t'
        '   EXCEPT ALL SELECT ctid::text, t::text FROM %1$s t)) d', a, b) INTO n;
    RETURN n = 0;
END $$;

-- same_values(a, b): do the two tables hold the same rows (wherever they are)?
CREATE FUNCTION same_values(a regclass, b regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format(
        'SELECT count(*) FROM ('
        '  (SELECT t::text AS r FROM %1$s t EXCEPT ALL SELECT t::text FROM %2$s t)'
        '  UNION ALL'
        '  (SELECT t::text FROM %2$s t EXCEPT ALL SELECT t::text FROM %1$s t)) d', a, b) INTO n;
    RETURN n = 0;
END $$;

-- on_both(stmt, heap_table, gsnap_table): run the same statement on both tables
-- (%s in stmt is replaced by the table name).
CREATE FUNCTION on_both(stmt text, h regclass, g regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE replace(stmt, '%s', h::text);
    EXECUTE replace(stmt, '%s', g::text);
END $$;

-- written(rel): the blocks of rel the current span recorded, as an array.
CREATE FUNCTION written(rel regclass) RETURNS bigint[]
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(b ORDER BY b), '{}') FROM gsnap_written_blocks(rel) AS b
$$;

-- new_span(): start recording afresh.
CREATE FUNCTION new_span() RETURNS void
LANGUAGE sql AS $$ SELECT gsnap_snapshot(false) $$;

-- block_of(tid): the block number of a TID.
CREATE FUNCTION block_of(tid) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT ($1::text::point)[0]::bigint $$;

-- sqlstate_of(sql): runs sql and returns 'SQLSTATE: message' of its error (or 'ok'), with
-- snapshot ids masked (they depend on how many snapshots earlier tests took).
CREATE FUNCTION sqlstate_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'snapshot \d+', 'snapshot N', 'g');
END $$;

-- asof_matches(t, snap, expected): does table t as of snapshot snap hold exactly the rows
-- of the table expected (same columns)?
CREATE FUNCTION asof_matches(t regclass, snap bigint, expected regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format(
        'SELECT count(*) FROM ('
        '  (SELECT a::text FROM gsnap_asof(NULL::%1$s, %2$s) a EXCEPT ALL SELECT e::text FROM %3$s e)'
        '  UNION ALL'
        '  (SELECT e::text FROM %3$s e EXCEPT ALL SELECT a::text FROM gsnap_asof(NULL::%1$s, %2$s) a)) d',
        t, snap, expected) INTO n;
    RETURN n = 0;
END $$;
