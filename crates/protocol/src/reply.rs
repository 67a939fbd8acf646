//! What the worker answers: a [`Reply`] or a [`crate::WorkerError`], as one answer message.
//!
//! Which reply shapes answer which request kind is fixed by [`Kind::accepts`]; the worker's
//! [`Reply::encode`] and the backend's [`decode_answer`] both check it, so a backend only ever
//! sees a shape its request can get. Replies holding pins ([`Reply::pins`]) must have them
//! released by whoever ends up with the reply, also when the backend gave the request up.
//!
//! Listings are cut into [`Page`]s at byte offsets by the worker ([`Page::slice`]) and joined
//! by the backend ([`Pages`]), which checks every page against the listing's total.

use crate::wire::{DecodeError, EncodeError, Reader, Writer};
use crate::{Kind, WorkerError, MAX_MESSAGE_BYTES};
use gsnap_core::SnapId;

/// The status byte of an answer that carries a [`Reply`].
pub(crate) const STATUS_OK: u8 = 0;
/// The status byte of an answer that carries a [`WorkerError`].
pub(crate) const STATUS_ERROR: u8 = 1;

/// Bytes of an answer before a reply's fields: version, status, reply tag.
const REPLY_HEADER: usize = 3;
/// The most pinned entries one reply carries ([`Reply::ToastPinned`] has the most besides).
pub const MAX_PINNED_PER_REPLY: usize = (MAX_MESSAGE_BYTES - REPLY_HEADER - 4 - 8 - 4) / 12;
/// The most blocks one [`Reply::KeyCandidates`] carries.
pub const MAX_KEY_CANDIDATES: usize = (MAX_MESSAGE_BYTES - REPLY_HEADER - 8 - 1 - 4) / 4;
/// The most pinned groups one reply carries.
pub const MAX_GROUPS_PER_REPLY: usize = (MAX_MESSAGE_BYTES - REPLY_HEADER - 4) / 24;

/// An image cache slot pinned for the requester: `key` is the position in the request's ids
/// (LoadImages) or the chunk number (ToastFetch); `len` bytes of the slot are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinnedEntry {
    pub key: u32,
    pub slot: u32,
    pub len: u32,
}

/// A group pinned in the group cache for the requester, at `offset..offset + size` of the
/// cache's data area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupEntry {
    /// The cache key (a sealed group's id, or a published copy of the active group).
    pub key: u64,
    pub offset: u64,
    pub size: u64,
}

/// One page of a listing: `bytes` from the offset asked for, of a listing of `total` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub total: u64,
    pub bytes: Vec<u8>,
}

impl Page {
    /// The most listing bytes one page carries.
    pub const MAX_BYTES: usize = MAX_MESSAGE_BYTES - REPLY_HEADER - 8 - 4;

    /// The page of `blob` (a whole listing) that starts at `offset`; None if `offset` is
    /// beyond its end.
    pub fn slice(blob: &[u8], offset: u64) -> Option<Page> {
        let from = usize::try_from(offset).ok().filter(|&f| f <= blob.len())?;
        let to = blob.len().min(from + Page::MAX_BYTES);
        Some(Page {
            total: blob.len() as u64,
            bytes: blob[from..to].to_vec(),
        })
    }
}

/// Joins the pages of one listing, asked for in order from offset 0.
#[derive(Debug, Default)]
pub struct Pages {
    bytes: Vec<u8>,
    total: Option<u64>,
}

impl Pages {
    pub fn new() -> Self {
        Pages::default()
    }

