//! The store's one error type.
//!
//! Every fallible operation of this crate returns [`StoreError`]. Its [`ErrorKind`] is what the
//! PostgreSQL side matches on to choose a SQLSTATE; its message is written for a DBA: it names
//! the store directory when there is one and says what to do.
//!
//! Invariant: an error from the storage engine is never turned into a "not found" or into
//! default values; it is classified (no space, permission, corruption, other I/O) and passed up.

use std::fmt;

/// What kind of failure an error is. The PostgreSQL side maps each kind to a SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// An unknown or unreadable snapshot, image, TOAST value, row type or relation.
    /// Suggested SQLSTATE: 22023 (invalid_parameter_value) or 42704 (undefined_object).
    NotFound,
    /// The store was written by another format version, belongs to another cluster, or the
    /// directory is not a gsnap store. Suggested SQLSTATE: 55000 (object_not_in_prerequisite_state).
    Incompatible,
    /// Stored bytes do not decode or do not match their fingerprint.
    /// Suggested SQLSTATE: XX001 (data_corrupted).
    Corrupt,
    /// The disk is full. Suggested SQLSTATE: 53100 (disk_full).
    NoSpace,
    /// The operating system refused access to the store's files.
    /// Suggested SQLSTATE: 42501 (insufficient_privilege).
    PermissionDenied,
    /// Any other I/O or storage-engine failure. Suggested SQLSTATE: 58030 (io_error).
    Io,
    /// The caller broke the API's rules (e.g. a second capture while one is open, an oversized
    /// view). Suggested SQLSTATE: 22023 (invalid_parameter_value) or XX000 (internal_error).
    InvalidArgument,
}

impl ErrorKind {
    /// A short lower-case name, used in messages and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::Incompatible => "incompatible store",
            ErrorKind::Corrupt => "corrupt store",
            ErrorKind::NoSpace => "no space left on device",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Io => "I/O error",
            ErrorKind::InvalidArgument => "invalid argument",
        }
    }
}

/// The error type of every store operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    kind: ErrorKind,
    message: String,
}

/// Shorthand used throughout the crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// An error of `kind` with a complete, DBA-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `context` put in front of the message ("context: message").
    pub fn context(self, context: impl fmt::Display) -> Self {
        StoreError {
            kind: self.kind,
            message: format!("{context}: {}", self.message),
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn incompatible(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Incompatible, message)
    }

    /// Classifies a storage-engine or OS error message: "No space left on device" (ENOSPC,
    /// RocksDB's IOError/NoSpace) is [`ErrorKind::NoSpace`], "Permission denied" (EACCES) is
    /// [`ErrorKind::PermissionDenied`], "Corruption" is [`ErrorKind::Corrupt`], the rest is
    /// [`ErrorKind::Io`].
    pub fn classify_message(message: &str) -> ErrorKind {
        let lower = message.to_ascii_lowercase();
        if lower.contains("no space left on device")
            || lower.contains("nospace")
            || lower.contains("no space")
        {
            ErrorKind::NoSpace
        } else if lower.contains("permission denied") || lower.contains("operation not permitted") {
            ErrorKind::PermissionDenied
        } else if lower.starts_with("corruption") || lower.contains("checksum mismatch") {
            ErrorKind::Corrupt
        } else {
            ErrorKind::Io
        }
    }

    /// Converts an OS error met while working on `path`.
    pub(crate) fn from_io(err: &std::io::Error, what: impl fmt::Display) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ if err.raw_os_error() == Some(28) => ErrorKind::NoSpace, // ENOSPC
            _ => Self::classify_message(&err.to_string()),
        };
        StoreError::new(kind, format!("{what}: {err}"))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_engine_messages() {
        let cases = [
            (
                "IO error: No space left on device: While appending to file",
                ErrorKind::NoSpace,
            ),
            ("IO error: NoSpace: fallocate", ErrorKind::NoSpace),
            (
                "IO error: While open a file for appending: /x/LOG: Permission denied",
                { ErrorKind::PermissionDenied },
            ),
            ("Corruption: block checksum mismatch", ErrorKind::Corrupt),
            ("IO error: Input/output error", ErrorKind::Io),
        ];
        for (message, kind) in cases {
            assert_eq!(StoreError::classify_message(message), kind, "{message}");
        }
    }

    #[test]
    fn context_keeps_kind_and_prefixes_message() {
        let e = StoreError::not_found("image 7 does not exist").context("reading snapshot 3");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.to_string(), "reading snapshot 3: image 7 does not exist");
    }

    #[test]
    fn enospc_io_error_is_no_space() {
        let err = std::io::Error::from_raw_os_error(28);
        assert_eq!(
            StoreError::from_io(&err, "writing").kind(),
            ErrorKind::NoSpace
        );
        let err = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(
            StoreError::from_io(&err, "opening").kind(),
            ErrorKind::PermissionDenied
        );
    }
}
