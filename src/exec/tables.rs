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
    // SAFETY: PostgreSQL's query descriptor; after the standard start, its executor state has
    // the range table of the plan.
    unsafe {
        match PREV_EXECUTOR_START {
            Some(prev) => prev(query, eflags),
            None => pg_sys::standard_ExecutorStart(query, eflags),
        }
        if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
            return;
        }
        let estate = (*query).estate;
        if estate.is_null() {
            return;
        }
        for (i, rte) in list::iter::<pg_sys::RangeTblEntry>((*estate).es_range_table).enumerate() {
            if is_read_entry(rte) {
                pg_sys::ExecGetRangeTableRelation(estate, i as pg_sys::Index + 1);
            }
        }
    }
}
