"""Real PostgreSQL clusters for gsnap's integration tests.

A `Cluster` is created with scripts/cluster.sh (so tests start servers exactly the way the
README does), run by the unprivileged OS user, listening on localhost and a Unix socket in
its data directory. Tests connect as the `postgres` superuser with psycopg.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
PGBIN = Path("/usr/lib/postgresql/15/bin")
SERVER_USER = "gsnap"  # the OS user scripts/cluster.sh runs servers as ($GSNAP_OS_USER)


def short(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


# Server log lines that mean a process died or the server restarted. A parallel worker that
# raised an ERROR (reported to its leader, which raises it too) exits with code 1 by design:
# not a crash.
CRASH_LINE = re.compile(
    r"terminated by signal|terminated by exception"
    r"|exited with exit code (?!1\b)[1-9]\d*"
    r"|(?<!\"parallel worker\") \(PID \d+\) exited with exit code 1\b"
    r"|\bPANIC:|all server processes terminated; reinitializing"
    r"|terminating any other active server processes"
)

# The start of a server log line (log_line_prefix begins with %m); other lines continue one.
LOG_LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:")
# The process that wrote a log line (log_line_prefix '%m [%p] ').
LOG_PID = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ \S+ \[(\d+)\]")

class LogTail:
    """Reads what the server log gained since the last mark, by byte offset."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = self.size()

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def mark(self) -> None:
        self.pos = self.size()

    def since_mark(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def take(self) -> str:
        """The whole lines the log gained since the last mark or take, and marks after them (a
        line still being written is left for the next take)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return ""
        data = data[: data.rfind(b"\n") + 1]
        self.pos += len(data)
        return data.decode(errors="replace")


def crash_lines(log: str, expected=lambda line: False) -> list[str]:
    """The log lines about a dead process, each with the query it was running if logged.
    `expected` sees every line in order and may excuse one."""
    out = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if not expected(line) and CRASH_LINE.search(line):
            out.append(short(line, 300))
            for j in range(i + 1, min(i + 3, len(lines))):
                if "Failed process was running" in lines[j]:
                    query = [lines[j]]
                    for more in lines[j + 1:]:  # a query of several lines goes on unprefixed
                        if LOG_LINE_START.match(more):
                            break
                        query.append(more)
                    out.append("    " + short(" ".join(query), 1500))
    return out


def server_uid() -> int:
    return pwd.getpwnam(SERVER_USER).pw_uid


def assert_private(path: Path):
    """`path` is the server user's and open to no one else (mode 0700)."""
    st = path.stat()
    assert st.st_mode & 0o777 == 0o700, f"{path} has mode {st.st_mode & 0o777:04o}"
    assert st.st_uid == server_uid(), f"{path} is owned by uid {st.st_uid}"


def snapshot(conn: psycopg.Connection) -> int:
    """Declares a snapshot and returns its id."""
    return conn.execute("SELECT gsnap_snapshot()").fetchone()[0]


def rows(conn: psycopg.Connection, query: str, *args) -> Counter:
    """The rows of `query` as a multiset."""
    return Counter(conn.execute(query, args or None).fetchall())


def sqlstate(conn: psycopg.Connection, query: str, *args) -> str | None:
    """The SQLSTATE of the error `query` raises, None if it succeeds."""
    try:
        conn.execute(query, args or None)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def reset_timeout(conn: psycopg.Connection) -> None:
    """RESET statement_timeout. A timeout that fires between the end of a statement and its
    commit is reported by the next statement (PostgreSQL's own race): retry then."""
    for _ in range(3):
        try:
            conn.execute("RESET statement_timeout")
            return
        except psycopg.errors.QueryCanceled:
            pass
    conn.execute("RESET statement_timeout")


def cancelled_part_way(conn: psycopg.Connection, query: str, n: int, full: float) -> int:
    """Runs `query` (which takes about `full` seconds) `n` times, each time cancelled by a
    statement_timeout further into its run (from 1/(n + 2) of it up to n/(n + 2)); returns how
    many runs were cancelled. A backend that dies fails the test."""
    cancelled = 0
    for i in range(n):
        conn.execute(f"SET statement_timeout = {max(1, int(full * 1000 * (i + 1) / (n + 2)))}")
        try:
            conn.execute(query).fetchall()
        except psycopg.errors.QueryCanceled:
            cancelled += 1
        except psycopg.OperationalError as e:
            raise AssertionError(f"the backend died in the {i + 1}th run of {query!r}: {e}") from e
        finally:
            reset_timeout(conn)
    return cancelled


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Polls `predicate` until it returns something true and returns that; after `timeout`
    seconds fails with an AssertionError naming `what` and the last value seen.

    Tests wait for conditions this way, never with a fixed sleep: a fixed sleep is too short
    on a slow machine and wasted time on a fast one."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def in_threads(work, n: int, timeout: float) -> list[Exception]:
    """Runs `work(i)` for i in 0..n, each on a thread of its own, all at once; returns the
    exceptions they raised (waiting at most `timeout` seconds for each thread)."""
    failures: list[Exception] = []

    def run(i: int) -> None:
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 - returned to the caller
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return failures


def worker_caught_up(conn: psycopg.Connection) -> None:
    """Returns once the gsnap worker has begun a new pass of its main loop since the call.

    Each pass of the worker's loop first rereads the configuration files if a reload was
    signalled, then looks at every request slot once, then frees the requests that backends
    gave up (src/worker/mod.rs, `Worker::run`). A request of this session answered, then a
    second one sent only afterwards, cannot both be served by the same pass: the second
    answer comes from a pass that began after the first request was sent."""
    for _ in range(2):
        conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()


def reload_conf(conn: psycopg.Connection, timeout: float = 10) -> None:
    """pg_reload_conf(), then waits until this session and the gsnap worker have both reread
    the configuration files (the postmaster signals every process on the same SIGHUP)."""
    before = conn.execute("SELECT pg_conf_load_time()").fetchone()[0]
    conn.execute("SELECT pg_reload_conf()")
    wait_until(lambda: conn.execute("SELECT pg_conf_load_time()").fetchone()[0] != before,
               timeout, "this session to reread the configuration files after pg_reload_conf()")
    worker_caught_up(conn)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A PostgreSQL 15 cluster in a temporary directory."""

    def __init__(self, name: str, conf: list[str] | None = None, preload: bool = True):
        self.base = Path(tempfile.mkdtemp(prefix=f"gsnap-{name}."))
        os.chmod(self.base, 0o755)
        self.data = self.base / "data"
        self.port = free_port()
        self.conf = list(conf or [])
        # The crash guard (`unexpected_crashes`): signals tests sent to server processes on
        # purpose, whose deaths (and the restart each causes) are not crashes.
        self.expected_deaths: list[int] = []
        self.restarting = False
        self.stopping = False
        self.ended: set[int] = set()
        self.crashed = False
        self.guard = LogTail(self.data / "server.log")
        if not preload:
            # cluster.sh preloads gsnap first; a later line in postgresql.conf wins
            self.conf.append("shared_preload_libraries = ''")

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Cluster":
        subprocess.run(
            [str(SCRIPTS / "cluster.sh"), "start", str(self.data), str(self.port), *self.conf],
            check=True,
        )
        if self not in Cluster.live:
            Cluster.live.append(self)
        return self

    def stop(self) -> None:
        subprocess.run([str(SCRIPTS / "cluster.sh"), "stop", str(self.data)], check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        """Stops the server and removes its directory, unless the server crashed in a way no
        test asked for: then the directory (its log, and with GSNAP_TEST_CORES=1 the core
        files) is kept and the crash fails whoever destroys it."""
        self.stop()
        if self in Cluster.live:
            Cluster.live.remove(self)
        crashes = self.unexpected_crashes()
        if self.crashed:
            print(f"\nkept {self.base}: its server crashed (server.log; core files there with "
                  "GSNAP_TEST_CORES=1)")
        else:
            shutil.rmtree(self.base, ignore_errors=True)
        assert not crashes, "a server process crashed:\n" + "\n".join(crashes)

    # -- the crash guard -------------------------------------------------------------------
    # Every started cluster is checked after each test (tests/conftest.py) and when destroyed:
    # a crash a test did not look for fails it, even where the test saw only an error it
    # expected (a statement expected to fail can crash, its client seeing a lost connection)
    # or a server that came back by itself.
    live: list["Cluster"] = []

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to one of the server's processes on purpose: its death, and the
        restart of every session it causes, are not crashes for the guard."""
        self.expected_deaths.append(int(sig))
        os.kill(pid, sig)

    def unexpected_crashes(self) -> list[str]:
        """The lines the server log gained since the last call about a process that died or a
        server that restarted, but those `kill` asked for, each with its query if logged."""

        def expected(line: str) -> bool:
            # a shutdown ends the background workers with exit code 1
            if re.search(r"received (fast|smart|immediate) shutdown request", line):
                self.stopping = True
            elif re.search(r"starting PostgreSQL|ready to accept connections", line):
                self.stopping = False
            if self.stopping and re.search(r"exited with exit code 1\b", line):
                return True
            # a process that said why it ends (a FATAL error: a session terminated, the
            # worker's database missing; the gsnap worker told to stop) exits with code 1
            said = LOG_PID.match(line)
            if said and re.search(r"\bFATAL:|gsnap worker stopping", line):
                self.ended.add(int(said.group(1)))
            orderly = re.search(r"\(PID (\d+)\) exited with exit code 1\b", line)
            if orderly and int(orderly.group(1)) in self.ended:
                return True
            died = re.search(r"terminated by signal (\d+)", line)
            if died and int(died.group(1)) in self.expected_deaths:
                self.expected_deaths.remove(int(died.group(1)))
                self.restarting = True
                return True
            if self.restarting and re.search(r"terminating any other active server processes"
                                             r"|all server processes terminated; reinitializing",
                                             line):
                self.restarting = "reinitializing" not in line
                return True
            return False

        crashes = crash_lines(self.guard.take(), expected)
        self.crashed = self.crashed or bool(crashes)
        return crashes

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def crash(self) -> None:
        """kill -9 the postmaster and its children, as a power cut would."""
        pid = self.postmaster_pid()
        children = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True
        ).stdout.split()
        os.kill(pid, signal.SIGKILL)
        for child in children:
            try:
                os.kill(int(child), signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Wait until every process is gone, zombies included (pg_ctl takes a postmaster that
        # is dead but not yet reaped for a running one, and would not start a new one).
        pids = [pid, *map(int, children)]
        deadline = time.time() + 30
        while time.time() < deadline:
            alive = subprocess.run(["pgrep", "-f", str(self.data)], capture_output=True).stdout
            if not alive and not any(os.path.exists(f"/proc/{p}") for p in pids):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(
                f"the processes of the killed cluster {self.data} did not go away within 30 s "
                "(zombies stay when PID 1 does not reap orphans: run containers with an init)")

    # -- configuration ---------------------------------------------------------------------
    def conf_text(self) -> str:
        return (self.data / "postgresql.conf").read_text()

    def set_conf(self, line: str) -> None:
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(line + "\n")

    def log(self) -> str:
        path = self.data / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- clients ---------------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host={self.data} port={self.port} dbname={dbname} user={user}"

    def connect(self, dbname: str = "postgres", user: str = "postgres", **kw) -> psycopg.Connection:
        kw.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname, user), **kw)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(PGHOST=str(self.data), PGPORT=str(self.port), PGUSER="postgres",
                   PGDATABASE="postgres")
        return env

    def run(self, *args: str, env: dict[str, str] | None = None, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Runs a PostgreSQL client program (psql, pgbench, pg_dump, ...) against the cluster."""
        program, *rest = args
        full_env = self.env()
        full_env.update(env or {})
        return subprocess.run([str(PGBIN / program), *rest], env=full_env, check=check,
                              capture_output=True, text=True, input=input)


def gsnap_cluster(name: str, conf: list[str] | None = None):
    """A started cluster with the extension created, destroyed afterwards: the body of a
    pytest fixture (`yield from gsnap_cluster(...)`). After the module's last test, the
    caches must hold no pin once no other session runs (see `check_no_pins_left`)."""
    c = Cluster(name, conf)
    try:
        c.start()
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION gsnap")
        yield c
        check_no_pins_left(c)
    finally:
        c.destroy()


def check_no_pins_left(c: Cluster, timeout: float = 20) -> None:
    """Fails if the group or image cache still holds a pin once every other session has
    ended: a pin nobody releases keeps its slot (or its index group, and with it the
    snapshots the group covers from reclamation) until the server restarts. Sessions a test
    left open are terminated first; a terminated session must release its pins too. Skipped
    where the server is down or the extension is gone (a module may stop the server or drop
    the extension)."""
    if not (c.data / "postmaster.pid").exists():
        return
    try:
        conn = c.connect()
    except psycopg.OperationalError:
        return
    pins = "SELECT group_pins, image_pins FROM gsnap_index_stats()"
    with conn:
        try:
            conn.execute(pins)
        except psycopg.errors.UndefinedFunction:
            return
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
        try:
            wait_until(lambda: conn.execute(pins).fetchone() == (0, 0), timeout,
                       "no pin held once every session ended")
        except AssertionError:
            groups, images = conn.execute(pins).fetchone()
            raise AssertionError(
                f"{groups} group pin(s) and {images} image pin(s) are still held {timeout:.0f} s"
                " after every other session ended: a read did not release its pins") from None
