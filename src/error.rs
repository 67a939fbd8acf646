//! Errors at the SQL edge: every failure a user can cause becomes a PostgreSQL ERROR with a
//! proper SQLSTATE, a message that says what happened, and a hint that says what to do.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// An ERROR about to be raised.
pub struct Raise {
    report: ErrorReport,
}

/// Starts an ERROR with `code` and `message`.
pub fn error(code: PgSqlErrorCode, message: impl Into<String>) -> Raise {
    Raise {
        report: ErrorReport::new(code, message.into(), "gsnap"),
    }
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

    /// Raises the ERROR; control does not return.
    pub fn raise(self) -> ! {
        self.report.report(PgLogLevel::ERROR);
        unreachable!("an ERROR does not return")
    }
}
