"""Hunting crashes with generated SQL (issue 11): gsnap's functions called with odd arguments
by a generator of our own, and a bounded sqlsmith run over a database of gsnap tables with
snapshots. The rule for both: every statement returns rows or fails with a clean ERROR (a
SQLSTATE outside class XX, and no Rust panic in the message), and no backend dies.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time

import pytest

from cluster import Cluster, gsnap_cluster
from hunt import LOG_LINE_START, PANIC_TEXT, LogTail, ServerWatch, close_quietly, connect, outcome, short

SEED = 20261123


@pytest.fixture(scope="module")
def fz():
    yield from gsnap_cluster("fuzz", ["fsync = off", "log_line_prefix = '%m [%p] %e '",
                                      "log_min_messages = warning", "log_error_verbosity = verbose"])


# -- the odd-arguments generator ----------------------------------------------------------

SETUP = [
    "CREATE SCHEMA fz",
    # several column types, a TOASTed text, an index, NULLs, a column dropped before the
    # snapshots and one dropped after
    "CREATE TABLE fz_t (id int PRIMARY KEY, gone int, s text, n numeric, ts timestamptz,"
    " j jsonb, arr int[], b bytea, big text, later_gone text) USING gsnap",
    "CREATE INDEX fz_t_s ON fz_t (s)",
    "ALTER TABLE fz_t DROP COLUMN gone",
    "INSERT INTO fz_t SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE 'row ' || i END, i * 1.5,"
    " '2026-01-01'::timestamptz + i * interval '1 hour', jsonb_build_object('i', i),"
    " ARRAY[i, NULL, -i], decode(md5(i::text), 'hex'),"
    " CASE WHEN i % 40 = 1 THEN (SELECT string_agg(md5((g * i)::text), '') FROM generate_series(1, 200) g)"
    " END, 'x' FROM generate_series(1, 300) i",
    "CREATE UNLOGGED TABLE fz_u (id int, v text) USING gsnap",
    "INSERT INTO fz_u SELECT i, i::text FROM generate_series(1, 50) i",
    "CREATE TABLE fz_heap (id int, v text) USING heap",
    "INSERT INTO fz_heap VALUES (1, 'heap')",
    "CREATE TABLE fz_parted (id int, v text) PARTITION BY RANGE (id)",
    "CREATE TABLE fz_part1 PARTITION OF fz_parted FOR VALUES FROM (0) TO (1000) USING gsnap",
    "INSERT INTO fz_parted SELECT i, 'p' || i FROM generate_series(1, 30) i",
    "CREATE TABLE fz_empty (id int) USING gsnap",
    "CREATE TABLE fz.t (x int, y text) USING gsnap",
    "INSERT INTO fz.t VALUES (1, 'other schema')",
    "CREATE TABLE fz_dropped (id int) USING gsnap",
    "INSERT INTO fz_dropped VALUES (1)",
    "CREATE VIEW fz_view AS SELECT id, s FROM fz_t",
    "CREATE MATERIALIZED VIEW fz_mat AS SELECT id FROM fz_t",
    "CREATE TYPE fz_comp AS (a int, b text)",
    "CREATE DOMAIN fz_dom AS fz_comp CHECK (VALUE IS NULL OR (VALUE).a > 0)",
    "CREATE DOMAIN fz_tdom AS fz_t",
    "CREATE SEQUENCE fz_seq",
    "CREATE ROLE fz_user LOGIN",
    "GRANT SELECT ON fz_t, fz_u, fz_view TO fz_user",
]

# The label of s1.
FUZZ_LABEL = "fz s1 label \u00fc"

# What happens between the snapshots s1, s2, s3 (fz_dropped is dropped after s3).
BETWEEN = [
    "UPDATE fz_t SET s = s || '+', n = n + 1 WHERE id % 3 = 0",
    "DELETE FROM fz_t WHERE id % 7 = 0",
    "INSERT INTO fz_t (id, s) SELECT i, 'late ' || i FROM generate_series(1000, 1010) i"
    " ON CONFLICT DO NOTHING",
    "UPDATE fz_u SET v = v || '!' WHERE id < 10",
    "UPDATE fz_part1 SET v = v || '!' WHERE id < 10",
]

SESSION_SETUP = [
    "CREATE TEMP TABLE fz_temp (id int, v text) USING gsnap",
    "INSERT INTO fz_temp VALUES (1, 'temp')",
]

REL_ARGS = [
    "NULL::fz_t", "NULL::fz_u", "NULL::fz_heap", "NULL::fz_parted", "NULL::fz_part1",
    "NULL::fz_empty", "NULL::fz.t", "NULL::fz_later", "NULL::fz_view", "NULL::fz_mat",
    "NULL::fz_comp", "NULL::fz_dom", "NULL::fz_tdom", "NULL::pg_class", "NULL::pg_attribute",
    "NULL::information_schema.tables", "NULL::int", "NULL::text", "NULL::fz_t[]", "NULL::fz_temp",
    "NULL::fz_seq", "NULL::record", "NULL", "ROW(1, 'x')", "ROW(1, 'x')::fz_comp",
    "(SELECT t FROM fz_t t ORDER BY id LIMIT 1)", "(SELECT t FROM fz_heap t LIMIT 1)",
]


class Ctx:
    """The ids and times of the database the generator runs against."""

    def __init__(self, s1, s2, s3, ts1, dropped_oid, toast_oid):
        self.s1, self.s2, self.s3, self.ts1 = s1, s2, s3, ts1
        self.dropped_oid, self.toast_oid = dropped_oid, toast_oid

    def ids(self) -> list[str]:
        return ["NULL::bigint", "0", "-1", "1", str(self.s1), str(self.s2), str(self.s3),
                str(self.s3 + 1), str(self.s3 + 1000), "2147483648", "9223372036854775807",
                "'-9223372036854775808'::bigint", "-2147483649"]

    def times(self) -> list[str]:
        return ["NULL::timestamptz", "'infinity'::timestamptz", "'-infinity'::timestamptz",
                "'4713-01-01 BC'::timestamptz", "'294276-12-31 23:59:59+00'::timestamptz",
                "'1999-01-01'::timestamptz", "'2000-01-01 00:00:00+00'::timestamptz",
                "'epoch'::timestamptz", f"'{self.ts1}'::timestamptz", "now()",
                "'2200-01-01'::timestamptz"]

    def texts(self) -> list[str]:
        """Snapshots written as text: ids, the label of s1, times, and what is none of these."""
        return ["NULL::text", "''", "' '", f"'{self.s2}'", f"' {self.s2} '", "'0'", "'-1'",
                "'+1'", "'1e3'", "'99999999999999999999999'", f"'{FUZZ_LABEL}'", "'no such label'",
                "'yesterday'", "'NOW'", "'infinity'", "'-infinity'", "'epoch'", f"'{self.ts1}'",
                "'2026-13-45 99:00'", "'1999-01-01'", "'2200-01-01'", "'12'::varchar",
                "'; DROP TABLE fz_t; --'", "'\\'", "repeat('x', 100000)"]

    def pairs(self) -> list[tuple[str, str]]:
        s1, s2, s3 = map(str, (self.s1, self.s2, self.s3))
        big, small = "9223372036854775807", "'-9223372036854775808'::bigint"
        return [(s1, s3), (s3, s1), (s2, s2), (s1, s1), ("0", s3), ("-1", s2), (s1, big),
                (small, big), (small, s1), (big, big), ("NULL::bigint", s2), (s2, "NULL::bigint"),
                ("NULL::bigint", "NULL::bigint"), (s3, str(self.s3 + 5)), ("0", "0"),
                (big, small), ("1", s3)]

    def regclasses(self) -> list[str]:
        return ["0::regclass", "NULL::regclass", "'fz_t'::regclass", "'fz_heap'::regclass",
                "'fz_t_pkey'::regclass", "'fz_t_s'::regclass", "'fz_seq'::regclass",
                "'fz_view'::regclass", "'fz_mat'::regclass", "'fz_parted'::regclass",
                "'fz_part1'::regclass", "'fz_temp'::regclass", "'fz_u'::regclass",
                "'pg_class'::regclass", f"{self.dropped_oid}::oid::regclass",
                f"{self.toast_oid}::oid::regclass", "'4294967295'::oid::regclass",
                "'fz_later'::regclass"]


def calls(ctx: Ctx, rng: random.Random) -> list[tuple[str, list[str], list[str]]]:
    """(function, argument SQL, the SQL types of the arguments after the first), each argument
    odd in turn while the others are good, then random combinations."""
    out = []
    good_rel, good_id, good_t = "NULL::fz_t", str(ctx.s2), f"'{ctx.ts1}'::timestamptz"
    ids, times, pairs = ctx.ids(), ctx.times(), ctx.pairs()
    for fn, rest, types in (("gsnap_asof", [good_id], ["bigint"]),
                            ("gsnap_asof", [good_t], ["timestamptz"]),
                            ("gsnap_range", [str(ctx.s1), str(ctx.s3)], ["bigint", "bigint"]),
                            ("gsnap_versions", [str(ctx.s1), str(ctx.s3)], ["bigint", "bigint"]),
                            ("gsnap_diff", [str(ctx.s1), str(ctx.s3)], ["bigint", "bigint"]),
                            ("gsnap_asof", [f"'{FUZZ_LABEL}'"], ["text"]),
                            ("gsnap_range", [f"'{FUZZ_LABEL}'", "'now'"], ["text", "text"]),
                            ("gsnap_versions", [f"'{ctx.s1}'", "'infinity'"], ["text", "text"]),
                            ("gsnap_diff", [f"'{FUZZ_LABEL}'", f"'{ctx.s3}'"], ["text", "text"]),
                            ("gsnap_range", [good_t, "now()"], ["timestamptz", "timestamptz"]),
                            ("gsnap_versions", [good_t, "now()"], ["timestamptz", "timestamptz"]),
                            ("gsnap_diff", [good_t, "now()"], ["timestamptz", "timestamptz"]),
                            ("gsnap_range", [str(ctx.s1), f"'{FUZZ_LABEL}'"], ["bigint", "text"]),
                            ("gsnap_diff", [f"'{FUZZ_LABEL}'", str(ctx.s3)], ["text", "bigint"])):
        for rel in REL_ARGS:
            out.append((fn, [rel, *rest], types))
        if types == ["bigint"]:
            out += [(fn, [good_rel, i], types) for i in ids]
        elif types == ["timestamptz"]:
            out += [(fn, [good_rel, t], types) for t in times]
        elif types == ["text"]:
            out += [(fn, [good_rel, x], types) for x in ctx.texts()]
        elif types == ["text", "text"]:
            texts = ctx.texts()
            out += [(fn, [good_rel, x, rest[1]], types) for x in texts]
            out += [(fn, [good_rel, rest[0], x], types) for x in texts]
        elif types == ["timestamptz", "timestamptz"]:
            out += [(fn, [good_rel, t, rest[1]], types) for t in times]
            out += [(fn, [good_rel, rest[0], t], types) for t in times]
        elif types == ["bigint", "text"]:
            out += [(fn, [good_rel, i, rest[1]], types) for i in ids]
            out += [(fn, [good_rel, rest[0], x], types) for x in ctx.texts()]
        elif types == ["text", "bigint"]:
            out += [(fn, [good_rel, x, rest[1]], types) for x in ctx.texts()]
            out += [(fn, [good_rel, rest[0], i], types) for i in ids]
        else:
            out += [(fn, [good_rel, a, b], types) for a, b in pairs]
        # random combinations: any first argument with any other arguments
        for _ in range(25):
            rel = rng.choice(REL_ARGS)
            if types == ["bigint"]:
                out.append((fn, [rel, rng.choice(ids)], types))
            elif types == ["timestamptz"]:
                out.append((fn, [rel, rng.choice(times)], types))
            elif types == ["bigint", "text"]:
                out.append((fn, [rel, rng.choice(ids), rng.choice(ctx.texts())], types))
            elif types == ["text", "bigint"]:
                out.append((fn, [rel, rng.choice(ctx.texts()), rng.choice(ids)], types))
            elif types[0] == "text":
                out.append((fn, [rel, *(rng.choice(ctx.texts()) for _ in types)], types))
            elif types[0] == "timestamptz":
                out.append((fn, [rel, rng.choice(times), rng.choice(times)], types))
            else:
                a, b = rng.choice(pairs) if rng.random() < 0.5 else (rng.choice(ids), rng.choice(ids))
                out.append((fn, [rel, a, b], types))
    # an untyped NULL second argument picks the text forms
    out.append(("gsnap_asof", [good_rel, "NULL"], ["unknown"]))
    out.append(("gsnap_range", [good_rel, "NULL", "NULL"], ["unknown", "unknown"]))
    out.append(("gsnap_versions", [good_rel, "NULL", "NULL"], ["unknown", "unknown"]))
    for i in ids:
        out.append(("gsnap_snapshot_tables", [i], []))
    # dropped tables: names odd in turn (quotes, too many parts, empty, NULL, another's)
    names = ["'fz_t'", "'public.fz_t'", "NULL", "''", "'\"fz_t'", "'a.b.c.d'", "'pg_class'",
             "'fz_nosuch'", "' fz_t '", "'public.'"]
    for fn in ("gsnap_asof_dropped", "gsnap_table_definition", "gsnap_undrop"):
        out += [(fn, [n, good_id], []) for n in names]
        out += [(fn, ["'fz_t'", i], []) for i in ids]
    out += [("gsnap_asof_dropped", ["'fz_t'", t], []) for t in times]
    out += [(fn, ["'fz_t'", x], []) for fn in ("gsnap_asof_dropped", "gsnap_undrop")
            for x in ctx.texts()]
    for r in ctx.regclasses():
        out.append(("gsnap_written_blocks", [r], []))
        out.append(("gsnap_full_capture_pending", [r], []))
    for i in ("NULL::bigint", "0", "-1", "9223372036854775807", str(ctx.s3 + 1000)):
        out.append(("gsnap_debug_release", [i], []))
    for fn in ("gsnap_snapshots", "gsnap_progress", "gsnap_groups", "gsnap_index_stats"):
        out.append((fn, [], []))
    return out


def statements(fn: str, args: list[str], types: list[str]) -> list[tuple[str, list[str]]]:
    """The contexts of one call: (context, statements run in order in one session)."""
    call = f"{fn}({', '.join(args)})"
    out = [("from", [f"SELECT * FROM {call}"]), ("select", [f"SELECT {call}"])]
    if fn == "gsnap_asof_dropped":
        # a record needs a column definition list in FROM: a right one and a wrong one
        out.append(("from", [f"SELECT * FROM {call} AS x(id int, v text)"]))
        out.append(("from", [f"SELECT * FROM {call} AS x(a int, b text, c int)"]))
    if fn == "gsnap_asof" and (args[0].startswith("ROW(") or args[0] == "NULL::record"):
        # a record needs a column definition list in FROM
        out.append(("from", [f"SELECT * FROM {call} AS x(a int, b text)"]))
    if types and fn in ("gsnap_asof", "gsnap_range", "gsnap_versions", "gsnap_diff"):
        # the snapshot arguments as parameters of a generic plan (values known at run time)
        params = [f"${i + 1}" for i in range(len(types))]
        decl = ", ".join(t if t != "unknown" else "bigint" for t in types)
        prepared = f"{fn}({args[0]}, {', '.join(params)})"
        out.append(("prepared", [f"PREPARE fz_p({decl}) AS SELECT * FROM {prepared}",
                                 f"EXECUTE fz_p({', '.join(args[1:])})",
                                 f"EXECUTE fz_p({', '.join(args[1:])})"]))
        # and as values of a LATERAL reference (the function-scan path)
        cols = ", ".join(f"{a}" for a in args[1:])
        names = ", ".join(f"c{i}" for i in range(len(args) - 1))
        lateral = f"{fn}({args[0]}, {', '.join(f'v.c{i}' for i in range(len(args) - 1))})"
        out.append(("lateral", [f"SELECT r.* FROM (VALUES ({cols})) v({names}), LATERAL {lateral} r"]))
    else:
        out.append(("prepared", [f"PREPARE fz_p AS SELECT * FROM {call}", "EXECUTE fz_p"]))
    return out


class Session:
    """The generator's connection, reopened (with its temporary table) after a crash."""

    def __init__(self, cluster: Cluster, user: str = "postgres"):
        self.cluster, self.user = cluster, user
        self.conn = None
        self.open()

    def open(self):
        close_quietly(self.conn)
        self.conn = connect(self.cluster, timeout_s=10, user=self.user)
        self.conn.execute("SET plan_cache_mode = force_generic_plan")
        self.conn.execute("SET client_min_messages = error")
        for sql in SESSION_SETUP:
            self.conn.execute(sql)


