//! Every table a query reads over snapshots stays open while the query's executor runs, as
//! a sequential scan keeps its table open: so the same session cannot ALTER, DROP or
//! TRUNCATE it under an open cursor ("... because it is being used by active queries in this
//! session"), whichever way the query reads it (the custom scans, or the set-returning
//! functions, which a function scan only calls at the first fetch).
//!
//! An `ExecutorStart_hook` opens the relation of each range-table entry `plan::deps` added
//! (the table is already locked) through `ExecGetRangeTableRelation`, which records it in the
//! executor state; PostgreSQL closes it with the plan's other relations at executor end (its
//! lock stays until the transaction ends), and an ERROR's abort releases it.

use crate::ffi::list;
use crate::plan::deps::is_read_entry;
use pgrx::pg_sys;
use pgrx::prelude::*;

static mut PREV_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;

/// Installs the hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process before any query is executed.
    unsafe {
        PREV_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn executor_start(query: *mut pg_sys::QueryDesc, eflags: i32) {
    // SAFETY: PostgreSQL's own arguments, passed on to the previous hook or the standard start.
    unsafe {
        match PREV_EXECUTOR_START {
            Some(prev) => prev(query, eflags),
            None => pg_sys::standard_ExecutorStart(query, eflags),
        }
    }
    if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
        return;
    }
    // SAFETY: PostgreSQL's query descriptor, which the standard start gave an executor state.
    let estate = unsafe { (*query).estate };
    if estate.is_null() {
        return;
    }
    // SAFETY: after the standard start the executor state holds the plan's range table.
    let entries = unsafe { list::iter::<pg_sys::RangeTblEntry>((*estate).es_range_table) };
    for (i, rte) in entries.enumerate() {
        // SAFETY: an entry of that range table.
        if unsafe { is_read_entry(rte) } {
            // SAFETY: entry i + 1 names a table (plan::deps locked it); its relation is
            // opened and recorded in the executor state, which closes it at executor end.
            unsafe { pg_sys::ExecGetRangeTableRelation(estate, i as pg_sys::Index + 1) };
        }
    }
}
