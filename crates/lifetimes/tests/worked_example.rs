//! The worked example of `README.md`: a timeline, a policy, and what it keeps and why.
//! If this test changes, update the README (`cargo test --release -p gsnap-lifetimes
//! --test worked_example -- --nocapture` prints the table).

use gsnap_lifetimes::*;

const TIMELINE: [(u32, u32, u32, u32, u32); 14] = [
    // (month, day, hour, minute, second) in 2024, UTC
    (2, 28, 9, 0, 0),
    (2, 28, 15, 0, 0),
    (2, 29, 9, 0, 0),
    (3, 1, 9, 0, 0),
    (3, 1, 21, 0, 0),
    (3, 4, 8, 0, 0),
    (3, 4, 12, 0, 0),
    (3, 5, 8, 0, 0),
    (3, 5, 9, 0, 0),
    (3, 5, 9, 30, 0),
    (3, 5, 9, 30, 20),
    (3, 5, 10, 0, 0),
    (3, 5, 10, 30, 0),
    (3, 5, 11, 0, 0),
];

const EXPECTED: [&str; 14] = [
    "1  2024-02-28 09:00:00  yearly    keep    monthly #2 (2024-02)",
    "2  2024-02-28 15:00:00  hourly    delete  not selected",
    "3  2024-02-29 09:00:00  daily     delete  not selected",
    "4  2024-03-01 09:00:00  monthly   keep    monthly #1 (2024-03)",
    "5  2024-03-01 21:00:00  hourly    keep    pinned",
    "6  2024-03-04 08:00:00  weekly    keep    weekly #1 (2024-W10)",
    "7  2024-03-04 12:00:00  hourly    delete  not selected",
    "8  2024-03-05 08:00:00  daily     keep    daily #1 (2024-03-05)",
    "9  2024-03-05 09:00:00  hourly    keep    hourly #3 (2024-03-05 09:00)",
    "10 2024-03-05 09:30:00  minutely  delete  not selected",
    "11 2024-03-05 09:30:20  none      delete  not selected",
    "12 2024-03-05 10:00:00  hourly    keep    within",
    "13 2024-03-05 10:30:00  minutely  keep    within",
    "14 2024-03-05 11:00:00  hourly    keep    newest #1",
];

fn row(d: &Decision, taken: (u32, u32, u32, u32, u32)) -> String {
    let (mo, day, h, mi, s) = taken;
    format!(
        "{:<2} 2024-{mo:02}-{day:02} {h:02}:{mi:02}:{s:02}  {:<8}  {:<6}  {}",
        d.id,
        d.rank.to_string(),
        if d.keep() { "keep" } else { "delete" },
        d.rule
    )
}

#[test]
fn worked_example() {
    let times: Vec<i64> = TIMELINE
        .iter()
        .map(|&(mo, d, h, mi, s)| utc_timestamp_us(2024, mo, d, h, mi, s).unwrap())
        .collect();
    let mut snapshots = SnapshotInfo::timeline(&times);
    snapshots[4].pinned = true; // snapshot 5
    let policy = Policy::parse("within=1h hourly=3 daily=3 weekly=2 monthly=2").unwrap();
    let decisions = decide(&snapshots, &policy, 1);
    let rows: Vec<String> = decisions
        .iter()
        .zip(TIMELINE)
        .map(|(d, taken)| row(d, taken))
        .collect();
    for r in &rows {
        println!("{r}");
    }
    assert_eq!(rows, EXPECTED);

    // A size cap: 14 snapshots freeing 10 bytes each, 140 bytes live, a cap of 70. The
    // policy frees 50; the cap takes the lowest rank first (13, minutely), then the oldest
    // hourly (9). Pinned 5 and newest 14 are never candidates.
    let mut capped = decisions.clone();
    let thinning = thin_to_cap(&mut capped, 140, 70, |_| 10);
    assert_eq!(thinning.deleted, [13, 9]);
    assert_eq!((thinning.estimated_bytes, thinning.cap_met), (70, true));
    let thinning = thin_to_cap(&mut decisions.clone(), 140, 0, |_| 10);
    assert_eq!(thinning.deleted, [13, 9, 12, 8, 6, 4, 1]);
    assert_eq!((thinning.estimated_bytes, thinning.cap_met), (20, false));
}