def run_generator(cluster: Cluster, watch: ServerWatch, ctx: Ctx, user: str, only=None) -> tuple[list[str], int, dict]:
    rng = random.Random(SEED)
    sess = Session(cluster, user)
    violations: list[str] = []
    count = 0
    tally: dict[str, int] = {}
    try:
        for fn, args, types in calls(ctx, rng):
            for context, stmts in statements(fn, args, types):
                if only and context not in only:
                    continue
                sess.conn.execute("DEALLOCATE ALL")
                for sql in stmts:
                    count += 1
                    o = outcome(sess.conn, sql)
                    key = o.kind if o.kind != "error" else o.sqlstate
                    tally[key] = tally.get(key, 0) + 1
                    bad = None
                    if o.kind == "lost":
                        bad = "CRASH (connection lost)"
                    elif o.kind == "error" and o.sqlstate == "57014":
                        bad = "did not finish within statement_timeout (10 s)"
                    elif o.kind == "error" and not o.clean_error:
                        bad = "internal error"
                    if bad:
                        msg = (f"{fn}({', '.join(args)}) [{context}, as {user}]: {bad}: "
                               f"{o.sqlstate} {short(o.message, 300)}\n      statement: {sql}")
                        if o.kind == "lost":
                            msg += "\n      " + "\n      ".join(watch.check())
                            sess.open()
                        violations.append(msg)
                    if o.kind in ("error", "lost"):
                        break  # a failed PREPARE: nothing to execute
    finally:
        close_quietly(sess.conn)
    return violations, count, tally


