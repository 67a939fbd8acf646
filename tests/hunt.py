"""Shared by the bug-hunting tier (test_plan_invalidation.py, test_fuzz.py): running a
statement and recording what came of it (rows, a clean ERROR, an internal error, a lost
connection), and watching the server so that a backend crash is noticed and blamed on the
test that caused it, even when the statement that crashed was not the one that failed.

A clean ERROR is one with a SQLSTATE outside class XX (internal error) whose message is not a
Rust panic. A crash is any of: a connection lost in the middle of a statement, a line of the
server log saying a process was terminated by a signal or exited abnormally or the server
PANICked, or a server that restarted (after a crash PostgreSQL reinitializes shared memory and
restarts every child but keeps the postmaster, so pg_postmaster_start_time() stays the same:
the checkpointer's PID is what changes).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from cluster import (  # noqa: F401 (LOG_LINE_START: for test_fuzz.py)
    CRASH_LINE, LOG_LINE_START, Cluster, LogTail, crash_lines, short)

# What a Rust panic or a pgrx-reported internal failure looks like in an error message.
PANIC_TEXT = re.compile(
    r"panicked at|RUST_BACKTRACE|stack backtrace|called `(Option|Result)::unwrap\(\)`"
    r"|called `Option::expect|rust panic|index out of bounds|attempt to (add|subtract|multiply)"
    r" with overflow|unwrap on|\bpanic\b",
    re.I,
)

# SQLSTATEs a surviving backend reports when *another* process crashed (its connection is
# closed by the postmaster) or the server shut down.
LOST_STATES = {"57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004"}


@dataclass
class Outcome:
    """What a statement did: kind is 'rows', 'ok' (no result set), 'error' or 'lost'."""

    kind: str
    cols: tuple[str, ...] | None = None
    rows: list[tuple] | None = None
    sqlstate: str | None = None
    message: str = ""

    @property
    def clean_error(self) -> bool:
        return (self.kind == "error" and self.sqlstate is not None
                and not self.sqlstate.startswith("XX") and not PANIC_TEXT.search(self.message))

    def __str__(self) -> str:
        if self.kind == "rows":
            return f"{len(self.rows)} row(s) of ({', '.join(self.cols)})"
        if self.kind == "ok":
            return "ok"
        if self.kind == "lost":
            return f"CONNECTION LOST ({short(self.message, 200)})"
        return f"ERROR {self.sqlstate}: {short(self.message, 300)}"


def sort_key(row) -> str:
    return repr(row)


def normalize(rows) -> list[tuple]:
    return sorted((tuple(r) for r in rows), key=sort_key)


def outcome(conn: psycopg.Connection, sql: str, params=None, prepare: bool | None = None) -> Outcome:
    """Runs one statement and records its outcome; never raises for a database error."""
    try:
        cur = conn.execute(sql, params, prepare=prepare)
        if cur.description is None:
            return Outcome("ok")
        cols = tuple(d.name for d in cur.description)
        return Outcome("rows", cols, normalize(cur.fetchall()))
    except psycopg.Error as e:
        state = getattr(e, "sqlstate", None)
        msg = (e.diag.message_primary if getattr(e, "diag", None) is not None else None) or str(e)
        detail = e.diag.message_detail if getattr(e, "diag", None) is not None else None
        if detail:
            msg += f" (DETAIL: {detail})"
        if state is None or state in LOST_STATES or conn.closed or conn.broken:
            return Outcome("lost", sqlstate=state, message=str(e))
        return Outcome("error", sqlstate=state, message=msg)


def diff_rows(got: list[tuple], want: list[tuple], limit: int = 6) -> str:
    """A short multiset difference of two sorted row lists."""
    from collections import Counter

    g, w = Counter(map(sort_key, got)), Counter(map(sort_key, want))
    extra = list((g - w).elements())
    missing = list((w - g).elements())
    out = [f"{len(got)} row(s) returned, {len(want)} expected"]
    if extra:
        out.append(f"unexpected {len(extra)}: " + "; ".join(short(x, 160) for x in extra[:limit]))
    if missing:
        out.append(f"missing {len(missing)}: " + "; ".join(short(x, 160) for x in missing[:limit]))
    return " | ".join(out)


def compare(got: Outcome, want: Outcome) -> str | None:
    """None when `got` has exactly the rows (multiset) and columns of `want`, else why not."""
    if got.kind != "rows" or want.kind != "rows":
        return f"got {got}, expected {want}"
    if got.cols != want.cols:
        return f"columns ({', '.join(got.cols)}) instead of ({', '.join(want.cols)})"
    if got.rows != want.rows:
        return "wrong rows: " + diff_rows(got.rows, want.rows)
    return None


@dataclass
class ServerWatch:
    """Notices crashes and restarts of a cluster between mark() and check()."""

    cluster: Cluster
    ident: tuple | None = None
    log: LogTail = field(init=False)

    def __post_init__(self):
        self.log = LogTail(self.cluster.data / "server.log")
        self.ident = self.identity()

    def identity(self, timeout: float = 90) -> tuple:
        """(postmaster start time, checkpointer PID), once the server takes connections and
        its gsnap worker is ready (it comes back a moment after a crash restart)."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                with self.cluster.connect(connect_timeout=5) as c:
                    c.execute("SET statement_timeout = '10s'")
                    ident = c.execute(
                        "SELECT pg_postmaster_start_time(), (SELECT pid FROM pg_stat_activity"
                        " WHERE backend_type = 'checkpointer')").fetchone()
                    if c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'gsnap'"
                                 ).fetchone()[0] == 0:
                        return tuple(ident)
                    w = c.execute("SELECT worker FROM gsnap_progress()").fetchone()[0]
                    if w == "ready":
                        return tuple(ident)
                    last = f"gsnap worker {w}"
            except psycopg.Error as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not come back within {timeout} s: {last}")
            time.sleep(0.2)

    def mark(self) -> None:
        self.log.mark()

    def check(self) -> list[str]:
        """What went wrong with the server since mark() (empty if nothing); waits for the
        server to be back if it restarted, and marks again."""
        problems = []
        # the log line of a crash comes from the postmaster a moment after the backend died
        log = self.log.since_mark()
        ident = self.identity()
        log = self.log.since_mark()
        # After a crash the postmaster ends every process and starts them again; identity()
        # may have read the old checkpointer before it was ended (it still answers while the
        # postmaster handles the death): wait until the new one is up.
        deadline = time.monotonic() + 90
        while ident == self.ident and CRASH_LINE.search(log) and time.monotonic() < deadline:
            time.sleep(0.2)
            ident = self.identity()
            log = self.log.since_mark()
        problems += crash_lines(log)
        if ident != self.ident:
            problems.append(f"the server restarted: (postmaster start, checkpointer pid) "
                            f"{self.ident} -> {ident}")
            self.ident = ident
        self.mark()
        return problems


def connect(cluster: Cluster, timeout_s: int = 20, **kw) -> psycopg.Connection:
    """An autocommit connection that never prepares statements on its own and cannot hang:
    every statement is cancelled after `timeout_s` seconds."""
    kw.setdefault("prepare_threshold", None)
    kw.setdefault("connect_timeout", 10)
    conn = cluster.connect(options=f"-c statement_timeout={timeout_s * 1000}", **kw)
    return conn


def close_quietly(*conns: Any) -> None:
    for c in conns:
        if c is None:
            continue
        try:
            c.close()
        except Exception:  # noqa: BLE001 - a dead connection closes badly
            pass
