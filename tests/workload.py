"""Helpers for gsnap's exactness tests: a random concurrent workload on gsnap tables, ground
truth read through exported snapshots, order-independent table contents and digests, and
bounded waits.

A table's contents are compared as a multiset of (id, md5(row::text)): gsnap_asof returns
rows in the table's current row type, so `t::text` of an AS OF row and of a live row are the
same text exactly when the rows are equal (large TOASTed values and jsonb included).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from cluster import reload_conf, wait_until  # noqa: F401 - wait_until is re-exported

# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

# Three gsnap tables with different write patterns:
#  - w_acct: fixed-size rows, fillfactor 70, updates of a non-indexed column are HOT;
#  - w_item: an indexed key (updates of it are not HOT), a text column that is sometimes
#    TOASTed out of line (random, incompressible) or compressed (repetitive), a jsonb column
#    with a GIN index;
#  - w_log: append-mostly (COPY, inserts), deleted in ranges.
TABLE_DDL = [
    """CREATE TABLE w_acct (id bigint PRIMARY KEY, k int NOT NULL, counter int NOT NULL DEFAULT 0,
                            note text, doc jsonb) USING gsnap WITH (fillfactor = 70)""",
    "CREATE INDEX ON w_acct (k)",
    """CREATE TABLE w_item (id bigint PRIMARY KEY, k int NOT NULL, payload text, doc jsonb)
       USING gsnap""",
    "CREATE INDEX ON w_item (k)",
    "CREATE INDEX ON w_item USING gin (doc)",
    """CREATE TABLE w_log (id bigint PRIMARY KEY, grp int NOT NULL, body text, doc jsonb)
       USING gsnap""",
]
TABLES = ["w_acct", "w_item", "w_log"]

# Ids below this were loaded initially; each client thread inserts ids in its own range.
INITIAL_ROWS = {"w_acct": 3000, "w_item": 1500, "w_log": 2000}
THREAD_ID_BASE = 10_000_000

# A value that is stored out of line uncompressed (random hex does not compress) and one
# that is compressed; both exercise the TOAST copy-out of the capture.
BIG_RANDOM = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, {n}))"
BIG_REPEAT = "repeat(md5(random()::text), {n})"


def create_tables(conn: psycopg.Connection) -> None:
    for stmt in TABLE_DDL:
        conn.execute(stmt)
    conn.execute(
        """INSERT INTO w_acct SELECT i, i %% 97, 0, 'acct ' || i, jsonb_build_object('i', i)
           FROM generate_series(1, %s) i""",
        (INITIAL_ROWS["w_acct"],),
    )
    conn.execute(
        f"""INSERT INTO w_item SELECT i, i %% 31,
               CASE WHEN i %% 10 = 0 THEN {BIG_RANDOM.format(n=150)}
                    WHEN i %% 10 = 1 THEN {BIG_REPEAT.format(n=400)}
                    ELSE md5(i::text) END,
               jsonb_build_object('i', i, 'tags', jsonb_build_array(i %% 7, i %% 11))
           FROM generate_series(1, %s) i""",
        (INITIAL_ROWS["w_item"],),
    )
    conn.execute(
        """INSERT INTO w_log SELECT i, i %% 13, repeat('log ', 1 + i %% 40),
               jsonb_build_object('g', i %% 13) FROM generate_series(1, %s) i""",
        (INITIAL_ROWS["w_log"],),
    )


# --------------------------------------------------------------------------------------------
# Contents, digests, diffs
# --------------------------------------------------------------------------------------------

def _source(table: str, snap: int | None) -> sql.Composable:
    if snap is None:
        return sql.SQL("{} t").format(sql.Identifier(table))
    return sql.SQL("gsnap_asof(NULL::{}, {}) t").format(sql.Identifier(table), sql.Literal(snap))


def contents(conn: psycopg.Connection, table: str, snap: int | None = None) -> Counter:
    """The rows of `table` (live, or at snapshot `snap`) as a multiset of (id, md5(row))."""
    q = sql.SQL("SELECT t.id, md5(t::text) FROM {}").format(_source(table, snap))
    return Counter((r[0], r[1]) for r in conn.execute(q))


def located_contents(conn: psycopg.Connection, table: str) -> tuple[Counter, dict]:
    """Live contents plus where each row is (its TID), for diagnostics."""
    q = sql.SQL("SELECT t.id, md5(t::text), t.ctid::text FROM {} t").format(sql.Identifier(table))
    rows = conn.execute(q).fetchall()
    return Counter((r[0], r[1]) for r in rows), {(r[0], r[1]): r[2] for r in rows}


def digest(conn: psycopg.Connection, table: str, snap: int | None = None) -> tuple[int, str]:
    """(row count, order-independent digest) of `table`, live or at snapshot `snap`."""
    q = sql.SQL(
        "SELECT count(*), coalesce(md5(string_agg(h, '' ORDER BY h)), '') "
        "FROM (SELECT md5(t::text) AS h FROM {}) s"
    ).format(_source(table, snap))
    n, d = conn.execute(q).fetchone()
    return n, d


def describe_diff(expected: Counter, got: Counter, where: dict | None = None, limit: int = 12) -> str:
    missing = expected - got
    extra = got - expected
    lines = [f"{len(expected)} rows expected, {len(got)} read: "
             f"{sum(missing.values())} missing, {sum(extra.values())} unexpected"]
    ids_missing = {i for i, _ in missing}
    ids_extra = {i for i, _ in extra}
    changed = sorted(ids_missing & ids_extra)
    if changed:
        lines.append(f"  ids with a different version: {changed[:limit]}")
    for label, part in (("missing", missing), ("unexpected", extra)):
        only = sorted((k for k in part if k[0] not in ids_missing & ids_extra), key=lambda k: k[0])
        if only:
            shown = []
            for k in only[:limit]:
                tid = (where or {}).get(k)
                shown.append(f"{k[0]}@{tid}" if tid else str(k[0]))
            lines.append(f"  {label} ids: {', '.join(shown)}" + (" ..." if len(only) > limit else ""))
    if where:
        blocks = Counter(where[k].strip("()").split(",")[0] for k in missing if k in where)
        if blocks:
            lines.append(f"  blocks of the missing rows (at the snapshot): {dict(blocks)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------

def snapshots(conn: psycopg.Connection) -> dict[int, dict]:
    cur = conn.execute("SELECT * FROM gsnap_snapshots() ORDER BY snap_id")
    names = [d.name for d in cur.description]
    return {r[0]: dict(zip(names, r)) for r in cur}


def progress(conn: psycopg.Connection) -> dict:
    cur = conn.execute("SELECT * FROM gsnap_progress()")
    names = [d.name for d in cur.description]
    return dict(zip(names, cur.fetchone()))


def worker_restarted(cluster, old_pid: int) -> bool:
    """Whether a new gsnap worker (not `old_pid`) is ready; False while the server restarts."""
    try:
        with cluster.connect() as conn:
            p = progress(conn)
            return p["worker"] == "ready" and p["worker_pid"] not in (None, old_pid)
    except psycopg.OperationalError:
        return False


def wait_worker_ready(cluster, timeout: float = 60) -> None:
    """Waits until the gsnap worker runs and its store is open."""
    def ready():
        try:
            with cluster.connect() as c:
                p = progress(c)
                return p if p["worker"] == "ready" else f"worker {p['worker']}"
        except psycopg.OperationalError as e:
            return f"cannot connect: {e}"
    last = None

    def check():
        nonlocal last
        last = ready()
        return not isinstance(last, str)
    try:
        wait_until(check, timeout, "the gsnap worker to be ready", interval=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}\nserver log tail:\n{cluster.log()[-2000:]}") from None


# Defaults of the settings tests change (what RESET brings back).
DEFAULTS = {"capture_batch_pages": "256", "debug_declare_pause_ms": "0", "debug_capture_pause_ms": "0", "debug_commit_pause_ms": "0", "capture_memory": "512MB",
            "snapshot_interval": "0", "max_queued_snapshots": "16", "capture_pace": "0.8",
            "capture_page_copies": "on", "capture_copy_ahead": "1s"}

_UNITS = {"": 1, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000,
          "kB": 1, "MB": 1024, "GB": 1024 * 1024}


def _setting_value(text: str) -> float:
    """A numeric setting as PostgreSQL shows it ('1500ms', '2s', '8', '0.5') in its smallest
    unit; write values with their unit when they have one. A boolean is 1 or 0."""
    if text in ("on", "off"):
        return float(text == "on")
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    assert m and m.group(2) in _UNITS, f"cannot read setting value {text!r}"
    return float(m.group(1)) * _UNITS[m.group(2)]


def set_settings(conn: psycopg.Connection, **settings) -> None:
    """ALTER SYSTEM SET gsnap.<name> = value for each setting (None resets), then reloads,
    waits until this session and the worker have reread the configuration, and checks that
    this session sees the new values."""
    for name, value in settings.items():
        ident = sql.Identifier(*f"gsnap.{name}".split("."))
        if value is None:
            conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(ident))
        else:
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(ident, sql.Literal(str(value))))
    reload_conf(conn)
    for name, value in settings.items():
        if value is None:  # what the configuration files say now, or the default
            row = conn.execute("SELECT setting FROM pg_file_settings WHERE name = %s AND error IS NULL "
                               "ORDER BY seqno DESC LIMIT 1", (f"gsnap.{name}",)).fetchone()
            want = _setting_value(row[0] if row else DEFAULTS[name])
        else:
            want = _setting_value(str(value))
        got = conn.execute("SELECT current_setting(%s)", (f"gsnap.{name}",)).fetchone()[0]
        assert _setting_value(got) == want, f"gsnap.{name} is {got} after the reload, expected {want}"


def table_sizes(conn: psycopg.Connection, table: str, snap: int, back: int = 3) -> str:
    """The table's size in blocks recorded at `snap` and the few snapshots before it."""
    sizes = []
    for s in range(max(1, snap - back), snap + 1):
        try:
            row = conn.execute("SELECT blocks FROM gsnap_snapshot_tables(%s) WHERE table_oid = %s::regclass",
                               (s, table)).fetchone()
            sizes.append(f"{s}: {row[0] if row else '-'}")
        except psycopg.Error:
            sizes.append(f"{s}: ?")
    return f"blocks of {table} recorded at snapshots " + ", ".join(sizes)


