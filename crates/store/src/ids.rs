//! Identifiers used by the store: snapshots, relation incarnations, images, TOAST values, row
//! types, groups, pages and content fingerprints.
//!
//! Snapshots, relation incarnations, images and pages use the workspace's one set of types,
//! `gsnap_core`'s ([`SnapId`], [`RelId`], [`ImageId`], [`PageKey`]), re-exported here; the
//! kinds only the store knows are defined below.
//!
//! Invariants: every id except [`PageKey`], [`GroupId`] and [`Fingerprint`] is allocated by
//! the store from a persisted counter, starts at 1 (0 is never a valid id) and is never
//! handed out twice for different content, not even after a crash (see `docs/format.md`, "Id
//! allocation").

use std::fmt;

pub use gsnap_core::{ImageId, PageKey, RelId, SnapId};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($int:ty), $label:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $int);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($label, " {}"), self.0)
            }
        }
    };
}

id_type!(
    /// A stored out-of-line TOAST value (content-addressed).
    ToastId(u64),
    "TOAST value"
);
id_type!(
    /// A stored row type description (opaque bytes, content-addressed).
    RowTypeId(u64),
    "row type"
);
id_type!(
    /// A sealed index group (chosen by the caller, not allocated by the store).
    GroupId(u64),
    "group"
);

/// A Thresher rank level: higher ranks live longer. Only rank 0 has an image column family now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rank(pub u8);

/// A BLAKE3 hash: all 32 bytes, never truncated (a collision would show one table's rows in
/// another). Of some uncompressed content, or for page images of their stored (compressed)
/// form ([`Fingerprint::of_image`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of `content`.
    pub fn of(content: &[u8]) -> Self {
        Fingerprint(*blake3::hash(content).as_bytes())
    }

    /// The fingerprint a capture gives the page view `view` (its dedup key): that of the
    /// view's stored form (`records.rs`, `stored_fingerprint`).
    pub fn of_image(view: &[u8]) -> Self {
        crate::records::seal_image(view).fp
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}
