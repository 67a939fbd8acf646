//! Out-of-line values of snapshots: the views name them by gsnap TOAST pointers (see
//! `worker/page.rs`), and they are fetched from the store chunk by chunk through the image
//! cache; they never reach PostgreSQL as TOAST pointers.

use crate::error::corrupt;
use crate::ipc::{self, ToastChunks};
use pgrx::pg_sys;

/// Chunks asked for per request.
const CHUNKS_PER_REQUEST: u32 = 64;

/// Fetches stored value `id` into a palloc'd varlena (possibly compressed, as PostgreSQL
/// stored it) in the current memory context.
pub fn fetch(id: u64) -> pg_sys::Datum {
    let mut value: Vec<u8> = Vec::new();
    let mut total = None;
    let mut next_chunk = 0u32;
    loop {
        let ToastChunks {
            chunks,
            len,
            pinned,
        } = ipc::toast_fetch(id, next_chunk, CHUNKS_PER_REQUEST);
        let len = *total.get_or_insert(len as usize);
        if pinned.entries.is_empty() && next_chunk < chunks {
            // The cache had no room for any chunk: let other readers move on.
            drop(pinned);
            ipc::wait_latch(std::time::Duration::from_millis(5));
            continue;
        }
        for e in &pinned.entries {
            let bytes = pinned.bytes(e);
            if value.len() + bytes.len() > len {
                corrupt(format_args!(
                    "stored TOAST value {id} is longer than recorded"
                ));
            }
            value.extend_from_slice(bytes);
            next_chunk = e.key + 1;
        }
        if next_chunk >= chunks {
            break;
        }
    }
    if value.len() != total.unwrap_or(0) {
        corrupt(format_args!("stored TOAST value {id} is incomplete"));
    }
    // SAFETY: an allocation of the value's length in the current memory context, filled
    // completely.
    unsafe {
        let out = pg_sys::palloc(value.len().max(1)).cast::<u8>();
        std::ptr::copy_nonoverlapping(value.as_ptr(), out, value.len());
        pg_sys::Datum::from(out)
    }
}
