"""The test harness's own checks: the crash guard every test runs under (tests/conftest.py,
`Cluster.unexpected_crashes`) and the option to keep core files (GSNAP_TEST_CORES=1).

A backend that crashes while a test expects its statement to fail looks, to the test, like
an error it expected (a lost connection is a psycopg.Error), and the server comes back by
itself: without the guard such a crash passes unseen."""

import os
import signal
import threading
from pathlib import Path

import psycopg
import pytest

from cluster import Cluster, wait_until


def back_up(c: Cluster) -> bool:
    try:
        with c.connect(connect_timeout=3) as conn:
            return conn.execute("SELECT 1").fetchone()[0] == 1
    except psycopg.OperationalError:
        return False


def lose_a_backend(c: Cluster, send) -> None:
    """A statement whose backend `send(pid, SIGSEGV)` kills while it runs; returns once the
    server has restarted."""
    with c.connect() as victim:
        pid = victim.info.backend_pid
        threading.Timer(0.3, send, (pid, signal.SIGSEGV)).start()
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT pg_sleep(10) AS the_statement_that_crashed")
    wait_until(lambda: back_up(c), 60, "the server to restart after the crash")
    # the postmaster logs the reinitialization before it accepts connections again
    wait_until(lambda: "reinitializing" in c.log(), 10, "the restart in the log")


@pytest.fixture(scope="module")
def guarded():
    c = Cluster("guard").start()
    yield c
    if c.data.exists():
        c.destroy()


def test_a_crash_no_test_asked_for_is_reported(guarded):
    """A backend killed by SIGSEGV (as a bug would) is reported with the statement it ran, even
    though the client saw only the OperationalError a test may expect; once reported, it is
    not reported again, and the cluster's directory is kept for a look at it."""
    lose_a_backend(guarded, os.kill)
    crashes = guarded.unexpected_crashes()
    text = "\n".join(crashes)
    assert "terminated by signal 11" in text, text
    assert "the_statement_that_crashed" in text, text
    assert "all server processes terminated; reinitializing" in text, text
    assert guarded.unexpected_crashes() == []
    assert guarded.crashed


def test_a_death_a_test_caused_is_not_a_crash(guarded):
    """The same death, sent through Cluster.kill, is the test's own doing: nothing reported,
    and a crash after it is reported again."""
    guarded.unexpected_crashes()
    lose_a_backend(guarded, guarded.kill)
    assert guarded.unexpected_crashes() == []
    assert guarded.expected_deaths == []
    lose_a_backend(guarded, os.kill)
    assert any("terminated by signal 11" in line for line in guarded.unexpected_crashes())


def test_a_crashed_cluster_is_kept_and_fails_whoever_destroys_it(guarded):
    """destroy() keeps the directory of a cluster that crashed (its log, core files), and
    fails when the crash was not reported before."""
    lose_a_backend(guarded, os.kill)
    with pytest.raises(AssertionError, match="terminated by signal 11"):
        guarded.destroy()
    assert (guarded.data / "server.log").exists()
    assert guarded not in Cluster.live
    os.system(f"rm -rf {guarded.base}")


def test_cores_can_be_kept(monkeypatch):
    """GSNAP_TEST_CORES=1 starts servers that may write core files of any size; by default they
    write none (the suite's clusters would fill the disk with them)."""
    def core_limit(c: Cluster) -> str:
        limits = Path(f"/proc/{c.postmaster_pid()}/limits").read_text().splitlines()
        return next(line for line in limits if line.startswith("Max core file size")).split()[4]

    c = Cluster("cores").start()
    try:
        assert core_limit(c) == "0"
        c.stop()
        monkeypatch.setenv("GSNAP_TEST_CORES", "1")
        c.start()
        assert core_limit(c) == "unlimited"
    finally:
        c.destroy()