    /// The offset to ask for next.
    pub fn next_offset(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Whether every byte of the listing arrived (false before the first page).
    pub fn is_complete(&self) -> bool {
        self.total == Some(self.next_offset())
    }

    /// Adds the page answered for [`Pages::next_offset`]. A changed total means the listing
    /// changed between pages ([`DecodeError::PageTotalChanged`]): start again.
    pub fn add(&mut self, page: Page) -> Result<(), DecodeError> {
        let offset = self.next_offset();
        if let Some(before) = self.total.filter(|&t| t != page.total) {
            return Err(DecodeError::PageTotalChanged {
                before,
                now: page.total,
            });
        }
        let end = offset + page.bytes.len() as u64;
        if end > page.total {
            return Err(DecodeError::PageBeyondTotal {
                end,
                total: page.total,
            });
        }
        if page.bytes.is_empty() && offset < page.total {
            return Err(DecodeError::EmptyPage {
                offset,
                total: page.total,
            });
        }
        self.total = Some(page.total);
        self.bytes.extend_from_slice(&page.bytes);
        Ok(())
    }

    /// The whole listing.
    pub fn into_bytes(self) -> Result<Vec<u8>, DecodeError> {
        if !self.is_complete() {
            return Err(DecodeError::Incomplete {
                have: self.next_offset(),
                total: self.total,
            });
        }
        Ok(self.bytes)
    }
}

/// What the worker answers to a request that succeeded. [`Kind`] lists which shapes answer
/// which request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The declared snapshot, and the name of its exported MVCC snapshot if one was asked.
    Declared {
        snap: SnapId,
        exported: Option<String>,
    },
    /// Done; nothing to say.
    Done,
    /// One page of a listing.
    Page(Page),
    /// ScanBegin: the table is not part of the snapshot.
    TableAbsent,
    /// ResolveTime: the snapshot.
    Resolved { snap: SnapId },
    /// IndexPin: the groups pinned, at most [`MAX_GROUPS_PER_REPLY`].
    GroupsPinned { groups: Vec<GroupEntry> },
    /// LoadImages: the images pinned (a prefix of those asked, possibly empty when the cache
    /// is full), at most [`MAX_PINNED_PER_REPLY`].
    ImagesPinned { entries: Vec<PinnedEntry> },
    /// ToastFetch: the value has `chunks` chunks and `len` bytes; `entries` are the chunks
    /// pinned from the one asked for (possibly none when the cache is full), at most
    /// [`MAX_PINNED_PER_REPLY`].
    ToastPinned {
        chunks: u32,
        len: u64,
        entries: Vec<PinnedEntry>,
    },
    /// KeyCandidates: the snapshot the relation's key map is complete from (None: it has no
    /// map with the definition asked for), and the blocks that may hold the keys, ascending;
    /// `complete` false if there were more than [`MAX_KEY_CANDIDATES`] (the reader then
    /// reads every page).
    KeyCandidates {
        start: Option<SnapId>,
        complete: bool,
        blocks: Vec<u32>,
    },
}

/// The cache pins a reply holds for its requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pins<'a> {
    None,
    /// Image cache slots.
    Images(&'a [PinnedEntry]),
    /// Group cache entries.
    Groups(&'a [GroupEntry]),
}

impl Reply {
    fn tag(&self) -> u8 {
        match self {
            Reply::Declared { .. } => 1,
            Reply::Done => 2,
            Reply::Page(_) => 3,
            Reply::TableAbsent => 4,
            Reply::Resolved { .. } => 5,
            Reply::GroupsPinned { .. } => 6,
            Reply::ImagesPinned { .. } => 7,
            Reply::ToastPinned { .. } => 8,
            Reply::KeyCandidates { .. } => 9,
        }
    }

    /// The shape's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Reply::Declared { .. } => "Declared",
            Reply::Done => "Done",
            Reply::Page(_) => "Page",
            Reply::TableAbsent => "TableAbsent",
            Reply::Resolved { .. } => "Resolved",
            Reply::GroupsPinned { .. } => "GroupsPinned",
            Reply::ImagesPinned { .. } => "ImagesPinned",
            Reply::ToastPinned { .. } => "ToastPinned",
            Reply::KeyCandidates { .. } => "KeyCandidates",
        }
    }

    /// The pins this reply holds for the requester, to release when done with it.
    pub fn pins(&self) -> Pins<'_> {
        match self {
            Reply::ImagesPinned { entries } | Reply::ToastPinned { entries, .. } => {
                Pins::Images(entries)
            }
            Reply::GroupsPinned { groups } => Pins::Groups(groups),
            _ => Pins::None,
        }
    }

    /// The answer bytes for a request of kind `kind` that succeeded with this reply.
    pub fn encode(&self, kind: Kind) -> Result<Vec<u8>, EncodeError> {
        if !kind.accepts(self) {
            return Err(EncodeError::WrongReply {
                kind,
                reply: self.name(),
            });
        }
        let mut w = Writer::new("reply");
        w.u8(crate::VERSION).u8(STATUS_OK).u8(self.tag());
        match self {
            Reply::Declared { snap, exported } => {
                w.u64(snap.0).opt_str(exported.as_deref())?;
            }
            Reply::Done | Reply::TableAbsent => {}
            Reply::Page(p) => {
                w.u64(p.total).bytes(&p.bytes)?;
            }
            Reply::Resolved { snap } => {
                w.u64(snap.0);
            }
            Reply::GroupsPinned { groups } => {
                w.count(groups.len())?;
                for g in groups {
                    w.u64(g.key).u64(g.offset).u64(g.size);
                }
            }
            Reply::ImagesPinned { entries } => pinned(&mut w, entries)?,
            Reply::ToastPinned {
                chunks,
                len,
                entries,
            } => {
                w.u32(*chunks).u64(*len);
                pinned(&mut w, entries)?;
            }
            Reply::KeyCandidates {
                start,
                complete,
                blocks,
            } => {
                w.u64(start.map_or(0, |s| s.0)).bool(*complete);
                w.count(blocks.len())?;
                for block in blocks {
                    w.u32(*block);
                }
            }
        }
        w.into_message()
    }
}

