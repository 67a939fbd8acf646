//! How the worker says a request failed: a [`WorkerError`] with an [`ErrorCode`] (which picks
//! the SQLSTATE the backend raises), a message, and an optional hint and detail, each its own
//! field on the wire.
//!
//! Invariant: an error answer always fits one message. [`WorkerError::encode`] shortens the
//! texts (at character boundaries) rather than fail, so the worker can always answer.

use crate::wire::{DecodeError, Reader, Writer};
use std::fmt;

/// Why a request failed; each maps to a SQLSTATE ([`ErrorCode::sqlstate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// No such snapshot.
    UnknownSnapshot = 1,
    /// The snapshot exists but cannot be read (failed, deleted).
    NotReadable = 2,
    /// The table is not part of the snapshot.
    NotInSnapshot = 3,
    /// The store could not be read or written.
    Io = 4,
    /// The store's disk is full.
    NoSpace = 5,
    /// The store belongs to another cluster or format version.
    Incompatible = 6,
    /// Stored data failed its checks.
    Corrupt = 7,
    /// The operating system refused access to the store.
    PermissionDenied = 8,
    /// A bad argument.
    InvalidArgument = 9,
    /// The worker exited while working on the request.
    WorkerRestarted = 10,
    /// No snapshot at or before the asked time.
    NoSnapshotAtTime = 11,
    /// Too many snapshots wait for their capture, or a cache cannot hold what is asked.
    Busy = 12,
    /// A bug.
    Internal = 13,
    /// The snapshot is declared and its capture is not durable yet.
    Capturing = 14,
    /// The snapshot is protected from deletion (pinned, or the newest without force).
    Protected = 15,
}

impl ErrorCode {
    /// Every code, in tag order.
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::UnknownSnapshot,
        ErrorCode::NotReadable,
        ErrorCode::NotInSnapshot,
        ErrorCode::Io,
        ErrorCode::NoSpace,
        ErrorCode::Incompatible,
        ErrorCode::Corrupt,
        ErrorCode::PermissionDenied,
        ErrorCode::InvalidArgument,
        ErrorCode::WorkerRestarted,
        ErrorCode::NoSnapshotAtTime,
        ErrorCode::Busy,
        ErrorCode::Internal,
        ErrorCode::Capturing,
        ErrorCode::Protected,
    ];

    /// The code's tag on the wire.
    pub fn tag(self) -> u8 {
        self as u8
    }

    /// The code of a tag.
    pub fn from_tag(tag: u8) -> Result<ErrorCode, DecodeError> {
        ErrorCode::ALL
            .into_iter()
            .find(|c| c.tag() == tag)
            .ok_or(DecodeError::UnknownTag {
                what: "error code",
                tag: u32::from(tag),
            })
    }

    /// The SQLSTATE the backend raises, as its five characters.
    pub fn sqlstate(self) -> &'static str {
        match self {
            // invalid_parameter_value
            ErrorCode::UnknownSnapshot
            | ErrorCode::InvalidArgument
            | ErrorCode::NoSnapshotAtTime => "22023",
            // object_not_in_prerequisite_state
            ErrorCode::NotReadable
            | ErrorCode::Incompatible
            | ErrorCode::WorkerRestarted
            | ErrorCode::Capturing
            | ErrorCode::Protected => "55000",
            // undefined_table
            ErrorCode::NotInSnapshot => "42P01",
            // io_error
            ErrorCode::Io => "58030",
            // disk_full
            ErrorCode::NoSpace => "53100",
            // data_corrupted
            ErrorCode::Corrupt => "XX001",
            // insufficient_privilege
            ErrorCode::PermissionDenied => "42501",
            // configuration_limit_exceeded
            ErrorCode::Busy => "53400",
            // internal_error
            ErrorCode::Internal => "XX000",
        }
    }
}

/// A failed request, as the backend raises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerError {
    pub code: ErrorCode,
    pub message: String,
    pub hint: Option<String>,
    pub detail: Option<String>,
}

