//! How much a capture disturbed the database's writes, for `gsnap_progress()` (issue 8: the
//! DBA sees the held horizon and "the worst second" next to each other).
//!
//! The worker reads the next transaction id about once a second: the ids assigned between two
//! readings over the time between them is the rate of write transactions (read-only ones are
//! not counted: they take no id). When a capture has ended (durable), the lowest rate of any
//! interval between readings that overlaps the capture (declaration to end), over the median
//! rate of the minute before the declaration, is its *worst second*: 1 means no dip. It is
//! left unknown when the database wrote too little before the declaration for a rate to mean
//! anything (fewer than [`MIN_BASELINE_PER_S`] transactions a second, or fewer than five
//! readings).

use std::collections::VecDeque;

/// Readings at least this far apart (µs).
const SAMPLE_US: i64 = 1_000_000;
/// How long readings are kept: the baseline minute and a capture after it (µs).
const KEEP_US: i64 = 180_000_000;
/// The minute before a declaration whose median rate is the baseline (µs).
const BASELINE_US: i64 = 60_000_000;
/// Below this many write transactions a second before the declaration, no ratio is given.
const MIN_BASELINE_PER_S: f64 = 5.0;

/// Readings of the next transaction id, and the captures that ended waiting for the reading
/// after their end.
#[derive(Default)]
pub struct WriteRates {
    /// (unix µs, next transaction id), oldest first.
    readings: VecDeque<(i64, u64)>,
    /// Captures ended (declared at, ended at, unix µs), oldest first.
    ended: VecDeque<(i64, i64)>,
}

impl WriteRates {
    /// True if a reading is due at `now_us` (the last one is a second old). The worker's loop
    /// may turn thousands of times a second while it captures: the transaction id counter
    /// (whose lock every writer takes) is read only when a reading is due.
    pub fn due(&self, now_us: i64) -> bool {
        self.readings
            .back()
            .is_none_or(|&(t, _)| now_us - t >= SAMPLE_US)
    }

    /// Notes the next transaction id `next_xid` read at `now_us` (when [`WriteRates::due`]).
    /// Returns the worst second of each capture this reading completes (its intervals are
    /// all read), oldest first: Some(ratio), or None when the baseline is unknown.
    pub fn read(&mut self, now_us: i64, next_xid: u64) -> Vec<Option<f64>> {
        self.readings.push_back((now_us, next_xid));
        while self
            .readings
            .front()
            .is_some_and(|&(t, _)| now_us - t > KEEP_US)
        {
            self.readings.pop_front();
        }
        let mut done = Vec::new();
        while let Some(&(declared, ended)) = self.ended.front() {
            if ended > now_us {
                break;
            }
            self.ended.pop_front();
            done.push(self.worst_second(declared, ended));
        }
        done
    }

    /// A capture declared at `declared_us` ended at `ended_us`; its worst second is given by
    /// the first reading after its end.
    pub fn capture_ended(&mut self, declared_us: i64, ended_us: i64) {
        self.ended
            .push_back((declared_us, ended_us.max(declared_us)));
    }

    /// The rates between consecutive readings: (from, to, transactions per second).
    fn rates(&self) -> impl Iterator<Item = (i64, i64, f64)> + '_ {
        self.readings
            .iter()
            .zip(self.readings.iter().skip(1))
            .map(|(&(t0, x0), &(t1, x1))| {
                let secs = (t1 - t0) as f64 / 1e6;
                (t0, t1, x1.saturating_sub(x0) as f64 / secs)
            })
    }

    /// The lowest rate of the intervals overlapping `declared..=ended` over the median rate
    /// of the intervals in the minute before `declared`.
    fn worst_second(&self, declared: i64, ended: i64) -> Option<f64> {
        let mut before: Vec<f64> = self
            .rates()
            .filter(|&(t0, t1, _)| t0 >= declared - BASELINE_US && t1 <= declared)
            .map(|(_, _, r)| r)
            .collect();
        if before.len() < 5 {
            return None;
        }
        before.sort_by(f64::total_cmp);
        let median = before[before.len() / 2];
        if median < MIN_BASELINE_PER_S {
            return None;
        }
        self.rates()
            .filter(|&(t0, t1, _)| t1 > declared && t0 <= ended)
            .map(|(_, _, r)| r)
            .min_by(f64::total_cmp)
            .map(|worst| worst / median)
    }
}