fn pinned(w: &mut Writer, entries: &[PinnedEntry]) -> Result<(), EncodeError> {
    w.count(entries.len())?;
    for e in entries {
        w.u32(e.key).u32(e.slot).u32(e.len);
    }
    Ok(())
}

fn decode_pinned(r: &mut Reader<'_>) -> Result<Vec<PinnedEntry>, DecodeError> {
    let n = r.count("pinned entries", 12)?;
    (0..n)
        .map(|_| {
            Ok(PinnedEntry {
                key: r.u32()?,
                slot: r.u32()?,
                len: r.u32()?,
            })
        })
        .collect()
}

/// Decodes the answer to a request of kind `kind`: the reply, or the error the worker
/// reported. A reply shape `kind` never gets is a [`DecodeError::UnexpectedReply`].
pub fn decode_answer(kind: Kind, bytes: &[u8]) -> Result<Result<Reply, WorkerError>, DecodeError> {
    let mut r = Reader::new(bytes, "answer");
    r.version()?;
    let answer = match r.u8()? {
        STATUS_OK => Ok(decode_reply(kind, &mut r)?),
        STATUS_ERROR => Err(WorkerError::decode_fields(&mut r)?),
        status => {
            return Err(DecodeError::UnknownTag {
                what: "answer status",
                tag: u32::from(status),
            })
        }
    };
    r.finish()?;
    Ok(answer)
}