class GroundTruth:
    """Declares snapshots with gsnap_debug_snapshot() and reads, through the exported MVCC
    snapshot, exactly what each must contain."""

    def __init__(self, cluster, tables: list[str]):
        self.tables = tables
        self.decl = cluster.connect()
        self.reader = cluster.connect()
        self.truth: dict[int, dict[str, tuple[Counter, dict]]] = {}

    def take(self) -> int:
        snap, exported = self.decl.execute(
            "SELECT snap_id, exported FROM gsnap_debug_snapshot()").fetchone()
        try:
            assert exported, f"gsnap_debug_snapshot() returned no exported snapshot for {snap}"
            self.reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                self.reader.execute(
                    sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
            finally:
                self.decl.execute("SELECT gsnap_debug_release(%s)", (snap,))
            self.truth[snap] = {t: located_contents(self.reader, t) for t in self.tables}
        finally:
            self.reader.execute("COMMIT")
        return snap

    def check(self, conn: psycopg.Connection, snaps=None) -> list[str]:
        """Compares gsnap_asof with the ground truth; returns a description per mismatch."""
        problems = []
        for snap in sorted(self.truth if snaps is None else snaps):
            for t in self.tables:
                expected, where = self.truth[snap][t]
                try:
                    got = contents(conn, t, snap)
                except psycopg.Error as e:
                    problems.append(f"snapshot {snap}, {t}: reading failed: {e}")
                    continue
                if got != expected:
                    problems.append(f"snapshot {snap}, {t}: " + describe_diff(expected, got, where)
                                    + "\n  " + table_sizes(conn, t, snap))
        return problems

    def close(self):
        self.decl.close()
        self.reader.close()


# --------------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------------

# Errors a random concurrent workload can legitimately run into (and then rolls back).
EXPECTED_ERRORS = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.SerializationFailure,
    psycopg.errors.QueryCanceled,
)