/// Bytes of an error answer besides its texts: version, status, code, message length, and
/// hint and detail option bytes and lengths.
const ERROR_FIXED_BYTES: usize = 1 + 1 + 1 + 4 + (1 + 4) * 2;

impl WorkerError {
    /// An error with a message and no hint or detail.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WorkerError {
            code,
            message: message.into(),
            hint: None,
            detail: None,
        }
    }

    /// The same error with a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The same error with a detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// The answer bytes saying the request failed (see [`crate::decode_answer`]). Texts too
    /// long for one message are shortened: hint and detail to a quarter of it each, the
    /// message to the rest.
    pub fn encode(&self) -> Vec<u8> {
        let budget = crate::MAX_MESSAGE_BYTES - ERROR_FIXED_BYTES;
        let hint = self.hint.as_deref().map(|h| clip(h, budget / 4));
        let detail = self.detail.as_deref().map(|d| clip(d, budget / 4));
        let used = hint.map_or(0, str::len) + detail.map_or(0, str::len);
        let message = clip(&self.message, budget - used);
        let mut w = Writer::new("error answer");
        w.u8(crate::VERSION)
            .u8(crate::reply::STATUS_ERROR)
            .u8(self.code.tag());
        // Lengths are below MAX_MESSAGE_BYTES, so neither can fail.
        let fits = "clipped texts fit a u32 length";
        w.str(message).expect(fits);
        w.opt_str(hint).expect(fits);
        w.opt_str(detail).expect(fits);
        w.into_bytes()
    }

    /// Decodes what follows the status byte of an error answer.
    pub(crate) fn decode_fields(r: &mut Reader<'_>) -> Result<WorkerError, DecodeError> {
        Ok(WorkerError {
            code: ErrorCode::from_tag(r.u8()?)?,
            message: r.str("error message")?,
            hint: r.opt_str("error hint")?,
            detail: r.opt_str("error detail")?,
        })
    }
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WorkerError {}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_answer, Kind};

    #[test]
    fn sqlstates_are_five_characters_and_corrupt_is_data_corrupted() {
        for c in ErrorCode::ALL {
            assert_eq!(c.sqlstate().len(), 5, "{c:?}");
            assert_eq!(ErrorCode::from_tag(c.tag()), Ok(c));
        }
        assert_eq!(ErrorCode::Corrupt.sqlstate(), "XX001");
        assert_eq!(ErrorCode::NotInSnapshot.sqlstate(), "42P01");
        assert_eq!(ErrorCode::Capturing.sqlstate(), "55000");
        assert!(ErrorCode::from_tag(0).is_err());
        assert_eq!(ErrorCode::Protected.sqlstate(), "55000");
        assert!(ErrorCode::from_tag(16).is_err());
    }

    #[test]
    fn hint_and_detail_travel_as_their_own_fields() {
        let e = WorkerError::new(ErrorCode::NoSnapshotAtTime, "no snapshot\nHINT: not split")
            .with_hint("take one with gsnap_snapshot()")
            .with_detail("first at 12");
        let got = decode_answer(Kind::ResolveTime, &e.encode()).unwrap();
        assert_eq!(got, Err(e));
    }

    #[test]
    fn texts_too_long_are_shortened_at_character_boundaries() {
        let long = "é".repeat(crate::MAX_MESSAGE_BYTES);
        let e = WorkerError::new(ErrorCode::Internal, long.clone())
            .with_hint(long.clone())
            .with_detail(long);
        let bytes = e.encode();
        assert!(bytes.len() <= crate::MAX_MESSAGE_BYTES);
        let got = decode_answer(Kind::Declare, &bytes).unwrap().unwrap_err();
        assert!(got.message.len() > crate::MAX_MESSAGE_BYTES / 3);
        assert!(e.message.starts_with(&got.message));
        assert!(e.hint.unwrap().starts_with(got.hint.as_deref().unwrap()));
    }
}