fn decode_reply(kind: Kind, r: &mut Reader<'_>) -> Result<Reply, DecodeError> {
    let reply = match r.u8()? {
        1 => Reply::Declared {
            snap: SnapId(r.u64()?),
            exported: r.opt_str("exported snapshot")?,
        },
        2 => Reply::Done,
        3 => Reply::Page(Page {
            total: r.u64()?,
            bytes: r.bytes("page")?.to_vec(),
        }),
        4 => Reply::TableAbsent,
        5 => Reply::Resolved {
            snap: SnapId(r.u64()?),
        },
        6 => {
            let n = r.count("pinned groups", 24)?;
            let groups = (0..n)
                .map(|_| {
                    Ok(GroupEntry {
                        key: r.u64()?,
                        offset: r.u64()?,
                        size: r.u64()?,
                    })
                })
                .collect::<Result<_, DecodeError>>()?;
            Reply::GroupsPinned { groups }
        }
        7 => Reply::ImagesPinned {
            entries: decode_pinned(r)?,
        },
        8 => Reply::ToastPinned {
            chunks: r.u32()?,
            len: r.u64()?,
            entries: decode_pinned(r)?,
        },
        9 => {
            let start = r.u64()?;
            let complete = r.bool("complete")?;
            let n = r.count("key candidates", 4)?;
            let blocks = (0..n)
                .map(|_| r.u32())
                .collect::<Result<_, DecodeError>>()?;
            Reply::KeyCandidates {
                start: (start != 0).then_some(SnapId(start)),
                complete,
                blocks,
            }
        }
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "reply",
                tag: u32::from(tag),
            })
        }
    };
    if !kind.accepts(&reply) {
        return Err(DecodeError::UnexpectedReply {
            kind,
            reply: reply.name(),
        });
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize) -> Vec<PinnedEntry> {
        (0..n as u32)
            .map(|i| PinnedEntry {
                key: i,
                slot: i,
                len: 8192,
            })
            .collect()
    }

    #[test]
    fn the_most_entries_fit_one_reply_and_one_more_does_not() {
        let toast = |n| Reply::ToastPinned {
            chunks: 1,
            len: 1,
            entries: entries(n),
        };
        assert!(toast(MAX_PINNED_PER_REPLY).encode(Kind::ToastFetch).is_ok());
        assert!(toast(MAX_PINNED_PER_REPLY + 1)
            .encode(Kind::ToastFetch)
            .is_err());
        let images = Reply::ImagesPinned {
            entries: entries(MAX_PINNED_PER_REPLY),
        };
        assert!(images.encode(Kind::LoadImages).is_ok());
        let groups = |n| Reply::GroupsPinned {
            groups: vec![
                GroupEntry {
                    key: 1,
                    offset: 2,
                    size: 3
                };
                n
            ],
        };
        assert!(groups(MAX_GROUPS_PER_REPLY).encode(Kind::IndexPin).is_ok());
        assert!(groups(MAX_GROUPS_PER_REPLY + 1)
            .encode(Kind::IndexPin)
            .is_err());
        let blob = vec![7; 3 * Page::MAX_BYTES];
        let page = Page::slice(&blob, 0).unwrap();
        assert_eq!(page.bytes.len(), Page::MAX_BYTES);
        assert_eq!(
            Reply::Page(page).encode(Kind::Groups).unwrap().len(),
            MAX_MESSAGE_BYTES
        );
    }

    #[test]
    fn a_reply_of_another_kind_is_refused_on_both_sides() {
        let declared = Reply::Declared {
            snap: SnapId(3),
            exported: None,
        };
        assert_eq!(
            declared.encode(Kind::Snapshots),
            Err(EncodeError::WrongReply {
                kind: Kind::Snapshots,
                reply: "Declared"
            })
        );
        let bytes = declared.encode(Kind::Declare).unwrap();
        assert_eq!(
            decode_answer(Kind::ResolveTime, &bytes),
            Err(DecodeError::UnexpectedReply {
                kind: Kind::ResolveTime,
                reply: "Declared"
            })
        );
        assert_eq!(decode_answer(Kind::Declare, &bytes), Ok(Ok(declared)));
    }

    #[test]
    fn pages_join_into_the_listing() {
        let blob: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let mut pages = Pages::new();
        assert!(!pages.is_complete());
        while !pages.is_complete() {
            let page = Page::slice(&blob, pages.next_offset()).unwrap();
            pages.add(page).unwrap();
        }
        assert_eq!(pages.into_bytes().unwrap(), blob);
        assert_eq!(Page::slice(&blob, 20_001), None);
        assert_eq!(Page::slice(&blob, 20_000).unwrap().bytes, Vec::<u8>::new());
    }

    #[test]
    fn pages_that_do_not_join_are_errors() {
        let page = |total, n| Page {
            total,
            bytes: vec![0; n],
        };
        let mut p = Pages::new();
        p.add(page(10, 4)).unwrap();
        assert_eq!(
            p.add(page(12, 4)),
            Err(DecodeError::PageTotalChanged {
                before: 10,
                now: 12
            })
        );
        assert_eq!(
            p.add(page(10, 7)),
            Err(DecodeError::PageBeyondTotal { end: 11, total: 10 })
        );
        assert_eq!(
            p.add(page(10, 0)),
            Err(DecodeError::EmptyPage {
                offset: 4,
                total: 10
            })
        );
        assert_eq!(
            p.into_bytes(),
            Err(DecodeError::Incomplete {
                have: 4,
                total: Some(10)
            })
        );
        assert!(Pages::new().into_bytes().is_err());
        let mut empty = Pages::new();
        empty.add(page(0, 0)).unwrap();
        assert_eq!(empty.into_bytes(), Ok(vec![]));
    }

    #[test]
    fn pins_are_found_in_the_replies_that_hold_them() {
        let e = entries(2);
        assert_eq!(
            Reply::ImagesPinned { entries: e.clone() }.pins(),
            Pins::Images(&e)
        );
        assert_eq!(Reply::Done.pins(), Pins::None);
        assert_eq!(Reply::TableAbsent.pins(), Pins::None);
    }
}
