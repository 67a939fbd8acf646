//! PostgreSQL 15's heap tuple header and varlena headers, named once, read and written over
//! plain byte slices.
//!
//! A view keeps PostgreSQL's heap tuples (see [`crate::view`]), so the extension reads their
//! header in several places: the capture normalizes it, the AS OF scan checks it for
//! out-of-line values, the decoder reads the attribute count and rewrites TOAST pointers.
//! This module is the one place that knows where those fields are. The layout is
//! `HeapTupleHeaderData` of `access/htup_details.h` and the varlena macros of `postgres.h`
//! (PostgreSQL 15; later versions moved the latter to `varatt.h`):
//!
//! ```text
//! offset  0  t_xmin       u32   \
//!         4  t_xmax       u32    | transaction ids, command id and ctid:
//!         8  t_cid/t_xvac u32    | zeroed by normalize()
//!        12  t_ctid       6 B   /
//!        18  t_infomask2  u16   attribute count (low 11 bits) and HOT flags
//!        20  t_infomask   u16   layout bits (nulls, varwidth, external) and visibility bits
//!        22  t_hoff       u8    offset of the user data
//!        23  t_bits ...         null bitmap, if HEAP_HASNULL
//! ```
//!
//! Multi-byte fields are read as little-endian: PostgreSQL writes them in the machine's
//! order, and gsnap supports little-endian machines only (the varlena header tests below,
//! `0x01` for an external value, are the little-endian ones of `postgres.h`).
//!
//! Invariants: no function here panics or reads out of bounds on any input; a slice too short
//! for what it must hold is an error (or `false` for the yes/no questions), never a guess.

use crate::FormatError;

/// Bytes of the transaction ids, command id and ctid at the start of the header (`t_choice`
/// and `t_ctid`), which depend on who wrote the tuple, not on its contents.
pub const HEADER_IDS_LEN: usize = 18;
/// Offset of `t_infomask2`.
pub const INFOMASK2_AT: usize = 18;
/// Offset of `t_infomask`.
pub const INFOMASK_AT: usize = 20;
/// Offset of `t_hoff`.
pub const HOFF_AT: usize = 22;
/// Size of the fixed header (`SizeofHeapTupleHeader`): no heap tuple is shorter.
pub const MIN_HEADER_LEN: usize = 23;

/// `t_infomask2`: the number of attributes.
pub const HEAP_NATTS_MASK: u16 = 0x07FF;
/// `t_infomask`: the tuple has a null bitmap.
pub const HEAP_HASNULL: u16 = 0x0001;
/// `t_infomask`: the tuple has variable-width attributes.
pub const HEAP_HASVARWIDTH: u16 = 0x0002;
/// `t_infomask`: the tuple has out-of-line (TOAST pointer) attributes.
pub const HEAP_HASEXTERNAL: u16 = 0x0004;
/// The `t_infomask` bits that describe the tuple's layout: the only ones a view keeps.
pub const LAYOUT_BITS: u16 = HEAP_HASNULL | HEAP_HASVARWIDTH | HEAP_HASEXTERNAL;

/// `vartag_external`: a pointer to a varlena in memory.
pub const VARTAG_INDIRECT: u8 = 1;
/// `vartag_external`: a read-only expanded object in memory.
pub const VARTAG_EXPANDED_RO: u8 = 2;
/// `vartag_external`: a read-write expanded object in memory.
pub const VARTAG_EXPANDED_RW: u8 = 3;
/// `vartag_external`: a value in a TOAST table (the only external kind found on disk).
pub const VARTAG_ONDISK: u8 = 18;
/// Header of an external varlena (`VARHDRSZ_EXTERNAL`): the `0x01` byte and the tag.
pub const VARHDRSZ_EXTERNAL: usize = 2;
/// Size of an on-disk TOAST pointer: the header and `varatt_external` (`va_rawsize`,
/// `va_extinfo`, `va_valueid`, `va_toastrelid`, four bytes each).
pub const TOAST_POINTER_LEN: usize = VARHDRSZ_EXTERNAL + 16;
/// Offset in an on-disk TOAST pointer of the 8-byte id gsnap writes over `va_valueid` and
/// `va_toastrelid` when it copies the value into its store (`va_rawsize` and `va_extinfo`
/// keep PostgreSQL's meaning).
pub const TOAST_ID_AT: usize = VARHDRSZ_EXTERNAL + 8;

