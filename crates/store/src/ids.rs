//! Identifiers used by the store: snapshots, relation incarnations, images, TOAST values, row
//! types, groups, pages and content fingerprints.
//!
//! Invariants: every id except [`PageId`] and [`Fingerprint`] is allocated by the store from a
//! persisted counter, starts at 1 (0 is never a valid id) and is never handed out twice for
//! different content, not even after a crash (see `docs/format.md`, "Id allocation").

use std::fmt;

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
    /// A snapshot's id. Ids grow monotonically in declaration order.
    SnapId(u64),
    "snapshot"
);
id_type!(
    /// An internal relation *incarnation*: a new one is allocated whenever a table's storage is
    /// replaced (TRUNCATE, VACUUM FULL, ...), so pages of different storages never share ids.
    RelId(u32),
    "relation incarnation"
);
id_type!(
    /// A stored page image (content-addressed: identical views share one id).
    ImageId(u64),
    "image"
);
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

/// One page of one relation incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageId {
    /// The relation incarnation.
    pub rel: RelId,
    /// The block number within it.
    pub block: u32,
}

impl PageId {
    /// The page `block` of `rel`.
    pub fn new(rel: RelId, block: u32) -> Self {
        PageId { rel, block }
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block {} of relation incarnation {}",
            self.block, self.rel.0
        )
    }
}

/// The BLAKE3 hash of some uncompressed content: all 32 bytes, never truncated (a collision
/// would show one table's rows in another).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of `content`.
    pub fn of(content: &[u8]) -> Self {
        Fingerprint(*blake3::hash(content).as_bytes())
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