def make_database(cluster: Cluster) -> Ctx:
    with connect(cluster, timeout_s=120) as c:
        for sql in SETUP:
            c.execute(sql)
        toast_oid = c.execute("SELECT reltoastrelid::int FROM pg_class WHERE oid = 'fz_t'::regclass"
                              ).fetchone()[0]
        snaps = []
        for i in range(3):
            label = FUZZ_LABEL if i == 0 else None
            snaps.append(c.execute("SELECT gsnap_snapshot(label => %s)", (label,)).fetchone()[0])
            if i < 2:
                for sql in BETWEEN:
                    c.execute(sql)
        ts1 = c.execute("SELECT taken_at::text FROM gsnap_snapshots() WHERE snap_id = %s",
                        (snaps[0],)).fetchone()[0]
        c.execute("ALTER TABLE fz_t DROP COLUMN later_gone")
        dropped = c.execute("SELECT 'fz_dropped'::regclass::oid::int").fetchone()[0]
        c.execute("DROP TABLE fz_dropped")
        c.execute("CREATE TABLE fz_later (id int) USING gsnap")
    return Ctx(*snaps, ts1, dropped, toast_oid)


def answers(cluster: Cluster, ctx: Ctx) -> list[str]:
    """Identities the odd-but-valid arguments must keep (not just "no crash")."""
    out = []
    with connect(cluster) as c:
        def rows(sql):
            return outcome(c, sql)

        def same(what, a, b):
            oa, ob = rows(a), rows(b)
            if oa.kind != "rows" or ob.kind != "rows" or oa.rows != ob.rows:
                out.append(f"{what}: {a} gives {oa}, {b} gives {ob}")

        t = "NULL::fz_t"
        for x in (ctx.s1, ctx.s2, ctx.s3):
            o = rows(f"SELECT * FROM gsnap_diff({t}, {x}, {x})")
            if o.kind != "rows" or o.rows:
                out.append(f"gsnap_diff of a snapshot with itself ({x}): {o}")
        swap = "CASE change WHEN 'added' THEN 'removed' WHEN 'removed' THEN 'added' END"
        same("a diff backwards is the diff forwards with added and removed swapped",
             f"SELECT change, rec::text FROM gsnap_diff({t}, {ctx.s1}, {ctx.s3})",
             f"SELECT {swap}, rec::text FROM gsnap_diff({t}, {ctx.s3}, {ctx.s1})")
        same("AS OF 'infinity' is AS OF the latest snapshot",
             f"SELECT x::text FROM gsnap_asof({t}, 'infinity'::timestamptz) x",
             f"SELECT x::text FROM gsnap_asof({t}, {ctx.s3}) x")
        same("AS OF a snapshot's own time is AS OF that snapshot",
             f"SELECT x::text FROM gsnap_asof({t}, '{ctx.ts1}'::timestamptz) x",
             f"SELECT x::text FROM gsnap_asof({t}, {ctx.s1}) x")
        same("AS OF the label of s1 is AS OF s1",
             f"SELECT x::text FROM gsnap_asof({t}, '{FUZZ_LABEL}') x",
             f"SELECT x::text FROM gsnap_asof({t}, {ctx.s1}) x")
        same("AS OF an id written as text is AS OF the id",
             f"SELECT x::text FROM gsnap_asof({t}, ' {ctx.s2} ') x",
             f"SELECT x::text FROM gsnap_asof({t}, {ctx.s2}) x")
        same("a range by label and time is the range by ids",
             f"SELECT snap_id, rec::text FROM gsnap_range({t}, '{FUZZ_LABEL}', 'infinity')",
             f"SELECT snap_id, rec::text FROM gsnap_range({t}, {ctx.s1}, {ctx.s3})")
        same("a range from s1's time starts at s1",
             f"SELECT snap_id, rec::text FROM gsnap_range({t}, '{ctx.ts1}', '{ctx.s2}')",
             f"SELECT snap_id, rec::text FROM gsnap_range({t}, {ctx.s1}, {ctx.s2})")
        same("a range of one snapshot is that snapshot",
             f"SELECT snap_id, rec::text FROM gsnap_range({t}, {ctx.s2}, {ctx.s2})",
             f"SELECT {ctx.s2}::bigint, x::text FROM gsnap_asof({t}, {ctx.s2}) x")
        same("the versions of one snapshot are its rows",
             f"SELECT first_snap, last_snap, rec::text FROM gsnap_versions({t}, {ctx.s2}, {ctx.s2})",
             f"SELECT {ctx.s2}::bigint, {ctx.s2}::bigint, x::text FROM gsnap_asof({t}, {ctx.s2}) x")
    return out