/// The fixed header of `tuple`, or an error if the tuple is shorter than it.
fn fixed_header(tuple: &[u8]) -> Result<&[u8], FormatError> {
    tuple.get(..MIN_HEADER_LEN).ok_or_else(|| {
        FormatError::corrupt(format!(
            "a heap tuple of {} bytes is shorter than its {MIN_HEADER_LEN}-byte header",
            tuple.len()
        ))
    })
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// `t_infomask2` of a heap tuple.
pub fn infomask2(tuple: &[u8]) -> Result<u16, FormatError> {
    Ok(u16_at(fixed_header(tuple)?, INFOMASK2_AT))
}

/// `t_infomask` of a heap tuple.
pub fn infomask(tuple: &[u8]) -> Result<u16, FormatError> {
    Ok(u16_at(fixed_header(tuple)?, INFOMASK_AT))
}

/// `t_hoff` of a heap tuple: where its user data starts.
pub fn hoff(tuple: &[u8]) -> Result<u8, FormatError> {
    Ok(fixed_header(tuple)?[HOFF_AT])
}

/// The number of attributes the tuple holds (`HeapTupleHeaderGetNatts`); a tuple written
/// before columns were added holds fewer than its row type has.
pub fn natts(tuple: &[u8]) -> Result<u16, FormatError> {
    Ok(infomask2(tuple)? & HEAP_NATTS_MASK)
}

/// True if the tuple has out-of-line attributes (`HeapTupleHeaderHasExternal`); false for a
/// slice too short to be a tuple.
pub fn has_external(tuple: &[u8]) -> bool {
    infomask(tuple).is_ok_and(|m| m & HEAP_HASEXTERNAL != 0)
}

/// Makes the header depend only on the tuple's contents: zeroes the transaction ids, command
/// id and ctid, keeps only the attribute count in `t_infomask2` and only [`LAYOUT_BITS`] in
/// `t_infomask`. `t_hoff` and everything after the header are left alone. Idempotent.
pub fn normalize(tuple: &mut [u8]) -> Result<(), FormatError> {
    fixed_header(tuple)?;
    tuple[..HEADER_IDS_LEN].fill(0);
    let m2 = u16_at(tuple, INFOMASK2_AT) & HEAP_NATTS_MASK;
    tuple[INFOMASK2_AT..INFOMASK2_AT + 2].copy_from_slice(&m2.to_le_bytes());
    let m = u16_at(tuple, INFOMASK_AT) & LAYOUT_BITS;
    tuple[INFOMASK_AT..INFOMASK_AT + 2].copy_from_slice(&m.to_le_bytes());
    Ok(())
}

/// `t_infomask`: no transaction deleted or locked the tuple (`HEAP_XMAX_INVALID`).
pub const HEAP_XMAX_INVALID: u16 = 0x0800;

/// Makes a stored tuple one that transaction `xid`, command `cid`, inserted at `(block, lp)`
/// of a new relation, as `heap_insert` leaves it: [`normalize`]d (no hint bits, no update
/// chain), then `t_xmin = xid`, `t_xmax = 0` with [`HEAP_XMAX_INVALID`], `t_cid = cid` and
/// `t_ctid` pointing at itself. Contents and layout bits are left alone.
pub fn stamp_inserted(
    tuple: &mut [u8],
    xid: u32,
    cid: u32,
    (block, lp): (u32, u16),
) -> Result<(), FormatError> {
    normalize(tuple)?;
    tuple[0..4].copy_from_slice(&xid.to_le_bytes());
    tuple[8..12].copy_from_slice(&cid.to_le_bytes());
    // ItemPointerData: the block as two 16-bit halves (high first), then the line pointer.
    tuple[12..14].copy_from_slice(&((block >> 16) as u16).to_le_bytes());
    tuple[14..16].copy_from_slice(&(block as u16).to_le_bytes());
    tuple[16..18].copy_from_slice(&lp.to_le_bytes());
    let m = u16_at(tuple, INFOMASK_AT) | HEAP_XMAX_INVALID;
    tuple[INFOMASK_AT..INFOMASK_AT + 2].copy_from_slice(&m.to_le_bytes());
    Ok(())
}

/// True if [`normalize`] would leave the tuple unchanged (every tuple of a view is).
pub fn is_normalized(tuple: &[u8]) -> bool {
    fixed_header(tuple).is_ok_and(|h| {
        h[..HEADER_IDS_LEN].iter().all(|&b| b == 0)
            && u16_at(h, INFOMASK2_AT) & !HEAP_NATTS_MASK == 0
            && u16_at(h, INFOMASK_AT) & !LAYOUT_BITS == 0
    })
}

/// How many bytes of a varlena whose first byte is `first` tell its size: 2 for an external
/// value (the `0x01` byte and its tag), 1 for a short (1-byte header) one, 4 otherwise.
pub fn varlena_header_len(first: u8) -> usize {
    if first == 0x01 {
        VARHDRSZ_EXTERNAL
    } else if first & 0x01 == 0x01 {
        1
    } else {
        4
    }
}

/// `VARSIZE_ANY`: the total size, header included, of the varlena starting at `bytes[0]`.
/// Only the header must be in `bytes` (see [`varlena`] for the whole value). Errors: a
/// truncated header, an unknown external tag, a 4-byte header smaller than itself (a pad byte,
/// not a varlena).
pub fn varsize_any(bytes: &[u8]) -> Result<usize, FormatError> {
    let first = *bytes
        .first()
        .ok_or_else(|| FormatError::corrupt("a varlena is empty"))?;
    let header = bytes.get(..varlena_header_len(first)).ok_or_else(|| {
        FormatError::corrupt(format!(
            "a varlena header is truncated at {} bytes",
            bytes.len()
        ))
    })?;
    match header.len() {
        VARHDRSZ_EXTERNAL => {
            let payload = match header[1] {
                VARTAG_INDIRECT | VARTAG_EXPANDED_RO | VARTAG_EXPANDED_RW => {
                    std::mem::size_of::<usize>()
                }
                VARTAG_ONDISK => TOAST_POINTER_LEN - VARHDRSZ_EXTERNAL,
                tag => {
                    return Err(FormatError::corrupt(format!(
                        "a TOAST pointer has the unknown tag {tag}"
                    )))
                }
            };
            Ok(VARHDRSZ_EXTERNAL + payload)
        }
        1 => Ok(usize::from(first >> 1)),
        _ => {
            let word = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
            let size = (word >> 2) as usize;
            if size < 4 {
                return Err(FormatError::corrupt(format!(
                    "a varlena claims {size} bytes, less than its 4-byte header"
                )));
            }
            Ok(size)
        }
    }
}

/// The varlena starting at `bytes[0]`, header included, checked to fit in `bytes`.
pub fn varlena(bytes: &[u8]) -> Result<&[u8], FormatError> {
    let size = varsize_any(bytes)?;
    bytes.get(..size).ok_or_else(|| {
        FormatError::corrupt(format!(
            "a varlena of {size} bytes is truncated at {} bytes",
            bytes.len()
        ))
    })
}

/// True if `bytes` starts with an on-disk TOAST pointer (`VARATT_IS_EXTERNAL_ONDISK`).
pub fn is_toast_pointer(bytes: &[u8]) -> bool {
    matches!(bytes, [0x01, VARTAG_ONDISK, ..])
}

/// The id gsnap stored in the TOAST pointer starting at `bytes[0]` (see [`TOAST_ID_AT`]);
/// `None` if `bytes` does not start with an on-disk TOAST pointer.
pub fn toast_id(bytes: &[u8]) -> Result<Option<u64>, FormatError> {
    if !is_toast_pointer(bytes) {
        return Ok(None);
    }
    let id = toast_pointer(bytes)?[TOAST_ID_AT..TOAST_ID_AT + 8]
        .try_into()
        .expect("8 bytes");
    Ok(Some(u64::from_le_bytes(id)))
}

/// Writes `id` into the on-disk TOAST pointer starting at `bytes[0]` (the capture does, once
/// it stored the value).
pub fn set_toast_id(bytes: &mut [u8], id: u64) -> Result<(), FormatError> {
    if !is_toast_pointer(bytes) {
        return Err(FormatError::corrupt(
            "a TOAST id was to be written over a value that is not an on-disk TOAST pointer",
        ));
    }
    toast_pointer(bytes)?;
    bytes[TOAST_ID_AT..TOAST_ID_AT + 8].copy_from_slice(&id.to_le_bytes());
    Ok(())
}

fn toast_pointer(bytes: &[u8]) -> Result<&[u8], FormatError> {
    bytes.get(..TOAST_POINTER_LEN).ok_or_else(|| {
        FormatError::corrupt(format!(
            "a TOAST pointer is truncated at {} bytes",
            bytes.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A tuple as a heap page holds it: ids set, HOT and visibility bits set; 3 attributes:
    /// an int4 42, a text 'abcd' (short varlena) and a NULL.
    fn page_tuple() -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&1234u32.to_le_bytes()); // xmin
        t.extend_from_slice(&5678u32.to_le_bytes()); // xmax
        t.extend_from_slice(&7u32.to_le_bytes()); // cid
        t.extend_from_slice(&[0, 0, 9, 0, 4, 0]); // ctid (9,4)
        t.extend_from_slice(&(0x4000u16 | 0x2000 | 3).to_le_bytes()); // HOT updated, 3 atts
        t.extend_from_slice(&(0x0900u16 | HEAP_HASNULL | HEAP_HASVARWIDTH).to_le_bytes());
        t.push(24); // t_hoff
        t.push(0b011); // null bitmap: attributes 1 and 2 are not null
        t.extend_from_slice(&[42, 0, 0, 0, 0x0b, b'a', b'b', b'c', b'd']);
        t
    }

    #[test]
    fn reads_the_header_fields() {
        let t = page_tuple();
        assert_eq!(natts(&t), Ok(3));
        assert_eq!(infomask2(&t), Ok(0x6003));
        assert_eq!(infomask(&t), Ok(0x0903));
        assert_eq!(hoff(&t), Ok(24));
        assert!(!has_external(&t));
        let mut e = t.clone();
        e[INFOMASK_AT] |= HEAP_HASEXTERNAL as u8;
        assert!(has_external(&e));
    }

    #[test]
    fn stamp_inserted_makes_a_fresh_insert_of_the_same_contents() {
        let mut t = page_tuple();
        stamp_inserted(&mut t, 0xA0B0C0D, 3, (0x0002_0005, 17)).unwrap();
        assert_eq!(&t[0..4], &0xA0B0C0Du32.to_le_bytes()); // xmin
        assert_eq!(&t[4..8], &[0; 4]); // xmax
        assert_eq!(&t[8..12], &3u32.to_le_bytes()); // cid
        assert_eq!(&t[12..18], &[2, 0, 5, 0, 17, 0]); // ctid (0x20005, 17): high half first
        assert_eq!(
            infomask2(&t),
            Ok(3),
            "HOT bits cleared, attribute count kept"
        );
        assert_eq!(
            infomask(&t),
            Ok(HEAP_XMAX_INVALID | HEAP_HASNULL | HEAP_HASVARWIDTH),
            "visibility hints cleared, layout bits kept"
        );
        assert_eq!(
            &t[HOFF_AT..],
            &page_tuple()[HOFF_AT..],
            "contents untouched"
        );
        assert!(stamp_inserted(&mut [0u8; 22], 1, 0, (0, 1)).is_err());
    }

    #[test]
    fn normalize_keeps_only_the_contents() {
        let mut t = page_tuple();
        assert!(!is_normalized(&t));
        normalize(&mut t).unwrap();
        assert!(is_normalized(&t));
        assert_eq!(&t[..HEADER_IDS_LEN], &[0; HEADER_IDS_LEN]);
        assert_eq!(natts(&t), Ok(3));
        assert_eq!(infomask2(&t), Ok(3));
        assert_eq!(infomask(&t), Ok(HEAP_HASNULL | HEAP_HASVARWIDTH));
        assert_eq!(&t[HOFF_AT..], &page_tuple()[HOFF_AT..]);
        // The same row written by another transaction, frozen and hinted: the same bytes.
        let mut other = page_tuple();
        other[0..4].copy_from_slice(&2u32.to_le_bytes());
        other[INFOMASK_AT + 1] = 0x03; // XMIN_FROZEN
        normalize(&mut other).unwrap();
        assert_eq!(other, t);
    }

    #[test]
    fn short_tuples_are_errors() {
        let t = page_tuple();
        for len in 0..MIN_HEADER_LEN {
            let mut s = t[..len].to_vec();
            assert!(natts(&s).is_err());
            assert!(hoff(&s).is_err());
            assert!(!has_external(&s));
            assert!(!is_normalized(&s));
            assert!(normalize(&mut s).is_err());
            assert_eq!(s, t[..len], "an error leaves the bytes alone");
        }
        assert!(natts(&t[..MIN_HEADER_LEN]).is_ok());
    }

    #[test]
    fn varlena_sizes() {
        // short: header 0x0b = size 5 (1 header byte + "abcd")
        assert_eq!(varsize_any(&[0x0b, b'a', b'b', b'c', b'd']), Ok(5));
        assert_eq!(varsize_any(&[0x0b]), Ok(5), "only the header is needed");
        assert!(varlena(&[0x0b, b'a']).is_err());
        assert_eq!(varlena(&[0x0b, 1, 2, 3, 4, 5]), Ok(&[0x0b, 1, 2, 3, 4][..]));
        assert_eq!(varsize_any(&[0x03]), Ok(1), "an empty short varlena");
        // 4-byte: 300 bytes, plain and compressed (bit 0x02)
        let plain = (300u32 << 2).to_le_bytes();
        assert_eq!(varsize_any(&plain), Ok(300));
        let compressed = ((300u32 << 2) | 0x02).to_le_bytes();
        assert_eq!(varsize_any(&compressed), Ok(300));
        assert!(varsize_any(&plain[..3]).is_err());
        assert!(
            varsize_any(&[0, 0, 0, 0]).is_err(),
            "a pad byte is not a varlena"
        );
        assert!(varsize_any(&[]).is_err());
        // external
        assert_eq!(varsize_any(&[0x01, VARTAG_ONDISK]), Ok(TOAST_POINTER_LEN));
        assert_eq!(varsize_any(&[0x01, VARTAG_INDIRECT]), Ok(2 + 8));
        assert_eq!(varsize_any(&[0x01, VARTAG_EXPANDED_RW]), Ok(2 + 8));
        assert!(varsize_any(&[0x01, 7]).is_err());
        assert!(varsize_any(&[0x01]).is_err());
    }

    #[test]
    fn toast_pointers() {
        let mut p = vec![0x01, VARTAG_ONDISK];
        p.extend_from_slice(&5000i32.to_le_bytes()); // va_rawsize
        p.extend_from_slice(&4000u32.to_le_bytes()); // va_extinfo
        p.extend_from_slice(&16390u32.to_le_bytes()); // va_valueid
        p.extend_from_slice(&16388u32.to_le_bytes()); // va_toastrelid
        assert_eq!(p.len(), TOAST_POINTER_LEN);
        assert!(is_toast_pointer(&p));
        assert_eq!(toast_id(&p), Ok(Some((16388u64 << 32) | 16390)));
        set_toast_id(&mut p, 0x0102_0304_0506_0708).unwrap();
        assert_eq!(toast_id(&p), Ok(Some(0x0102_0304_0506_0708)));
        assert_eq!(&p[2..6], &5000i32.to_le_bytes(), "va_rawsize is kept");
        assert_eq!(&p[6..10], &4000u32.to_le_bytes(), "va_extinfo is kept");
        assert!(toast_id(&p[..17]).is_err());
        assert!(set_toast_id(&mut p[..17], 1).is_err());
        assert_eq!(toast_id(&[0x0b, b'a', b'b', b'c', b'd']), Ok(None));
        assert_eq!(toast_id(&[0x01, VARTAG_INDIRECT, 0, 0]), Ok(None));
        assert!(set_toast_id(&mut [0x0b, 1, 2, 3, 4], 1).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..64), id in any::<u64>()) {
            let _ = (natts(&bytes), infomask(&bytes), infomask2(&bytes), hoff(&bytes));
            let _ = (has_external(&bytes), is_normalized(&bytes), is_toast_pointer(&bytes));
            let _ = (varsize_any(&bytes), varlena(&bytes), toast_id(&bytes));
            if let Ok(size) = varsize_any(&bytes) {
                prop_assert!(size >= 1);
            }
            if let Ok(v) = varlena(&bytes) {
                prop_assert_eq!(v.len(), varsize_any(&bytes).unwrap());
            }
            let before = bytes.clone();
            if set_toast_id(&mut bytes, id).is_ok() {
                prop_assert_eq!(toast_id(&bytes), Ok(Some(id)));
                prop_assert_eq!(&bytes[..TOAST_ID_AT], &before[..TOAST_ID_AT]);
                prop_assert_eq!(&bytes[TOAST_ID_AT + 8..], &before[TOAST_ID_AT + 8..]);
            } else {
                prop_assert_eq!(&bytes, &before);
            }
            let _ = normalize(&mut bytes);
        }

        #[test]
        fn normalize_is_idempotent_and_keeps_the_layout(mut bytes in proptest::collection::vec(any::<u8>(), 23..64)) {
            let before = bytes.clone();
            normalize(&mut bytes).unwrap();
            prop_assert!(is_normalized(&bytes));
            prop_assert_eq!(natts(&bytes), natts(&before));
            prop_assert_eq!(infomask(&bytes).unwrap(), infomask(&before).unwrap() & LAYOUT_BITS);
            prop_assert_eq!(has_external(&bytes), has_external(&before));
            prop_assert_eq!(&bytes[HOFF_AT..], &before[HOFF_AT..]);
            let once = bytes.clone();
            normalize(&mut bytes).unwrap();
            prop_assert_eq!(bytes, once);
        }
    }
}
