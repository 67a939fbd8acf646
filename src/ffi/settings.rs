//! Settings in force for a stretch of code, as a function's `SET` clause puts them in force
//! for its body.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Runs `f` with each `(name, value)` of `settings` in force, then puts the values before back.
/// If `f` raises an ERROR, the (sub)transaction's abort puts them back, as it does for a
/// function's `SET` clause (the same GUC nesting level mechanism).
pub fn with_settings<R>(settings: &[(&CStr, &CStr)], f: impl FnOnce() -> R) -> R {
    // SAFETY: a new nesting level of the settings, closed below or by the abort.
    let level = unsafe { pg_sys::NewGUCNestLevel() };
    for (name, value) in settings {
        // SAFETY: valid C strings; saved at `level` (GUC_ACTION_SAVE), so closing the level
        // restores the value before. An unknown name or bad value is an ERROR.
        unsafe {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            )
        };
    }
    let r = f();
    // SAFETY: the level opened above, still the innermost (f closed whatever it opened).
    unsafe { pg_sys::AtEOXact_GUC(true, level) };
    r
}

/// A time given in microseconds since the Unix epoch, printed as PostgreSQL prints a
/// `timestamptz` in ISO style in the session's `TimeZone`, for messages.
pub fn timestamptz_text(unix_us: i64) -> String {
    let pg_us = unix_us.saturating_sub(crate::worker::UNIX_TO_PG_EPOCH_US);
    // SAFETY: formats into a static buffer of PostgreSQL's, copied at once.
    unsafe {
        super::catalog::string_from(pg_sys::timestamptz_to_str(pg_sys::TimestampTz::from(pg_us)))
    }
}