@dataclass
class Stats:
    committed: int = 0
    aborted: int = 0
    statements: int = 0
    rows_changed: int = 0
    vacuums: int = 0
    long_xacts: int = 0
    savepoints: int = 0
    conflicts: int = 0
    kinds: Counter = field(default_factory=Counter)

    def add(self, other: "Stats") -> None:
        for f in ("committed", "aborted", "statements", "rows_changed", "vacuums", "long_xacts",
                  "savepoints", "conflicts"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.kinds.update(other.kinds)


class Client(threading.Thread):
    """One client running random transactions until `stop` is set."""

    def __init__(self, cluster, no: int, stop: threading.Event, seed: int, epoch: int = 0,
                 vacuum_probability: float = 0.01, tolerate_disconnect: threading.Event | None = None):
        super().__init__(daemon=True, name=f"client-{no}")
        self.cluster = cluster
        self.no = no
        self.stop = stop
        self.rng = random.Random(seed)
        self.next_id = THREAD_ID_BASE * (no + 1) + epoch * 1_000_000
        self.mine: dict[str, list[int]] = {t: [] for t in TABLES}
        self.stats = Stats()
        self.error: BaseException | None = None
        self.vacuum_probability = vacuum_probability
        self.tolerate_disconnect = tolerate_disconnect
        self.pending_rows = 0

    # -- statements ----------------------------------------------------------------------
    def some_id(self, table: str) -> int:
        mine = self.mine[table]
        if mine and self.rng.random() < 0.4:
            return self.rng.choice(mine)
        return self.rng.randint(1, INITIAL_ROWS[table])

    def new_id(self, table: str) -> int:
        self.next_id += 1
        self.mine[table].append(self.next_id)
        return self.next_id

    def text_value(self) -> str:
        r = self.rng.random()
        if r < 0.12:
            return BIG_RANDOM.format(n=self.rng.randint(70, 300))  # 2-10 kB, out of line
        if r < 0.2:
            return BIG_REPEAT.format(n=self.rng.randint(100, 3000))  # compressed
        return f"md5(random()::text) || {self.rng.randint(0, 10**6)}"

    def statement(self, conn) -> None:
        r = self.rng.random()
        rng = self.rng
        if r < 0.18:
            t = rng.choice(TABLES)
            i = self.new_id(t)
            if t == "w_acct":
                q = (f"INSERT INTO w_acct VALUES ({i}, {rng.randint(0, 96)}, 0, {self.text_value()}, "
                     f"jsonb_build_object('i', {i}, 'c', {self.no}))")
            elif t == "w_item":
                q = (f"INSERT INTO w_item VALUES ({i}, {rng.randint(0, 30)}, {self.text_value()}, "
                     f"jsonb_build_object('i', {i}, 'tags', jsonb_build_array({rng.randint(0, 9)})))")
            else:
                q = f"INSERT INTO w_log VALUES ({i}, {rng.randint(0, 12)}, {self.text_value()}, NULL)"
            self.stats.kinds["insert"] += 1
        elif r < 0.40:  # HOT update: a non-indexed column of a fillfactor-70 table
            q = f"UPDATE w_acct SET counter = counter + 1 WHERE id = {self.some_id('w_acct')}"
            self.stats.kinds["hot_update"] += 1
        elif r < 0.50:  # non-HOT: an indexed column
            t = rng.choice(["w_acct", "w_item"])
            q = f"UPDATE {t} SET k = k + 1 WHERE id = {self.some_id(t)}"
            self.stats.kinds["nonhot_update"] += 1
        elif r < 0.58:  # growing or TOASTing rows, jsonb changes
            t = rng.choice(["w_acct", "w_item"])
            col = "note" if t == "w_acct" else "payload"
            i = self.some_id(t)
            choice = rng.random()
            if choice < 0.4:
                q = f"UPDATE {t} SET {col} = {col} || repeat('g', {rng.randint(50, 600)}) WHERE id = {i}"
            elif choice < 0.7:
                q = f"UPDATE {t} SET {col} = {self.text_value()} WHERE id = {i}"
            else:
                q = (f"UPDATE {t} SET doc = jsonb_set(coalesce(doc, '{{}}'), '{{u}}', "
                     f"to_jsonb({rng.randint(0, 10**6)})) WHERE id = {i}")
            self.stats.kinds["grow_update"] += 1
        elif r < 0.64:  # a short range of rows (several pages, both update kinds)
            lo = self.some_id("w_acct")
            q = f"UPDATE w_acct SET counter = counter + 1 WHERE id BETWEEN {lo} AND {lo + rng.randint(2, 40)}"
            self.stats.kinds["range_update"] += 1
        elif r < 0.74:
            t = rng.choice(TABLES)
            q = f"DELETE FROM {t} WHERE id = {self.some_id(t)}"
            self.stats.kinds["delete"] += 1
        elif r < 0.77:
            lo = self.some_id("w_log")
            q = f"DELETE FROM w_log WHERE id BETWEEN {lo} AND {lo + rng.randint(1, 15)}"
            self.stats.kinds["range_delete"] += 1
        elif r < 0.83:  # speculative insertion
            t = "w_acct"
            i = self.some_id(t) if rng.random() < 0.6 else self.new_id(t)
            q = (f"INSERT INTO w_acct VALUES ({i}, 1, 0, 'upsert', NULL) ON CONFLICT (id) DO UPDATE "
                 f"SET counter = w_acct.counter + 100")
            self.stats.kinds["upsert"] += 1
        elif r < 0.90:  # row locks (tuple_lock; FOR SHARE from two sessions makes multixacts)
            mode = rng.choice(["FOR SHARE", "FOR UPDATE", "FOR NO KEY UPDATE", "FOR KEY SHARE"])
            lo = self.some_id("w_acct")
            q = f"SELECT id FROM w_acct WHERE id BETWEEN {lo} AND {lo + 5} {mode}"
            self.stats.kinds["lock"] += 1
        elif r < 0.915:  # a bulk insert that fills several new blocks
            n = rng.randint(100, 300)
            first = self.next_id + 1
            self.next_id += n
            self.mine["w_log"].extend(range(first, first + n, 7))
            q = (f"INSERT INTO w_log SELECT i, i % 13, repeat('bulk ', 10 + i % 30), "
                 f"jsonb_build_object('b', i) FROM generate_series({first}, {first + n - 1}) i")
            self.stats.kinds["bulk_insert"] += 1
        elif r < 0.94:  # COPY (multi_insert)
            ids = [self.new_id("w_log") for _ in range(rng.randint(5, 60))]
            with conn.cursor().copy("COPY w_log (id, grp, body) FROM STDIN") as cp:
                for i in ids:
                    cp.write_row((i, rng.randint(0, 12), "copied " * rng.randint(1, 30)))
            self.stats.statements += 1
            self.pending_rows += len(ids)
            self.stats.kinds["copy"] += 1
            return
        else:
            i = self.some_id("w_item")
            q = f"UPDATE w_item SET payload = {self.text_value()}, k = k + 1 WHERE id = {i}"
            self.stats.kinds["toast_update"] += 1
        cur = conn.execute(q)
        self.stats.statements += 1
        if cur.rowcount and cur.rowcount > 0 and not q.startswith("SELECT"):
            self.pending_rows += cur.rowcount

    # -- transactions --------------------------------------------------------------------
    def transaction(self, conn) -> None:
        rng = self.rng
        self.pending_rows = 0
        kind = rng.random()
        if kind < self.vacuum_probability:
            conn.execute(f"VACUUM {rng.choice(TABLES)}")
            self.stats.vacuums += 1
            return
        conn.execute("BEGIN")
        commit = True
        if kind < 0.55:  # short
            for _ in range(rng.randint(1, 3)):
                self.statement(conn)
        elif kind < 0.68:  # aborted
            for _ in range(rng.randint(1, 4)):
                self.statement(conn)
            commit = False
        elif kind < 0.78:  # long: open across several snapshots
            self.stats.long_xacts += 1
            end = time.monotonic() + rng.uniform(0.8, 2.0)
            while time.monotonic() < end and not self.stop.is_set():
                self.statement(conn)
                time.sleep(rng.uniform(0.1, 0.4))
            commit = rng.random() < 0.8
        elif kind < 0.97:  # savepoints, ROLLBACK TO and RELEASE
            self.stats.savepoints += 1
            self.statement(conn)
            conn.execute("SAVEPOINT a")
            self.statement(conn)
            conn.execute("SAVEPOINT b")
            self.statement(conn)
            conn.execute(rng.choice(["ROLLBACK TO SAVEPOINT b", "RELEASE SAVEPOINT b"]))
            self.statement(conn)
            conn.execute("ROLLBACK TO SAVEPOINT a")
            self.statement(conn)
            commit = rng.random() < 0.9
        else:  # more subtransactions than a snapshot's subxip holds (suboverflowed)
            self.stats.savepoints += 1
            for n in range(70):
                conn.execute(f"SAVEPOINT s{n}")
                i = self.new_id("w_log")
                conn.execute(f"INSERT INTO w_log VALUES ({i}, {n % 13}, 'sub {n}', NULL)")
                self.pending_rows += 1
                if n % 9 == 4:
                    conn.execute(f"ROLLBACK TO SAVEPOINT s{n}")
            self.stats.kinds["many_subxacts"] += 1
        if commit:
            conn.execute("COMMIT")
            self.stats.committed += 1
            self.stats.rows_changed += self.pending_rows
        else:
            conn.execute("ROLLBACK")
            self.stats.aborted += 1

    def run(self) -> None:
        try:
            with self.cluster.connect() as conn:
                conn.execute("SET lock_timeout = '3s'")
                conn.execute("SET deadlock_timeout = '200ms'")
                while not self.stop.is_set():
                    try:
                        self.transaction(conn)
                    except EXPECTED_ERRORS:
                        self.stats.conflicts += 1
                        conn.execute("ROLLBACK")
        except psycopg.OperationalError as e:
            if self.tolerate_disconnect is not None and self.tolerate_disconnect.is_set():
                return  # the server was killed on purpose
            self.error = e
        except BaseException as e:  # reported by the test
            if self.tolerate_disconnect is not None and self.tolerate_disconnect.is_set():
                return
            self.error = e


class Workload:
    """`n` clients running concurrently until stopped. Workloads run one after the other on
    the same tables need different `epoch`s (their clients insert different ids)."""

    def __init__(self, cluster, n: int = 4, seed: int = 1, **kw):
        self.stop = threading.Event()
        self.killed = threading.Event()
        self.clients = [Client(cluster, i, self.stop, seed * 1000 + i, tolerate_disconnect=self.killed, **kw)
                        for i in range(n)]

    def __enter__(self) -> "Workload":
        for c in self.clients:
            c.start()
        return self

    def finish(self, timeout: float = 30) -> Stats:
        self.stop.set()
        for c in self.clients:
            c.join(timeout)
            assert not c.is_alive(), f"{c.name} did not stop within {timeout} s"
        errors = [f"{c.name}: {type(c.error).__name__}: {c.error}" for c in self.clients if c.error]
        assert not errors, "workload clients failed:\n" + "\n".join(errors)
        total = Stats()
        for c in self.clients:
            total.add(c.stats)
        return total

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for c in self.clients:
            c.join(30)