def test_odd_arguments(fz):
    """Every gsnap function called with odd arguments (NULLs of every argument, 0, -1, huge
    and most negative ids, ids of snapshots not taken yet, from-after-to ranges, a == b diffs,
    times out of range, snapshots written as text (ids with spaces and signs, a label, unknown
    labels, time words, bad times, a 100,000-character string), first arguments that are not tables: views, composite types, domains
    over composites, catalogs, scalars, arrays, records, temporary tables, partitioned
    parents, sequences; unlogged, heap and schema-qualified tables; regclass arguments of 0,
    of a dropped table, of an index, a sequence, a TOAST table), in FROM, in the select list,
    in a prepared statement with the ids as parameters of a generic plan, and in a LATERAL
    call; once as superuser and once (FROM and prepared only) as a role allowed to read a few
    tables. Each call gives rows or a clean ERROR, and a few identities hold (a diff of a
    snapshot with itself is empty, a diff backwards is the diff forwards swapped, AS OF
    'infinity' is AS OF the latest snapshot, AS OF a snapshot's time is AS OF it, AS OF a label
    or an id written as text is AS OF that snapshot, a range by label and times is the range
    by ids, a range of one snapshot is that snapshot); the full list of violations is reported at the end.
    gsnap_snapshot() itself is called last (it declares snapshots)."""
    watch = ServerWatch(fz)
    ctx = make_database(fz)
    watch.mark()
    t0 = time.monotonic()
    violations, n, tally = run_generator(fz, watch, ctx, "postgres")
    v2, n2, tally2 = run_generator(fz, watch, ctx, "fz_user", only=("from", "prepared"))
    violations += v2
    violations += answers(fz, ctx)
    # declaring snapshots with odd arguments, last: the ids above stay as they were
    with connect(fz, timeout_s=60) as c:
        for sql in ("SELECT gsnap_snapshot(NULL)", "SELECT * FROM gsnap_snapshot(NULL::bool)",
                    "SELECT gsnap_snapshot(false)", "SELECT * FROM gsnap_snapshot(true)",
                    "SELECT gsnap_debug_release(snap_id) FROM gsnap_debug_snapshot()"):
            n += 1
            o = outcome(c, sql)
            if o.kind == "lost" or (o.kind == "error" and not o.clean_error):
                violations.append(f"{sql}: {o}")
                if o.kind == "lost":
                    break
    crash = watch.check()
    print(f"[fuzz] odd arguments: {n + n2} statements in {time.monotonic() - t0:.1f} s;"
          f" outcomes {dict(sorted(tally.items()))} (as fz_user: {dict(sorted(tally2.items()))})")
    if crash:
        violations.append("SERVER CRASH:\n      " + "\n      ".join(crash))
    if violations:
        pytest.fail(f"{len(violations)} violation(s) in {n + n2} statements:\n  "
                    + "\n  ".join(violations), pytrace=False)


