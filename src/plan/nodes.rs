//! The custom scan plan nodes: "gsnap AS OF" (`FROM gsnap_asof(NULL::t, id or time)`) and
//! "gsnap range" (`FROM gsnap_range(NULL::t, from, to)`), built from the paths of
//! `paths.rs`, and the one place that knows the layout of their private lists.
//!
//! A node's `custom_private` is [`ScanPlan`]: the table, the kind of scan, and the table's
//! row type as planned (checked again at executor start). Its `custom_exprs` are the snapshot
//! arguments and, for a range, the conditions on `rec` alone (its Row Filter).

use crate::ffi::list::{self, int_node, list_of};
use crate::ffi::relation::OpenRelation;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::c_void;
use std::sync::OnceLock;

/// What a scan reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ScanKind {
    /// `gsnap_asof(NULL::t, snapshot id)`.
    AsofId = 0,
    /// `gsnap_asof(NULL::t, time)`: the latest snapshot at or before it.
    AsofTime = 1,
    /// `gsnap_range(NULL::t, from, to)`.
    Range = 2,
}

impl ScanKind {
    fn from_i32(v: i32) -> ScanKind {
        match v {
            0 => ScanKind::AsofId,
            1 => ScanKind::AsofTime,
            _ => ScanKind::Range,
        }
    }

    /// The snapshot arguments (after the table's `NULL::t`).
    pub fn snapshot_args(self) -> usize {
        if self == ScanKind::Range {
            2
        } else {
            1
        }
    }

    /// The name EXPLAIN shows.
    fn name(self) -> &'static std::ffi::CStr {
        if self == ScanKind::Range {
            c"gsnap range"
        } else {
            c"gsnap AS OF"
        }
    }
}

/// A scan node's private list, decoded.
pub struct ScanPlan {
    pub relid: pg_sys::Oid,
    pub kind: ScanKind,
    /// The table's row type when the plan was made (see [`row_type_signature`]).
    pub signature: *mut pg_sys::List,
}

impl ScanPlan {
    /// Encodes the private list (in the current memory context).
    pub fn encode(&self) -> *mut pg_sys::List {
        list_of(&[
            int_node(self.relid.to_u32() as i32),
            int_node(self.kind as i32),
            self.signature.cast(),
        ])
    }

    /// Decodes a private list made by [`ScanPlan::encode`].
    ///
    /// # Safety
    /// `private` is the `custom_private` of one of gsnap's scan nodes.
    pub unsafe fn decode(private: *mut pg_sys::List) -> ScanPlan {
        // SAFETY: the layout written by `encode`.
        unsafe {
            ScanPlan {
                relid: pg_sys::Oid::from(list::int_at(private, 0) as u32),
                kind: ScanKind::from_i32(list::int_at(private, 1)),
                signature: list::nth(private, 2),
            }
        }
    }
}

/// The row type of a table as a plan records it: the number of attributes, then each
/// attribute's type (0 for a dropped one) and type modifier.
pub fn row_type_signature(rel: &OpenRelation) -> *mut pg_sys::List {
    let desc = rel.descriptor();
    // SAFETY: an open relation's descriptor is valid.
    let attrs = unsafe { (*desc).attrs.as_slice((*desc).natts as usize) };
    let mut items = vec![int_node(attrs.len() as i32)];
    for a in attrs {
        let type_ = if a.attisdropped {
            0
        } else {
            a.atttypid.to_u32()
        };
        items.push(int_node(type_ as i32));
        items.push(int_node(a.atttypmod));
    }
    list_of(&items)
}

/// True if `rel` has the row type `signature` recorded.
///
/// # Safety
/// `signature` was made by [`row_type_signature`].
pub unsafe fn same_row_type(signature: *mut pg_sys::List, rel: &OpenRelation) -> bool {
    let now = row_type_signature(rel);
    // SAFETY: both are lists of Integer nodes.
    unsafe { pg_sys::equal(signature.cast(), now.cast()) }
}

/// The methods tables PostgreSQL calls the plans through (they live for the process).
struct Methods {
    path: pg_sys::CustomPathMethods,
    scan: pg_sys::CustomScanMethods,
}

// SAFETY: immutable after construction; only C string pointers to statics and functions.
unsafe impl Sync for Methods {}
// SAFETY: as above.
unsafe impl Send for Methods {}

static METHODS: OnceLock<[Methods; 2]> = OnceLock::new();

fn methods(kind: ScanKind) -> &'static Methods {
    let all = METHODS.get_or_init(|| {
        [ScanKind::AsofId, ScanKind::Range].map(|k| Methods {
            path: pg_sys::CustomPathMethods {
                CustomName: k.name().as_ptr(),
                PlanCustomPath: Some(plan_path),
                ReparameterizeCustomPathByChild: None,
            },
            scan: pg_sys::CustomScanMethods {
                CustomName: k.name().as_ptr(),
                CreateCustomScanState: Some(crate::exec::create_state),
            },
        })
    });
    &all[usize::from(kind == ScanKind::Range)]
}

