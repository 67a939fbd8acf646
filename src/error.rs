//! Errors at the SQL edge: every failure a user can cause becomes a PostgreSQL ERROR with a
//! proper SQLSTATE, a message that says what happened, and a hint that says what to do.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// An ERROR about to be raised (or a NOTICE about to be sent).
pub struct Raise {
    report: ErrorReport,
}

/// Starts an ERROR with `code` and `message`.
pub fn error(code: PgSqlErrorCode, message: impl Into<String>) -> Raise {
    Raise {
        report: ErrorReport::new(code, message.into(), "gsnap"),
    }
}

/// Starts a NOTICE with `message` (SQLSTATE 00000, as PostgreSQL's own notices); DETAIL and
/// HINT as for an ERROR, then [`Raise::send`].
pub fn notice(message: impl Into<String>) -> Raise {
    error(PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION, message)
}

impl Raise {
    /// Adds a DETAIL line.
    pub fn detail(mut self, detail: impl Into<String>) -> Raise {
        self.report = self.report.set_detail(detail);
        self
    }

    /// Adds a HINT line.
    pub fn hint(mut self, hint: impl Into<String>) -> Raise {
        self.report = self.report.set_hint(hint);
        self
    }

    /// Sends it as a NOTICE (made with [`notice`]) and goes on.
    pub fn send(self) {
        self.report.report(PgLogLevel::NOTICE);
    }

    /// Sends it as a WARNING (made with [`notice`]) and goes on.
    pub fn warn(self) {
        self.report.report(PgLogLevel::WARNING);
    }

    /// Raises the ERROR; control does not return.
    pub fn raise(self) -> ! {
        self.report.report(PgLogLevel::ERROR);
        unreachable!("an ERROR does not return")
    }
}

// ---- the errors several places raise, each written once ------------------------------------

/// A snapshot id that names no snapshot (ids start at 1).
pub fn no_such_snapshot(snap: i64) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snapshot {snap} does not exist"),
    )
    .hint("Snapshot ids start at 1; gsnap_snapshots() lists them.")
    .raise()
}

/// A required argument that is NULL (`what` names it: "the snapshot id of gsnap_asof").
pub fn null_argument(what: &str) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{what} must not be NULL"),
    )
    .raise()
}

/// A table that snapshot `snap` does not hold.
pub fn not_in_snapshot(table: &str, snap: u64) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        format!("table {table} is not in snapshot {snap}"),
    )
    .hint(HINT_TABLES_OF_SNAPSHOT)
    .raise()
}

/// Where to look when a table is not in a snapshot.
pub const HINT_TABLES_OF_SNAPSHOT: &str = "A snapshot holds the tables that used the gsnap \
    access method when it was taken; see gsnap_snapshot_tables().";

/// Stored data that failed its checks (a page view, a row type, an index group, a missing
/// image): corruption, XX001.
pub fn corrupt(what: impl std::fmt::Display) -> ! {
    error(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, what.to_string()).raise()
}

/// The snapshot index (a group in the shared cache) failed its checks.
pub fn corrupt_index(e: gsnap_core::IndexError) -> ! {
    corrupt(format_args!("gsnap snapshot index: {e}"))
}

/// Keeps Rust backtraces out of the ERRORs clients see. pgrx attaches a backtrace to the
/// DETAIL of an error that crosses a nested FFI boundary whenever backtraces are enabled, and
/// a server started with `RUST_BACKTRACE=1` in its environment (common on Rust developers'
/// machines) would show one with every gsnap error. So library backtraces are turned off in
/// the postmaster (every server process inherits that), and a genuine panic (a bug, not an
/// ERROR raised on purpose) writes its backtrace to the server log instead.
pub fn keep_backtraces_out_of_errors() {
    // The postmaster loads gsnap before it starts any thread or child process.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    let next = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let deliberate = payload.is::<pgrx::pg_sys::panic::ErrorReportWithLevel>()
            || payload.is::<ErrorReport>()
            || payload.is::<pgrx::pg_sys::panic::CaughtError>();
        if !deliberate {
            eprintln!(
                "gsnap: Rust panic at {}: {}",
                info.location().map(|l| l.to_string()).unwrap_or_default(),
                std::backtrace::Backtrace::force_capture()
            );
        }
        next(info)
    }));
}