# -- sqlsmith -----------------------------------------------------------------------------

SMITH_SETUP = [
    "CREATE SCHEMA smith",
    "CREATE TABLE smith.sm_a (id int PRIMARY KEY, gone int, s text, n numeric, f float8,"
    " ts timestamptz, d date, j jsonb, arr text[], b bytea, big text, flag bool) USING gsnap",
    "CREATE INDEX ON smith.sm_a (s)",
    "CREATE INDEX ON smith.sm_a USING gin (j)",
    "ALTER TABLE smith.sm_a DROP COLUMN gone",
    "INSERT INTO smith.sm_a SELECT i, CASE WHEN i % 6 = 0 THEN NULL ELSE 's' || i END, i / 3.0,"
    " i * 0.25, '2026-01-01'::timestamptz + i * interval '7 min', DATE '2026-01-01' + i,"
    " CASE WHEN i % 4 = 0 THEN NULL ELSE jsonb_build_object('k', i, 'v', ARRAY[i, i + 1]) END,"
    " ARRAY['a' || i, NULL], decode(md5(i::text), 'hex'),"
    " CASE WHEN i % 50 = 3 THEN (SELECT string_agg(md5((g + i)::text), '') FROM generate_series(1, 150) g) END,"
    " i % 2 = 0 FROM generate_series(1, 400) i",
    "CREATE TABLE smith.sm_b (k int, a_id int, label varchar(20), amount numeric(10,2)) USING gsnap",
    "INSERT INTO smith.sm_b SELECT i, i * 3, 'label ' || i, i * 1.1 FROM generate_series(1, 60) i",
    "CREATE UNLOGGED TABLE smith.sm_u (id int, v text) USING gsnap",
    "INSERT INTO smith.sm_u SELECT i, repeat('u', i) FROM generate_series(1, 40) i",
    "CREATE TABLE smith.sm_heap (id int, v text) USING heap",
    "INSERT INTO smith.sm_heap SELECT i, 'h' || i FROM generate_series(1, 40) i",
    # a partitioned table with a key: its equality conditions are key lookups in each
    # partition's map
    "CREATE TABLE smith.sm_p (id int PRIMARY KEY, v text, at date) PARTITION BY HASH (id)",
    "CREATE TABLE smith.sm_p0 PARTITION OF smith.sm_p FOR VALUES WITH (MODULUS 2, REMAINDER 0) USING gsnap",
    "CREATE TABLE smith.sm_p1 (at date, v text, id int NOT NULL) USING gsnap",
    "ALTER TABLE smith.sm_p ATTACH PARTITION smith.sm_p1 FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
    "INSERT INTO smith.sm_p SELECT i, 'p' || i, DATE '2026-01-01' + i FROM generate_series(1, 300) i",
    # a table inheriting from sm_b (a query of sm_b reads it too; its snapshot is its own)
    "CREATE TABLE smith.sm_bc (note text) INHERITS (smith.sm_b) USING gsnap",
    "INSERT INTO smith.sm_bc SELECT i, i, 'child ' || i, i, 'n' || i FROM generate_series(100, 130) i",
    # row-level security: sqlsmith's roles are not the owner, so the policy filters their
    # reads, AS OF reads included
    "CREATE TABLE smith.sm_r (id int PRIMARY KEY, grp int, v text) USING gsnap",
    "INSERT INTO smith.sm_r SELECT i, i % 5, 'r' || i FROM generate_series(1, 200) i",
    "ALTER TABLE smith.sm_r ENABLE ROW LEVEL SECURITY",
    "CREATE POLICY sm_r_some ON smith.sm_r USING (grp <> 0)",
]
SMITH_BETWEEN = [
    "UPDATE smith.sm_a SET s = s || '*', n = n + 1 WHERE id % 5 = 0",
    "DELETE FROM smith.sm_a WHERE id % 13 = 0",
    "UPDATE smith.sm_a SET big = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 120) g) WHERE id % 77 = 1",
    "INSERT INTO smith.sm_b SELECT i, i, 'later', NULL FROM generate_series(61, 70) i",
    "UPDATE smith.sm_u SET v = 'changed' WHERE id % 3 = 0",
    "UPDATE smith.sm_p SET v = v || '+', id = id + 1000 WHERE id % 11 = 0",
    "UPDATE smith.sm_bc SET note = note || '+' WHERE k % 3 = 0",
    "UPDATE smith.sm_r SET grp = (grp + 1) % 5 WHERE id % 7 = 0",
]
SMITH_TABLES = ("sm_a", "sm_b", "sm_u", "sm_heap", "sm_p", "sm_bc", "sm_r")


