//! What a retention policy keeps of a long history, as CSV for `docs/plot_retention.py`
//! (the picture in README.md, "Lifetimes").
//!
//! `cargo run --release -p gsnap-lifetimes --example keep_map -- [POLICY]` prints one line per
//! snapshot of 400 days of hourly snapshots (the cluster down for 3 days 20 days before the
//! end): its age in days at the end, its rank, whether the policy keeps it and the rule.

use gsnap_lifetimes::*;

const HOUR_US: i64 = 3_600_000_000;
const DAYS: i64 = 400;

fn main() {
    let policy_text = std::env::args().nth(1).unwrap_or_else(|| {
        "within=6h hourly=24 daily=14 weekly=8 monthly=12 yearly=unlimited".into()
    });
    let policy = match Policy::parse(&policy_text) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("keep_map: {e}");
            std::process::exit(2);
        }
    };
    let end = utc_timestamp_us(2026, 11, 23, 12, 0, 0).expect("a valid date");
    let start = end - DAYS * 24 * HOUR_US;
    let down = (end - 23 * 24 * HOUR_US)..(end - 20 * 24 * HOUR_US);
    let times: Vec<i64> = (0..=DAYS * 24)
        .map(|h| start + h * HOUR_US)
        .filter(|t| !down.contains(t))
        .collect();
    let snapshots = SnapshotInfo::timeline(&times);
    println!("# policy: {policy_text}");
    println!("age_days,rank,keep,rule");
    for d in decide(&snapshots, &policy, 1) {
        let rule = d.rule.to_string();
        // The rule's level only ("daily #3 (2026-11-20)" -> "daily").
        let rule = rule.split(" #").next().unwrap_or(&rule);
        println!(
            "{:.4},{},{},{}",
            (end - d.taken_at_us) as f64 / (24 * HOUR_US) as f64,
            d.rank,
            u8::from(d.keep()),
            rule
        );
    }
}
