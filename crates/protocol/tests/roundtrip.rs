//! Property tests of the wire format through the public API: every request, reply, error and
//! listing decodes to what was encoded; every strict prefix and every extension by trailing
//! bytes fails to decode; arbitrary bytes never make a decoder panic.

use gsnap_protocol::listing::{
    decode_decisions, decode_groups, decode_report, decode_scan, decode_snapshots, decode_tables,
    encode_decisions, encode_groups, encode_report, encode_scan, encode_snapshots, encode_tables,
    DecisionRow, ReportRow,
};
use gsnap_protocol::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    "(?s).{0,24}"
}

fn snap() -> impl Strategy<Value = SnapId> {
    any::<u64>().prop_map(SnapId)
}

fn ids() -> impl Strategy<Value = Vec<ImageId>> {
    vec(any::<u64>().prop_map(ImageId), 0..200)
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(text()),
            any::<Option<u8>>()
        )
            .prop_map(|(wait, export, label, rank)| Request::Declare {
                wait,
                export,
                label,
                rank
            }),
        snap().prop_map(|snap| Request::ReleaseExport { snap }),
        any::<u64>().prop_map(|offset| Request::Snapshots { offset }),
        (snap(), any::<u64>()).prop_map(|(snap, offset)| Request::SnapshotTables { snap, offset }),
        any::<i64>().prop_map(|unix_us| Request::ResolveTime { unix_us }),
        (snap(), any::<u32>(), any::<u64>()).prop_map(|(snap, relid, offset)| {
            Request::ScanBegin {
                snap,
                relid,
                offset,
            }
        }),
        (snap(), snap(), any::<bool>()).prop_map(|(first, last, record_access)| {
            Request::IndexPin {
                first,
                last,
                record_access,
            }
        }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(value, first_chunk, max_chunks)| {
            Request::ToastFetch {
                value,
                first_chunk,
                max_chunks,
            }
        }),
        ids().prop_map(|ids| Request::LoadImages { ids }),
        any::<u64>().prop_map(|offset| Request::Groups { offset }),
        ids().prop_map(|ids| Request::Prefetch { ids }),
        (vec(snap(), 0..50), any::<bool>())
            .prop_map(|(snaps, force)| Request::Delete { snaps, force }),
        (snap(), text(), any::<i64>()).prop_map(|(snap, tag, until_us)| Request::Pin {
            snap,
            tag,
            until_us
        }),
        (snap(), text()).prop_map(|(snap, tag)| Request::Unpin { snap, tag }),
        (snap(), any::<u8>()).prop_map(|(snap, rank)| Request::SetRank { snap, rank }),
        (proptest::option::of(text()), any::<u64>())
            .prop_map(|(policy, offset)| Request::RetentionPreview { policy, offset }),
        (any::<bool>(), any::<u64>())
            .prop_map(|(repair, offset)| Request::Verify { repair, offset }),
        any::<u64>().prop_map(|offset| Request::StoreStats { offset }),
        text().prop_map(|directory| Request::CopyStore { directory }),
        (
            any::<u32>(),
            vec(any::<u8>(), 0..60),
            vec(any::<u64>(), 0..MAX_KEY_HASHES),
            snap(),
            snap()
        )
            .prop_map(
                |(rel, definition, hashes, from, to)| Request::KeyCandidates {
                    rel,
                    definition,
                    hashes,
                    from,
                    to
                }
            ),
    ]
}

fn decision_rows() -> impl Strategy<Value = Vec<DecisionRow>> {
    let row = (
        snap(),
        any::<i64>(),
        any::<u8>(),
        proptest::option::of(text()),
        any::<(bool, bool)>(),
        text(),
    )
        .prop_map(
            |(snap, taken_at_us, rank, label, (pinned, keep), rule)| DecisionRow {
                snap,
                taken_at_us,
                rank,
                label,
                pinned,
                keep,
                rule,
            },
        );
    vec(row, 0..12)
}

fn report_rows() -> impl Strategy<Value = Vec<ReportRow>> {
    vec(
        (text(), any::<i64>()).prop_map(|(name, value)| ReportRow { name, value }),
        0..12,
    )
}

fn pinned() -> impl Strategy<Value = Vec<PinnedEntry>> {
    vec(
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(key, slot, len)| PinnedEntry {
            key,
            slot,
            len,
        }),
        0..60,
    )
}