def smith_views(s1: int, s2: int, s3: int, ts2: str) -> list[str]:
    """Views over gsnap's reading functions: sqlsmith picks relations from the catalog but
    never calls set-returning functions itself, so these put gsnap's custom scans and
    functions into its joins, subqueries and LATERALs."""
    return [
        f"CREATE VIEW smith.v_asof AS SELECT * FROM gsnap_asof(NULL::smith.sm_a, {s1})",
        f"CREATE VIEW smith.v_asof_time AS SELECT * FROM gsnap_asof(NULL::smith.sm_a, '{ts2}'::timestamptz)",
        f"CREATE VIEW smith.v_asof_b AS SELECT * FROM gsnap_asof(NULL::smith.sm_b, {s2})",
        f"CREATE VIEW smith.v_asof_u AS SELECT * FROM gsnap_asof(NULL::smith.sm_u, {s3})",
        f"CREATE VIEW smith.v_asof_r AS SELECT * FROM gsnap_asof(NULL::smith.sm_r, {s2})",
        f"CREATE VIEW smith.v_asof_bc AS SELECT * FROM gsnap_asof(NULL::smith.sm_bc, {s1})",
        f"CREATE VIEW smith.v_range AS SELECT snap_id, (rec).* FROM gsnap_range(NULL::smith.sm_a, {s1}, {s3})",
        f"CREATE VIEW smith.v_range_b AS SELECT snap_id, rec FROM gsnap_range(NULL::smith.sm_b, {s1}, {s3})",
        f"CREATE VIEW smith.v_range_agg AS SELECT snap_id, count(*) AS n FROM gsnap_range(NULL::smith.sm_a, {s1}, {s3})"
        " GROUP BY snap_id",
        f"CREATE VIEW smith.v_versions AS SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::smith.sm_a, {s1}, {s3})",
        f"CREATE VIEW smith.v_range_text AS SELECT snap_id, (rec).* FROM gsnap_range(NULL::smith.sm_a, '{ts2}', 'infinity')",
        f"CREATE VIEW smith.v_diff AS SELECT change, (rec).* FROM gsnap_diff(NULL::smith.sm_a, {s1}, {s3})",
        "CREATE VIEW smith.v_snapshots AS SELECT * FROM gsnap_snapshots()",
        f"CREATE VIEW smith.v_snapshot_tables AS SELECT * FROM gsnap_snapshot_tables({s2})",
        f"CREATE VIEW smith.v_fn AS SELECT gsnap_asof(NULL::smith.sm_b, {s1}) AS r",
        f"CREATE VIEW smith.v_asof_p AS SELECT * FROM gsnap_asof(NULL::smith.sm_p, {s2})",
        f"CREATE VIEW smith.v_versions_p AS SELECT first_snap, last_snap, (rec).* "
        f"FROM gsnap_versions(NULL::smith.sm_p, '{ts2}'::timestamptz, now())",
        f"CREATE VIEW smith.v_range_p AS SELECT snap_id, (rec).* "
        f"FROM gsnap_range(NULL::smith.sm_p, {s1}, {s3})",
    ]