/// The path methods of a scan of `kind`.
pub fn path_methods(kind: ScanKind) -> &'static pg_sys::CustomPathMethods {
    &methods(kind).path
}

/// Registers the scan methods (so plans can be copied and read back by name).
pub fn register() {
    for kind in [ScanKind::AsofId, ScanKind::Range] {
        // SAFETY: _PG_init; the methods live for the process.
        unsafe { pg_sys::RegisterCustomScanMethods(&methods(kind).scan) };
    }
}

/// A target entry for a Var of range-table entry `rti`.
///
/// # Safety
/// In the planner's memory context.
unsafe fn var_entry(
    rti: i32,
    attno: i16,
    type_: pg_sys::Oid,
    typmod: i32,
    collation: pg_sys::Oid,
    resno: i16,
    name: *const std::ffi::c_char,
) -> *mut c_void {
    // SAFETY: node constructors allocating in the current context.
    unsafe {
        let var = pg_sys::makeVar(rti, attno, type_, typmod, collation, 0);
        pg_sys::makeTargetEntry(var.cast(), resno, pg_sys::pstrdup(name), false).cast()
    }
}

/// Builds the plan node of one of our paths. The path's private list holds the table, the
/// kind, then the call's snapshot arguments (see `paths.rs`).
#[pg_guard]
unsafe extern "C-unwind" fn plan_path(
    _root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    clauses: *mut pg_sys::List,
    _custom_plans: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: building a plan node from our own path, in the planner's context.
    unsafe {
        let private = (*best_path).custom_private;
        let relid = pg_sys::Oid::from(list::int_at(private, 0) as u32);
        let kind = ScanKind::from_i32(list::int_at(private, 1));
        let args: Vec<*mut c_void> = (0..kind.snapshot_args())
            .map(|i| list::nth(private, 2 + i))
            .collect();
        let table = OpenRelation::open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
            .expect("the planner holds a lock on the table it plans");
        let cscan =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()).cast::<pg_sys::CustomScan>();
        (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        (*cscan).scan.plan.targetlist = tlist;
        (*cscan).scan.scanrelid = 0;
        (*cscan).flags = (*best_path).flags;
        (*cscan).methods = &methods(kind).scan;
        (*cscan).custom_private = ScanPlan {
            relid,
            kind,
            signature: row_type_signature(&table),
        }
        .encode();
        let quals = pg_sys::extract_actual_clauses(clauses, false);
        let rti = (*rel).relid as i32;
        if kind == ScanKind::Range {
            // Conditions on `rec` alone are checked once per row version (in custom_exprs,
            // after the two snapshot arguments); the others once per result row.
            let (mut per_row, mut per_version) = (std::ptr::null_mut(), std::ptr::null_mut());
            for q in list::iter::<c_void>(quals) {
                let mut attrs: *mut pg_sys::Bitmapset = std::ptr::null_mut();
                pg_sys::pull_varattnos(q.cast(), rti as u32, &mut attrs);
                let snap_id = 1 - pg_sys::FirstLowInvalidHeapAttributeNumber;
                if pg_sys::bms_is_member(snap_id, attrs)
                    || pg_sys::contain_volatile_functions(q.cast())
                {
                    per_row = pg_sys::lappend(per_row, q);
                } else {
                    per_version = pg_sys::lappend(per_version, q);
                }
            }
            (*cscan).scan.plan.qual = per_row;
            (*cscan).custom_exprs = list_of(&[args[0], args[1], per_version.cast()]);
            let rec_type = pg_sys::get_rel_type_id(relid);
            (*cscan).custom_scan_tlist = list_of(&[
                var_entry(
                    rti,
                    1,
                    pg_sys::INT8OID,
                    -1,
                    pg_sys::InvalidOid,
                    1,
                    c"snap_id".as_ptr(),
                ),
                var_entry(rti, 2, rec_type, -1, pg_sys::InvalidOid, 2, c"rec".as_ptr()),
            ]);
            return cscan.cast();
        }
        (*cscan).scan.plan.qual = quals;
        (*cscan).custom_exprs = list_of(&args);
        // The scan tuple: the table's live columns, as Vars of this range-table entry.
        let desc = table.descriptor();
        let mut entries = Vec::new();
        for a in (*desc).attrs.as_slice((*desc).natts as usize) {
            if a.attisdropped {
                continue;
            }
            entries.push(var_entry(
                rti,
                a.attnum,
                a.atttypid,
                a.atttypmod,
                a.attcollation,
                entries.len() as i16 + 1,
                a.attname.data.as_ptr(),
            ));
        }
        (*cscan).custom_scan_tlist = list_of(&entries);
        cscan.cast()
    }
}