/// A reply with a request kind it answers.
fn reply() -> impl Strategy<Value = (Kind, Reply)> {
    let page = (any::<u64>(), vec(any::<u8>(), 0..300))
        .prop_map(|(total, bytes)| Reply::Page(Page { total, bytes }));
    let page_kind = prop_oneof![
        Just(Kind::Snapshots),
        Just(Kind::SnapshotTables),
        Just(Kind::ScanBegin),
        Just(Kind::Groups)
    ];
    prop_oneof![
        (snap(), proptest::option::of(text()))
            .prop_map(|(snap, exported)| (Kind::Declare, Reply::Declared { snap, exported })),
        prop_oneof![Just(Kind::ReleaseExport), Just(Kind::Prefetch)].prop_map(|k| (k, Reply::Done)),
        (page_kind, page),
        Just((Kind::ScanBegin, Reply::TableAbsent)),
        snap().prop_map(|snap| (Kind::ResolveTime, Reply::Resolved { snap })),
        vec(
            (any::<u64>(), any::<u64>(), any::<u64>())
                .prop_map(|(key, offset, size)| { GroupEntry { key, offset, size } }),
            0..60
        )
        .prop_map(|groups| (Kind::IndexPin, Reply::GroupsPinned { groups })),
        pinned().prop_map(|entries| (Kind::LoadImages, Reply::ImagesPinned { entries })),
        (any::<u32>(), any::<u64>(), pinned()).prop_map(|(chunks, len, entries)| {
            (
                Kind::ToastFetch,
                Reply::ToastPinned {
                    chunks,
                    len,
                    entries,
                },
            )
        }),
        (
            proptest::option::of((1..u64::MAX).prop_map(SnapId)),
            any::<bool>(),
            vec(any::<u32>(), 0..MAX_KEY_CANDIDATES)
        )
            .prop_map(|(start, complete, blocks)| (
                Kind::KeyCandidates,
                Reply::KeyCandidates {
                    start,
                    complete,
                    blocks
                }
            )),
    ]
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    proptest::sample::select(ErrorCode::ALL.to_vec())
}

fn worker_error() -> impl Strategy<Value = WorkerError> {
    (
        error_code(),
        text(),
        proptest::option::of(text()),
        proptest::option::of(text()),
    )
        .prop_map(|(code, message, hint, detail)| WorkerError {
            code,
            message,
            hint,
            detail,
        })
}

fn kind() -> impl Strategy<Value = Kind> {
    proptest::sample::select(Kind::ALL.to_vec())
}

fn snapshot_rows() -> impl Strategy<Value = Vec<SnapshotRow>> {
    let row = (
        (
            snap(),
            proptest::sample::select(SnapshotState::ALL.to_vec()),
        ),
        (any::<i64>(), any::<u64>(), any::<u8>(), any::<u32>()),
        any::<[u64; 4]>(),
        (
            proptest::option::of(text()),
            proptest::option::of(any::<u64>()),
        ),
        (
            any::<u8>(),
            proptest::option::of(text()),
            vec((text(), any::<i64>()), 0..3),
            proptest::option::of(any::<i64>()),
        ),
    )
        .prop_map(
            |(
                (id, state),
                (taken_at_us, lsn, rank, tables),
                stats,
                (failure, frees_bytes),
                (explicit_rank, label, pins, deleted_at_us),
            )| SnapshotRow {
                id,
                state,
                taken_at_us,
                lsn,
                rank,
                explicit_rank,
                label,
                pins,
                deleted_at_us,
                tables,
                pages_captured: stats[0],
                new_images: stats[1],
                bytes_stored: stats[2],
                carried_pages: stats[3],
                frees_bytes,
                failure,
            },
        );
    vec(row, 0..12)
}

fn table_rows() -> impl Strategy<Value = Vec<TableRow>> {
    let row =
        (any::<[u32; 4]>(), text(), vec(any::<u32>(), 0..4)).prop_map(|(n, name, ancestors)| {
            TableRow {
                relid: n[0],
                rel: RelId(n[1]),
                relfilenode: n[2],
                nblocks: n[3],
                name,
                ancestors,
            }
        });
    vec(row, 0..12)
}

fn group_rows() -> impl Strategy<Value = Vec<GroupRow>> {
    let row = (
        (any::<u64>(), any::<bool>(), snap(), snap()),
        any::<[u64; 4]>(),
        (any::<bool>(), any::<Option<u64>>()),
    )
        .prop_map(
            |((id, sealed, first, last), n, (loaded, page_budget))| GroupRow {
                id,
                state: if sealed {
                    GroupState::Sealed
                } else {
                    GroupState::Active
                },
                first,
                last,
                snapshots: n[0],
                pages: n[1],
                bytes: n[2],
                loaded,
                length_budget: n[3],
                page_budget,
            },
        );
    vec(row, 0..12)
}

/// Every strict prefix of `bytes`, and `bytes` followed by `extra` (non-empty), fail `decode`.
fn assert_exact<T>(bytes: &[u8], extra: &[u8], decode: impl Fn(&[u8]) -> Result<T, DecodeError>) {
    for len in 0..bytes.len() {
        assert!(decode(&bytes[..len]).is_err(), "prefix of {len} bytes");
    }
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(extra);
    assert!(decode(&longer).is_err(), "trailing bytes");
}

fn extra() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 1..16)
}

