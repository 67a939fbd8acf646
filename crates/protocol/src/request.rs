//! What a backend asks the worker: [`Request`], one variant per [`Kind`], with its fields named.
//!
//! A request travels as its kind's tag (the transport keeps it next to the bytes, because the
//! answer overwrites the request bytes and whoever cleans up an abandoned answer must still
//! know what it answers) and as `VERSION kind fields` bytes. [`Request::decode`] checks that
//! both kinds agree.

use crate::wire::{DecodeError, EncodeError, Reader, Writer};
use crate::{Reply, MAX_MESSAGE_BYTES};
use gsnap_core::{ImageId, SnapId};

/// Bytes of a request before its ids (LoadImages, Prefetch): version, kind, count.
const IDS_HEADER: usize = 1 + 1 + 4;

/// The most image ids one LoadImages or Prefetch request carries.
pub const MAX_IDS_PER_REQUEST: usize = (MAX_MESSAGE_BYTES - IDS_HEADER) / 8;

/// The kinds of request, with their tag on the wire. Each is answered by the [`Reply`]
/// shapes named here, or by a [`crate::WorkerError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Reply: [`Reply::Declared`].
    Declare = 1,
    /// Reply: [`Reply::Done`].
    ReleaseExport = 2,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_snapshots`].
    Snapshots = 3,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_tables`].
    SnapshotTables = 4,
    /// Reply: [`Reply::Resolved`].
    ResolveTime = 5,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_scan`], or
    /// [`Reply::TableAbsent`].
    ScanBegin = 6,
    /// Reply: [`Reply::GroupsPinned`] (pins to release).
    IndexPin = 7,
    /// Reply: [`Reply::ToastPinned`] (pins to release).
    ToastFetch = 8,
    /// Reply: [`Reply::ImagesPinned`] (pins to release).
    LoadImages = 9,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_groups`].
    Groups = 10,
    /// Reply: [`Reply::Done`] (the worker loads without pinning).
    Prefetch = 11,
    /// Reply: [`Reply::Done`].
    Delete = 12,
    /// Reply: [`Reply::Done`].
    Pin = 13,
    /// Reply: [`Reply::Done`].
    Unpin = 14,
    /// Reply: [`Reply::Done`].
    SetRank = 15,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_decisions`].
    RetentionPreview = 16,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_report`].
    Verify = 17,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_report`].
    StoreStats = 18,
    /// Reply: [`Reply::KeyCandidates`].
    KeyCandidates = 19,
    /// Paged. Reply: [`Reply::Page`] of [`crate::listing::decode_scan_range`].
    ScanRange = 20,
    /// Reply: [`Reply::Resolved`] with the newest snapshot committed in the copy (0: none).
    CopyStore = 21,
}

impl Kind {
    /// Every kind, in tag order.
    pub const ALL: [Kind; 21] = [
        Kind::Declare,
        Kind::ReleaseExport,
        Kind::Snapshots,
        Kind::SnapshotTables,
        Kind::ResolveTime,
        Kind::ScanBegin,
        Kind::IndexPin,
        Kind::ToastFetch,
        Kind::LoadImages,
        Kind::Groups,
        Kind::Prefetch,
        Kind::Delete,
        Kind::Pin,
        Kind::Unpin,
        Kind::SetRank,
        Kind::RetentionPreview,
        Kind::Verify,
        Kind::StoreStats,
        Kind::KeyCandidates,
        Kind::ScanRange,
        Kind::CopyStore,
    ];

    /// The tag the transport carries.
    pub fn tag(self) -> u32 {
        self as u32
    }

    /// The kind of a tag.
    pub fn from_tag(tag: u32) -> Result<Kind, DecodeError> {
        Kind::ALL
            .into_iter()
            .find(|k| k.tag() == tag)
            .ok_or(DecodeError::UnknownTag {
                what: "request kind",
                tag,
            })
    }

    /// Whether the answer is a listing fetched page by page (the request has an `offset`).
    pub fn is_paged(self) -> bool {
        matches!(
            self,
            Kind::Snapshots
                | Kind::SnapshotTables
                | Kind::ScanBegin
                | Kind::Groups
                | Kind::RetentionPreview
                | Kind::Verify
                | Kind::StoreStats
                | Kind::ScanRange
        )
    }

    /// Whether `reply` is a shape that answers this kind.
    pub fn accepts(self, reply: &Reply) -> bool {
        matches!(
            (self, reply),
            (Kind::Declare, Reply::Declared { .. })
                | (
                    Kind::ReleaseExport
                        | Kind::Prefetch
                        | Kind::Delete
                        | Kind::Pin
                        | Kind::Unpin
                        | Kind::SetRank,
                    Reply::Done
                )
                | (
                    Kind::Snapshots
                        | Kind::SnapshotTables
                        | Kind::Groups
                        | Kind::RetentionPreview
                        | Kind::Verify
                        | Kind::StoreStats
                        | Kind::ScanRange,
                    Reply::Page(_)
                )
                | (Kind::ScanBegin, Reply::Page(_) | Reply::TableAbsent)
                | (Kind::ResolveTime | Kind::CopyStore, Reply::Resolved { .. })
                | (Kind::IndexPin, Reply::GroupsPinned { .. })
                | (Kind::ToastFetch, Reply::ToastPinned { .. })
                | (Kind::LoadImages, Reply::ImagesPinned { .. })
                | (Kind::KeyCandidates, Reply::KeyCandidates { .. })
        )
    }
}

/// What a backend asks the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Declare a snapshot of every gsnap table. `wait`: answer once its capture is durable
    /// (otherwise right after declaration); `export`: export the MVCC snapshot it was taken
    /// at and hold it until [`Request::ReleaseExport`] (test support). `label` and `rank` are
    /// carried for a later change and not acted on yet.
    Declare {
        wait: bool,
        export: bool,
        label: Option<String>,
        rank: Option<u8>,
    },
    /// Release a snapshot held for export.
    ReleaseExport { snap: SnapId },
    /// The catalog listing, from byte `offset`.
    Snapshots { offset: u64 },
    /// One snapshot's tables, from byte `offset`.
    SnapshotTables { snap: SnapId, offset: u64 },
    /// The latest readable snapshot taken at or before a time (µs since the Unix epoch).
    ResolveTime { unix_us: i64 },
    /// Begin reading the table with OID `relid` at `snap`: its scan header and row type,
    /// from byte `offset`.
    ScanBegin {
        snap: SnapId,
        relid: u32,
        offset: u64,
    },
    /// The index groups holding snapshots `first..=last`, loaded into the group cache and
    /// pinned for the requester; `record_access` tells the dividing policy about the access.
    IndexPin {
        first: SnapId,
        last: SnapId,
        record_access: bool,
    },
    /// Chunks `first_chunk..` (at most `max_chunks`) of a stored TOAST value, pinned in the
    /// image cache; entries are keyed by chunk number.
    ToastFetch {
        value: u64,
        first_chunk: u32,
        max_chunks: u32,
    },
    /// Page images, pinned in the image cache; entries are keyed by position in `ids`. At
    /// most [`MAX_IDS_PER_REQUEST`] ids; the worker may pin only a prefix.
    LoadImages { ids: Vec<ImageId> },
    /// The index groups, for `gsnap_groups()`, from byte `offset`.
    Groups { offset: u64 },
    /// Page images loaded into the image cache *without* pinning them (a scan asks for its
    /// next batch while it reads the current one). At most [`MAX_IDS_PER_REQUEST`] ids.
    Prefetch { ids: Vec<ImageId> },
    /// Delete snapshots (logically, at once; their space is reclaimed in the background).
    /// `force`: allowed to delete the newest snapshot, or every snapshot.
    Delete { snaps: Vec<SnapId>, force: bool },
    /// Pin a snapshot under `tag` until a time (µs since the Unix epoch; `i64::MAX`: for
    /// ever); pinning again under the same tag moves the time.
    Pin {
        snap: SnapId,
        tag: String,
        until_us: i64,
    },
    /// Remove pin `tag` of a snapshot.
    Unpin { snap: SnapId, tag: String },
    /// Raise a snapshot's rank (lazy ranking); 0 takes an explicit rank back.
    SetRank { snap: SnapId, rank: u8 },
    /// What a retention policy (the configured one if None) keeps and deletes, from byte
    /// `offset`.
    RetentionPreview { policy: Option<String>, offset: u64 },
    /// Recount every reference; with `repair`, free leaked content and fix counts. From byte
    /// `offset` of the report (the check runs when offset is 0).
    Verify { repair: bool, offset: u64 },
    /// The store's space: live, dead and on-disk bytes, from byte `offset`.
    StoreStats { offset: u64 },
    /// The blocks of relation incarnation `rel` that may hold a row whose key hashes to one
    /// of `hashes` (at most [`MAX_KEY_HASHES`]) at some snapshot of `from..=to`, if its key
    /// map was started with `definition`.
    KeyCandidates {
        rel: u32,
        definition: Vec<u8>,
        hashes: Vec<u64>,
        from: SnapId,
        to: SnapId,
    },
    /// Begin reading the table with OID `relid` over the readable snapshots of `from..=to`:
    /// each one's scan header and row type, from byte `offset` (one request for what
    /// [`Request::ScanBegin`] asks per snapshot).
    ScanRange {
        relid: u32,
        from: SnapId,
        to: SnapId,
        offset: u64,
    },
    /// Write a consistent copy of the whole store into `directory` (which must not exist
    /// yet; relative to the data directory), for a backup that keeps the snapshots.
    CopyStore { directory: String },
}

/// The most key hashes one [`Request::KeyCandidates`] carries.
pub const MAX_KEY_HASHES: usize = 512;

impl Request {
    /// The request's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Request::Declare { .. } => Kind::Declare,
            Request::ReleaseExport { .. } => Kind::ReleaseExport,
            Request::Snapshots { .. } => Kind::Snapshots,
            Request::SnapshotTables { .. } => Kind::SnapshotTables,
            Request::ResolveTime { .. } => Kind::ResolveTime,
            Request::ScanBegin { .. } => Kind::ScanBegin,
            Request::IndexPin { .. } => Kind::IndexPin,
            Request::ToastFetch { .. } => Kind::ToastFetch,
            Request::LoadImages { .. } => Kind::LoadImages,
            Request::Groups { .. } => Kind::Groups,
            Request::Prefetch { .. } => Kind::Prefetch,
            Request::Delete { .. } => Kind::Delete,
            Request::Pin { .. } => Kind::Pin,
            Request::Unpin { .. } => Kind::Unpin,
            Request::SetRank { .. } => Kind::SetRank,
            Request::CopyStore { .. } => Kind::CopyStore,
            Request::RetentionPreview { .. } => Kind::RetentionPreview,
            Request::Verify { .. } => Kind::Verify,
            Request::StoreStats { .. } => Kind::StoreStats,
            Request::KeyCandidates { .. } => Kind::KeyCandidates,
            Request::ScanRange { .. } => Kind::ScanRange,
        }
    }

    /// The byte offset of a paged request (see [`Kind::is_paged`]), to set page by page.
    pub fn offset_mut(&mut self) -> Option<&mut u64> {
        match self {
            Request::Snapshots { offset }
            | Request::SnapshotTables { offset, .. }
            | Request::ScanBegin { offset, .. }
            | Request::Groups { offset }
            | Request::RetentionPreview { offset, .. }
            | Request::Verify { offset, .. }
            | Request::StoreStats { offset }
            | Request::ScanRange { offset, .. } => Some(offset),
            _ => None,
        }
    }

    /// The request's bytes; its kind's tag travels beside them ([`Kind::tag`]).
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut w = Writer::new("request");
        w.u8(crate::VERSION).u8(self.kind() as u8);
        match self {
            Request::Declare {
                wait,
                export,
                label,
                rank,
            } => {
                w.bool(*wait).bool(*export).opt_str(label.as_deref())?;
                w.opt_u8(*rank);
            }
            Request::ReleaseExport { snap } => {
                w.u64(snap.0);
            }
            Request::Snapshots { offset } | Request::Groups { offset } => {
                w.u64(*offset);
            }
            Request::SnapshotTables { snap, offset } => {
                w.u64(snap.0).u64(*offset);
            }
            Request::ResolveTime { unix_us } => {
                w.i64(*unix_us);
            }
            Request::ScanBegin {
                snap,
                relid,
                offset,
            } => {
                w.u64(snap.0).u32(*relid).u64(*offset);
            }
            Request::IndexPin {
                first,
                last,
                record_access,
            } => {
                w.u64(first.0).u64(last.0).bool(*record_access);
            }
            Request::ToastFetch {
                value,
                first_chunk,
                max_chunks,
            } => {
                w.u64(*value).u32(*first_chunk).u32(*max_chunks);
            }
            Request::LoadImages { ids } | Request::Prefetch { ids } => {
                w.count(ids.len())?;
                for id in ids {
                    w.u64(id.0);
                }
            }
            Request::Delete { snaps, force } => {
                w.bool(*force).count(snaps.len())?;
                for s in snaps {
                    w.u64(s.0);
                }
            }
            Request::Pin {
                snap,
                tag,
                until_us,
            } => {
                w.u64(snap.0).str(tag)?.i64(*until_us);
            }
            Request::Unpin { snap, tag } => {
                w.u64(snap.0).str(tag)?;
            }
            Request::SetRank { snap, rank } => {
                w.u64(snap.0).u8(*rank);
            }
            Request::RetentionPreview { policy, offset } => {
                w.opt_str(policy.as_deref())?.u64(*offset);
            }
            Request::Verify { repair, offset } => {
                w.bool(*repair).u64(*offset);
            }
            Request::StoreStats { offset } => {
                w.u64(*offset);
            }
            Request::KeyCandidates {
                rel,
                definition,
                hashes,
                from,
                to,
            } => {
                w.u32(*rel).u64(from.0).u64(to.0).bytes(definition)?;
                w.count(hashes.len())?;
                for h in hashes {
                    w.u64(*h);
                }
            }
            Request::ScanRange {
                relid,
                from,
                to,
                offset,
            } => {
                w.u32(*relid).u64(from.0).u64(to.0).u64(*offset);
            }
            Request::CopyStore { directory } => {
                w.str(directory)?;
            }
        }
        w.into_message()
    }

    /// Decodes a request the transport carried as kind `tag` with `bytes`.
    pub fn decode(tag: u32, bytes: &[u8]) -> Result<Request, DecodeError> {
        let kind = Kind::from_tag(tag)?;
        let mut r = Reader::new(bytes, "request");
        r.version()?;
        let encoded = r.u8()?;
        if u32::from(encoded) != tag {
            return Err(DecodeError::KindMismatch {
                transport: tag,
                encoded,
            });
        }
        let request = match kind {
            Kind::Declare => Request::Declare {
                wait: r.bool("wait")?,
                export: r.bool("export")?,
                label: r.opt_str("label")?,
                rank: r.opt_u8("rank")?,
            },
            Kind::ReleaseExport => Request::ReleaseExport {
                snap: SnapId(r.u64()?),
            },
            Kind::Snapshots => Request::Snapshots { offset: r.u64()? },
            Kind::SnapshotTables => Request::SnapshotTables {
                snap: SnapId(r.u64()?),
                offset: r.u64()?,
            },
            Kind::ResolveTime => Request::ResolveTime { unix_us: r.i64()? },
            Kind::ScanBegin => Request::ScanBegin {
                snap: SnapId(r.u64()?),
                relid: r.u32()?,
                offset: r.u64()?,
            },
            Kind::IndexPin => Request::IndexPin {
                first: SnapId(r.u64()?),
                last: SnapId(r.u64()?),
                record_access: r.bool("record_access")?,
            },
            Kind::ToastFetch => Request::ToastFetch {
                value: r.u64()?,
                first_chunk: r.u32()?,
                max_chunks: r.u32()?,
            },
            Kind::LoadImages => Request::LoadImages {
                ids: image_ids(&mut r)?,
            },
            Kind::Groups => Request::Groups { offset: r.u64()? },
            Kind::Prefetch => Request::Prefetch {
                ids: image_ids(&mut r)?,
            },
            Kind::Delete => {
                let force = r.bool("force")?;
                let n = r.count("snapshot ids", 8)?;
                let snaps = (0..n)
                    .map(|_| Ok(SnapId(r.u64()?)))
                    .collect::<Result<_, DecodeError>>()?;
                Request::Delete { snaps, force }
            }
            Kind::Pin => Request::Pin {
                snap: SnapId(r.u64()?),
                tag: r.str("pin tag")?,
                until_us: r.i64()?,
            },
            Kind::Unpin => Request::Unpin {
                snap: SnapId(r.u64()?),
                tag: r.str("pin tag")?,
            },
            Kind::SetRank => Request::SetRank {
                snap: SnapId(r.u64()?),
                rank: r.u8()?,
            },
            Kind::RetentionPreview => Request::RetentionPreview {
                policy: r.opt_str("policy")?,
                offset: r.u64()?,
            },
            Kind::Verify => Request::Verify {
                repair: r.bool("repair")?,
                offset: r.u64()?,
            },
            Kind::StoreStats => Request::StoreStats { offset: r.u64()? },
            Kind::KeyCandidates => {
                let rel = r.u32()?;
                let from = SnapId(r.u64()?);
                let to = SnapId(r.u64()?);
                let definition = r.bytes("key definition")?.to_vec();
                let n = r.count("key hashes", 8)?;
                let hashes = (0..n)
                    .map(|_| r.u64())
                    .collect::<Result<_, DecodeError>>()?;
                Request::KeyCandidates {
                    rel,
                    definition,
                    hashes,
                    from,
                    to,
                }
            }
            Kind::ScanRange => Request::ScanRange {
                relid: r.u32()?,
                from: SnapId(r.u64()?),
                to: SnapId(r.u64()?),
                offset: r.u64()?,
            },
            Kind::CopyStore => Request::CopyStore {
                directory: r.str("directory")?,
            },
        };
        r.finish()?;
        Ok(request)
    }
}

fn image_ids(r: &mut Reader<'_>) -> Result<Vec<ImageId>, DecodeError> {
    let n = r.count("image ids", 8)?;
    (0..n).map(|_| Ok(ImageId(r.u64()?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_layout_is_the_documented_one() {
        let r = Request::ScanBegin {
            snap: SnapId(7),
            relid: 16384,
            offset: 2,
        };
        let mut want = vec![crate::VERSION, 6];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&16384u32.to_le_bytes());
        want.extend_from_slice(&2u64.to_le_bytes());
        assert_eq!(r.encode().unwrap(), want);
        assert_eq!(Request::decode(6, &want).unwrap(), r);
    }

    #[test]
    fn the_most_ids_fit_one_message_and_one_more_does_not() {
        let ids: Vec<ImageId> = (0..MAX_IDS_PER_REQUEST as u64).map(ImageId).collect();
        let full = Request::LoadImages { ids: ids.clone() }.encode().unwrap();
        assert!(full.len() <= MAX_MESSAGE_BYTES);
        let mut more = ids;
        more.push(ImageId(1));
        assert!(matches!(
            Request::Prefetch { ids: more }.encode(),
            Err(EncodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_kind_that_disagrees_with_the_bytes_is_refused() {
        let bytes = Request::Snapshots { offset: 0 }.encode().unwrap();
        assert_eq!(
            Request::decode(Kind::Groups.tag(), &bytes),
            Err(DecodeError::KindMismatch {
                transport: 10,
                encoded: 3
            })
        );
        assert!(matches!(
            Request::decode(99, &bytes),
            Err(DecodeError::UnknownTag { tag: 99, .. })
        ));
    }

    #[test]
    fn paged_kinds_are_the_requests_with_an_offset() {
        let mut requests = [
            Request::Snapshots { offset: 0 },
            Request::SnapshotTables {
                snap: SnapId(1),
                offset: 0,
            },
            Request::ScanBegin {
                snap: SnapId(1),
                relid: 1,
                offset: 0,
            },
            Request::Groups { offset: 0 },
            Request::ResolveTime { unix_us: 0 },
            Request::Prefetch { ids: vec![] },
        ];
        for r in &mut requests {
            assert_eq!(r.kind().is_paged(), r.offset_mut().is_some(), "{r:?}");
        }
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(k.tag() as usize, i + 1);
            assert_eq!(Kind::from_tag(k.tag()), Ok(*k));
        }
    }
}