def sqlsmith_binary() -> str:
    path = shutil.which("sqlsmith") or "/usr/bin/sqlsmith"
    assert os.path.exists(path), (
        "sqlsmith is not installed: scripts/install.sh installs the Debian package `sqlsmith`")
    return path


XX_LINE = re.compile(r"\] (XX\d\d\d) (ERROR|FATAL|PANIC):\s+(.*)")


def location_after(lines: list[str], i: int) -> str:
    """The LOCATION logged after line i (log_error_verbosity = verbose)."""
    for j in range(i + 1, min(i + 6, len(lines))):
        if "LOCATION:" in lines[j]:
            return lines[j].split("LOCATION:", 1)[1].strip()
        if "STATEMENT:" in lines[j]:
            break
    return "?"


def statement_after(lines: list[str], i: int) -> str:
    """The STATEMENT logged after line i, with its continuation lines (queries span lines)."""
    for j in range(i + 1, min(i + 4, len(lines))):
        if "STATEMENT:" in lines[j]:
            out = [lines[j].split("STATEMENT:", 1)[1]]
            for more in lines[j + 1:]:
                if LOG_LINE_START.match(more):
                    break
                out.append(more)
            return "\n".join(out)
    return "?"


def smith_run(fz, watch, binary, target, seed, max_queries, seconds, problems):
    """One sqlsmith run of `seed` for at most `seconds`; appends what it found to `problems`
    and returns the crash lines, if the server crashed."""
    watch.mark()
    log = LogTail(fz.data / "server.log")
    t0 = time.monotonic()
    run = subprocess.run(["timeout", "--signal=INT", "--kill-after=5", str(seconds), binary,
                          f"--target={target}", f"--seed={seed}", f"--max-queries={max_queries}",
                          "--exclude-catalog", "--verbose"],
                         capture_output=True, text=True)
    took = time.monotonic() - t0
    server_log = log.since_mark()
    crash = watch.check()
    if crash:
        problems.append("SERVER CRASH:\n    " + "\n    ".join(crash))
    lines = server_log.splitlines()
    for i, line in enumerate(lines):
        m = XX_LINE.search(line)
        if not m:
            continue
        stmt = statement_after(lines, i)
        # PostgreSQL's own internal errors are within sqlsmith's reach (it calls typmod output
        # functions with random integers: "invalid INTERVAL typmod"), also in queries over the
        # views: an internal error fails the test when it was raised in gsnap's Rust code
        # (log_error_verbosity = verbose gives the LOCATION) or is a Rust panic; the others are
        # printed.
        where = location_after(lines, i)
        if (".rs:" in where or PANIC_TEXT.search(m.group(3)) or m.group(2) != "ERROR"):
            problems.append(f"{m.group(1)} {m.group(2)}: {short(m.group(3), 300)} at {where}"
                            f"\n    statement: {short(stmt, 1500)}")
        else:
            print(f"[fuzz] sqlsmith: internal error raised by PostgreSQL ({where}):"
                  f" {short(m.group(3), 200)} in: {short(stmt, 300)}")
    tail = run.stderr.strip().splitlines()
    summary = next((l for l in reversed(tail) if l.startswith("queries:")), "queries: ?")
    print(f"[fuzz] sqlsmith seed {seed}: {summary} in {took:.0f} s (exit {run.returncode});"
          f" error rate line: {next((l for l in tail if 'error rate' in l), '-')}")

    return crash