proptest! {
    #[test]
    fn requests_round_trip_exactly(req in request(), extra in extra()) {
        let bytes = req.encode().unwrap();
        prop_assert!(bytes.len() <= MAX_MESSAGE_BYTES);
        let tag = req.kind().tag();
        prop_assert_eq!(Request::decode(tag, &bytes), Ok(req));
        assert_exact(&bytes, &extra, |b| Request::decode(tag, b));
    }

    #[test]
    fn replies_round_trip_exactly((kind, reply) in reply(), extra in extra()) {
        let bytes = reply.encode(kind).unwrap();
        prop_assert!(bytes.len() <= MAX_MESSAGE_BYTES);
        prop_assert_eq!(decode_answer(kind, &bytes), Ok(Ok(reply)));
        assert_exact(&bytes, &extra, |b| decode_answer(kind, b));
    }

    #[test]
    fn replies_are_refused_for_kinds_they_do_not_answer((kind, reply) in reply(), other in kind()) {
        let bytes = reply.encode(kind).unwrap();
        prop_assert_eq!(decode_answer(other, &bytes).is_ok(), other.accepts(&reply));
        prop_assert_eq!(reply.encode(other).is_ok(), other.accepts(&reply));
    }

    #[test]
    fn errors_round_trip_exactly(e in worker_error(), kind in kind(), extra in extra()) {
        let bytes = e.encode();
        prop_assert_eq!(decode_answer(kind, &bytes), Ok(Err(e)));
        assert_exact(&bytes, &extra, |b| decode_answer(kind, b));
    }

    #[test]
    fn listings_round_trip_exactly(
        snapshots in snapshot_rows(),
        tables in table_rows(),
        groups in group_rows(),
        extra in extra(),
    ) {
        let bytes = encode_snapshots(&snapshots).unwrap();
        prop_assert_eq!(decode_snapshots(&bytes), Ok(snapshots));
        assert_exact(&bytes, &extra, decode_snapshots);
        let bytes = encode_tables(&tables).unwrap();
        prop_assert_eq!(decode_tables(&bytes), Ok(tables));
        assert_exact(&bytes, &extra, decode_tables);
        let bytes = encode_groups(&groups).unwrap();
        prop_assert_eq!(decode_groups(&bytes), Ok(groups));
        assert_exact(&bytes, &extra, decode_groups);
    }

    #[test]
    fn lifetime_listings_round_trip_exactly(
        decisions in decision_rows(),
        report in report_rows(),
        extra in extra(),
    ) {
        let bytes = encode_decisions(&decisions).unwrap();
        prop_assert_eq!(decode_decisions(&bytes), Ok(decisions));
        assert_exact(&bytes, &extra, decode_decisions);
        let bytes = encode_report(&report).unwrap();
        prop_assert_eq!(decode_report(&bytes), Ok(report));
        assert_exact(&bytes, &extra, decode_report);
    }

    #[test]
    fn scan_starts_round_trip_exactly(
        rel in any::<u32>(),
        nblocks in any::<u32>(),
        row_type in vec(any::<u8>(), 0..300),
        extra in extra(),
    ) {
        let header = ScanHeader { rel: RelId(rel), nblocks };
        let bytes = encode_scan(&header, &row_type).unwrap();
        prop_assert_eq!(decode_scan(&bytes), Ok((header, row_type)));
        assert_exact(&bytes, &extra, decode_scan);
    }

    #[test]
    fn a_listing_travels_in_pages(blob in vec(any::<u8>(), 0..40_000)) {
        let mut request = Request::Snapshots { offset: 0 };
        let mut pages = Pages::new();
        while !pages.is_complete() {
            *request.offset_mut().unwrap() = pages.next_offset();
            let offset = *request.offset_mut().unwrap();
            let bytes = Reply::Page(Page::slice(&blob, offset).unwrap())
                .encode(Kind::Snapshots)
                .unwrap();
            prop_assert!(bytes.len() <= MAX_MESSAGE_BYTES);
            let Ok(Ok(Reply::Page(page))) = decode_answer(Kind::Snapshots, &bytes) else {
                panic!("a page answers Snapshots");
            };
            pages.add(page).unwrap();
        }
        prop_assert_eq!(pages.into_bytes(), Ok(blob));
    }

    #[test]
    fn arbitrary_bytes_never_panic(tag in 0u32..14, bytes in vec(any::<u8>(), 0..600)) {
        let _ = Request::decode(tag, &bytes);
        for kind in Kind::ALL {
            let _ = decode_answer(kind, &bytes);
        }
        let _ = decode_snapshots(&bytes);
        let _ = decode_tables(&bytes);
        let _ = decode_groups(&bytes);
        let _ = decode_scan(&bytes);
    }

    #[test]
    fn arbitrary_bodies_after_a_valid_header_never_panic(
        kind in kind(),
        head in 0u8..10,
        body in vec(any::<u8>(), 0..600),
    ) {
        // Past the version and tag bytes, so the field decoders themselves are exercised.
        let mut request = vec![VERSION, kind.tag() as u8];
        request.extend_from_slice(&body);
        let _ = Request::decode(kind.tag(), &request);
        let mut answer = vec![VERSION, head % 2, head];
        answer.extend_from_slice(&body);
        let _ = decode_answer(kind, &answer);
        for listing in 1..=4u8 {
            let mut blob = vec![listing];
            blob.extend_from_slice(&body);
            let _ = (decode_snapshots(&blob), decode_tables(&blob), decode_groups(&blob));
            let _ = decode_scan(&blob);
        }
    }
}