def test_sqlsmith(fz):
    """A bounded sqlsmith (Debian package, 1.4) run, as a role that may read and write the
    gsnap tables but is no superuser (so it cannot call server-administration functions),
    against a schema of gsnap tables (several column types, TOASTed text, a btree and a GIN
    index, a dropped column, NULLs, an unlogged one, a heap one, one inheriting from another,
    one under row-level security) holding data and three
    snapshots, with --exclude-catalog so its queries are about these relations, and parallel
    plans made as cheap as they can be (so AS OF scans run parallel-aware under Gathers in
    sqlsmith's plan shapes).

    sqlsmith 1.4 loads routines with `NOT proretset` and gives polymorphic (anyelement)
    arguments no usable values, so its own queries never call gsnap_asof, gsnap_range or
    gsnap_diff (a dry run of this seed is checked for that and the count printed). To bring
    them in anyway, the schema has views over each of them (AS OF by id and by time, range,
    diff, the listing functions, a select-list call): sqlsmith joins, filters, samples and
    nests those like any relation, which puts gsnap's custom scans and its function path in
    plan shapes nobody wrote by hand.

    After the run: the server did not restart, its log has no "terminated by signal", no
    PANIC, and no internal error (XX000) raised in gsnap's Rust code or carrying a Rust panic
    (PostgreSQL's own internal errors, which sqlsmith reaches by calling typmod output
    functions with random integers, are printed); a crash is reported with the query the dead
    backend was running. Finally a new snapshot of the tables
    sqlsmith wrote equals the live tables."""
    binary = sqlsmith_binary()
    watch = ServerWatch(fz)
    with connect(fz, timeout_s=120) as c:
        for sql in SMITH_SETUP:
            c.execute(sql)
        snaps = []
        for i in range(3):
            snaps.append(c.execute("SELECT gsnap_snapshot()").fetchone()[0])
            if i < 2:
                for sql in SMITH_BETWEEN:
                    c.execute(sql)
        ts2 = c.execute("SELECT taken_at::text FROM gsnap_snapshots() WHERE snap_id = %s",
                        (snaps[1],)).fetchone()[0]
        for sql in smith_views(*snaps, ts2):
            c.execute(sql)
        c.execute("DROP ROLE IF EXISTS smith")
        c.execute("CREATE ROLE smith LOGIN")
        c.execute("GRANT USAGE ON SCHEMA smith TO smith")
        c.execute("GRANT SELECT ON ALL TABLES IN SCHEMA smith TO smith")
        c.execute("GRANT INSERT, UPDATE, DELETE ON smith.sm_a, smith.sm_b, smith.sm_u, smith.sm_p,"
                  " smith.sm_bc, smith.sm_r TO smith")
        # sqlsmith sees what information_schema shows it: not the extension's other objects
        c.execute("ALTER ROLE smith SET search_path = smith, public")
        # a second role whose sessions read every gsnap table as of the second snapshot
        # (gsnap.as_of): sqlsmith's queries over the tables themselves become AS OF reads
        c.execute("DROP ROLE IF EXISTS smith_asof")
        c.execute("CREATE ROLE smith_asof LOGIN IN ROLE smith")
        c.execute("ALTER ROLE smith_asof SET search_path = smith, public")
        c.execute(f"ALTER ROLE smith_asof SET gsnap.as_of = '{snaps[1]}'")
        # parallel plans wherever PostgreSQL may make one: the AS OF scan's parallel-aware
        # path in the plan shapes sqlsmith makes (Gather under joins, subqueries, samples)
        for setting in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                        "min_parallel_table_scan_size = 0", "max_parallel_workers_per_gather = 2"):
            c.execute(f"ALTER ROLE smith SET {setting}")
            c.execute(f"ALTER ROLE smith_asof SET {setting}")
    target = f"host={fz.data} port={fz.port} dbname=postgres user=smith"
    # The suite runs one seed for a minute; a longer hunt sets GSNAP_FUZZ_SEEDS (a comma list)
    # and GSNAP_FUZZ_SECONDS (per seed), e.g. GSNAP_FUZZ_SEEDS=1,2,3,4,5 GSNAP_FUZZ_SECONDS=300.
    seeds = [int(x) for x in os.environ.get("GSNAP_FUZZ_SEEDS", "7").split(",") if x.strip()]
    seconds = int(os.environ.get("GSNAP_FUZZ_SECONDS", "60"))
    max_queries = 8000 * max(1, seconds // 60)
    seed = seeds[0]

    dry = subprocess.run(["timeout", "30", binary, f"--target={target}", f"--seed={seed}",
                          "--exclude-catalog", "--dry-run", "--max-queries=1500"],
                         capture_output=True, text=True)
    gsnap_calls = len(re.findall(r"gsnap_(asof|range|diff)\s*\(", dry.stdout))
    view_uses = len(re.findall(r"\bv_(asof|range|diff|fn|snapshot)", dry.stdout))
    print(f"[fuzz] sqlsmith dry run: {dry.stdout.count(';')} queries, {gsnap_calls} direct calls"
          f" of gsnap_asof/range/diff, {view_uses} uses of the views over them")

    problems = []
    crash = None
    for seed in seeds:
        crash = smith_run(fz, watch, binary, target, seed, max_queries, seconds, problems)
        if crash:
            break
        # the same seed's queries in a session as of a snapshot, for half the time
        target_asof = f"host={fz.data} port={fz.port} dbname=postgres user=smith_asof"
        crash = smith_run(fz, watch, binary, target_asof, seed, max_queries // 2,
                          max(seconds // 2, 20), problems)
        if crash:
            break
    if not crash:
        # what sqlsmith wrote is snapshotted faithfully
        with connect(fz, timeout_s=120) as c:
            s = c.execute("SELECT gsnap_snapshot()").fetchone()[0]
            for t in ("sm_a", "sm_b", "sm_u", "sm_p", "sm_bc", "sm_r"):
                # (the snapshot of an inheritance parent is its own rows: FROM ONLY)
                only = "ONLY" if t == "sm_b" else ""
                live = c.execute(f"SELECT count(*), md5(coalesce(string_agg(r::text, '|' ORDER BY r::text), ''))"
                                 f" FROM {only} smith.{t} r").fetchone()
                asof = c.execute(f"SELECT count(*), md5(coalesce(string_agg(r::text, '|' ORDER BY r::text), ''))"
                                 f" FROM gsnap_asof(NULL::smith.{t}, {s}) r").fetchone()
                if live != asof:
                    problems.append(f"after sqlsmith, snapshot {s} of {t}: {asof}, live: {live}")
    if problems:
        pytest.fail("sqlsmith found:\n  " + "\n  ".join(problems), pytrace=False)
