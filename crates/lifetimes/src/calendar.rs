//! UTC calendar arithmetic and the bucket of each level that holds a timestamp.
//!
//! Timestamps are microseconds since 1970-01-01 00:00:00 UTC (PostgreSQL's `timestamptz`
//! moved to the Unix epoch), read in the proleptic Gregorian calendar with a year 0 (1 BC is
//! year 0, 2 BC is year -1) and no leap seconds. Everything is UTC: a "day" starts at
//! 00:00 UTC whatever the server's time zone, so decisions do not change with `TimeZone`.
//!
//! A [`Bucket`] is a level and an `index` that counts that level's periods:
//!
//! | level    | index                                  | a bucket starts at            |
//! |----------|----------------------------------------|-------------------------------|
//! | minutely | minutes since the epoch                | hh:mm:00                      |
//! | hourly   | hours since the epoch                  | hh:00:00                      |
//! | daily    | days since the epoch                   | 00:00:00                      |
//! | weekly   | weeks since Monday 1969-12-29          | Monday 00:00:00 (ISO week)    |
//! | monthly  | `year * 12 + month - 1`                | the 1st of the month 00:00:00 |
//! | yearly   | the year                               | January 1st 00:00:00          |
//!
//! Invariants (unit and property tested): indexes never decrease as time grows, consecutive
//! indexes are consecutive periods, and `start_us(containing(t)) <= t < start_us(next)`.
//! Every boundary is a boundary of each finer level on the chain minutely < hourly < daily,
//! and weekly and monthly boundaries are day boundaries, yearly ones monthly boundaries; a
//! week and a month do not nest (see `level.rs` for what the ranks make of that).
//! Indexes are computed with floor division and never overflow for any `i64` timestamp.

use crate::level::Level;
use std::fmt;

pub const US_PER_SECOND: i64 = 1_000_000;
pub const US_PER_MINUTE: i64 = 60 * US_PER_SECOND;
pub const US_PER_HOUR: i64 = 60 * US_PER_MINUTE;
pub const US_PER_DAY: i64 = 24 * US_PER_HOUR;

/// Days in a 400-year Gregorian cycle (the calendar repeats after it).
const DAYS_PER_CYCLE: i64 = 146_097;
/// Days from 0000-01-01 to 1970-01-01.
const DAYS_YEAR0_TO_EPOCH: i64 = 719_528;
/// Days before each month's first day in a common year.
const DAYS_BEFORE_MONTH: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];

pub(crate) fn is_leap_year(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

pub(crate) fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from the start of a 400-year cycle (a year divisible by 400) to the start of its
/// year `r`, `0 <= r <= 400`: 365 a year plus one per leap year among years `0..r`.
fn days_before_year_in_cycle(r: i64) -> i64 {
    // Years 0..r of the cycle divisible by 4, by 100 and by 400 (year 0 is all three).
    let leap_years = (r + 3) / 4 - (r + 99) / 100 + (r + 399) / 400;
    365 * r + leap_years
}

fn days_before_month(year: i64, month: u32) -> i64 {
    let leap_day = i64::from(month > 2 && is_leap_year(year));
    DAYS_BEFORE_MONTH[(month - 1) as usize] + leap_day
}

/// Days since 1970-01-01 of a date; `month` is 1..=12, `day` 1..=31 (not checked here).
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let cycle = year.div_euclid(400);
    let year_in_cycle = year.rem_euclid(400);
    cycle * DAYS_PER_CYCLE
        + days_before_year_in_cycle(year_in_cycle)
        + days_before_month(year, month)
        + i64::from(day)
        - 1
        - DAYS_YEAR0_TO_EPOCH
}

/// The date (year, month 1..=12, day 1..=31) of a day number since 1970-01-01.
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let since_year0 = days + DAYS_YEAR0_TO_EPOCH;
    let cycle = since_year0.div_euclid(DAYS_PER_CYCLE);
    let day_in_cycle = since_year0.rem_euclid(DAYS_PER_CYCLE);
    // No year is longer than 366 days, so this guess is never too high, and it is at most
    // a few years too low.
    let mut year_in_cycle = day_in_cycle / 366;
    while days_before_year_in_cycle(year_in_cycle + 1) <= day_in_cycle {
        year_in_cycle += 1;
    }
    let year = cycle * 400 + year_in_cycle;
    let day_in_year = day_in_cycle - days_before_year_in_cycle(year_in_cycle);
    let mut month = 12;
    while days_before_month(year, month) > day_in_year {
        month -= 1;
    }
    let day = day_in_year - days_before_month(year, month) + 1;
    (year, month, day as u32)
}

/// The timestamp of a UTC date and time, or `None` if the date or time does not exist or
/// the result does not fit in an `i64`.
pub fn utc_timestamp_us(
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
) -> Option<i64> {
    if !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    // Years beyond this range are outside any i64 timestamp; the check also keeps the
    // day arithmetic below from overflowing.
    if !(-300_000..=300_000).contains(&year) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
    days.checked_mul(US_PER_DAY)?
        .checked_add(seconds * US_PER_SECOND)
}

/// One period of one level: the snapshots taken in it share a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket {
    pub level: Level,
    /// Counts the level's periods (see the table in the module comment); grows with time.
    pub index: i64,
}

impl Bucket {
    /// The bucket of `level` that holds the timestamp `t_us`.
    pub fn containing(level: Level, t_us: i64) -> Bucket {
        let days = t_us.div_euclid(US_PER_DAY);
        let index = match level {
            Level::Minutely => t_us.div_euclid(US_PER_MINUTE),
            Level::Hourly => t_us.div_euclid(US_PER_HOUR),
            Level::Daily => days,
            // 1970-01-01 was a Thursday: day -3 was a Monday, the start of week 0.
            Level::Weekly => (days + 3).div_euclid(7),
            Level::Monthly => {
                let (year, month, _) = civil_from_days(days);
                year * 12 + i64::from(month) - 1
            }
            Level::Yearly => civil_from_days(days).0,
        };
        Bucket { level, index }
    }

    /// The first microsecond of the bucket (saturated to `i64::MIN` for the few buckets
    /// that begin before the earliest `i64` timestamp).
    pub fn start_us(self) -> i64 {
        let start = i128::from(self.start_day()) * i128::from(US_PER_DAY)
            + i128::from(self.start_within_day_us());
        i64::try_from(start).unwrap_or(if start < 0 { i64::MIN } else { i64::MAX })
    }

    /// The bucket right after this one.
    pub fn next(self) -> Bucket {
        Bucket {
            level: self.level,
            index: self.index.saturating_add(1),
        }
    }

    /// The day (since the epoch) the bucket starts on.
    fn start_day(self) -> i64 {
        match self.level {
            Level::Minutely => self.index.div_euclid(24 * 60),
            Level::Hourly => self.index.div_euclid(24),
            Level::Daily => self.index,
            Level::Weekly => self.index * 7 - 3,
            Level::Monthly => days_from_civil(
                self.index.div_euclid(12),
                self.index.rem_euclid(12) as u32 + 1,
                1,
            ),
            Level::Yearly => days_from_civil(self.index, 1, 1),
        }
    }

    fn start_within_day_us(self) -> i64 {
        match self.level {
            Level::Minutely => self.index.rem_euclid(24 * 60) * US_PER_MINUTE,
            Level::Hourly => self.index.rem_euclid(24) * US_PER_HOUR,
            _ => 0,
        }
    }
}

/// The bucket as people write it: `2024-03-05 14:07` (minutely), `2024-03-05 14:00`
/// (hourly), `2024-03-05`, `2024-W10` (ISO week and week-year), `2024-03`, `2024`.
impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month, day) = civil_from_days(self.start_day());
        let within_day = self.start_within_day_us();
        let (hour, minute) = (
            within_day / US_PER_HOUR,
            within_day % US_PER_HOUR / US_PER_MINUTE,
        );
        match self.level {
            Level::Minutely | Level::Hourly => {
                write!(f, "{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}")
            }
            Level::Daily => write!(f, "{year:04}-{month:02}-{day:02}"),
            Level::Weekly => {
                // An ISO week belongs to the year of its Thursday and is numbered from the
                // week holding that year's first Thursday.
                let thursday = self.start_day() + 3;
                let (week_year, _, _) = civil_from_days(thursday);
                let week = (thursday - days_from_civil(week_year, 1, 1)) / 7 + 1;
                write!(f, "{week_year:04}-W{week:02}")
            }
            Level::Monthly => write!(f, "{year:04}-{month:02}"),
            Level::Yearly => write!(f, "{year:04}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        utc_timestamp_us(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn known_day_numbers() {
        // Checked against Python's datetime.date.
        let known = [
            ((1970, 1, 1), 0),
            ((1969, 12, 31), -1),
            ((2000, 2, 29), 11_016),
            ((2000, 3, 1), 11_017),
            ((1900, 2, 28), -25_509),
            ((1900, 3, 1), -25_508),
            ((2100, 3, 1), 47_541),
            ((1600, 1, 1), -135_140),
            ((1, 1, 1), -719_162),
            ((9999, 12, 31), 2_932_896),
            ((2024, 12, 30), 20_087),
        ];
        for ((y, m, d), days) in known {
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
            assert_eq!(civil_from_days(days), (y, m, d), "{days}");
        }
    }

    #[test]
    fn every_day_from_1600_to_2400_follows_the_previous_one() {
        let mut date = (1600, 1, 1);
        let mut days = days_from_civil(1600, 1, 1);
        while date.0 < 2400 {
            assert_eq!(civil_from_days(days), date);
            assert_eq!(days_from_civil(date.0, date.1, date.2), days);
            let (y, m, d) = date;
            date = if d < days_in_month(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            days += 1;
        }
    }

    #[test]
    fn leap_years() {
        assert!(is_leap_year(2000) && is_leap_year(2024) && is_leap_year(0) && is_leap_year(-4));
        assert!(!is_leap_year(1900) && !is_leap_year(2100) && !is_leap_year(2023));
        assert!(utc_timestamp_us(2023, 2, 29, 0, 0, 0).is_none());
        assert!(utc_timestamp_us(2024, 2, 29, 0, 0, 0).is_some());
        assert!(utc_timestamp_us(2024, 4, 31, 0, 0, 0).is_none());
        assert!(utc_timestamp_us(2024, 1, 1, 24, 0, 0).is_none());
    }

    #[test]
    fn buckets_of_known_timestamps() {
        let t = ts(2024, 2, 29, 23, 59, 59);
        let start = |level| Bucket::containing(level, t).start_us();
        assert_eq!(start(Level::Minutely), ts(2024, 2, 29, 23, 59, 0));
        assert_eq!(start(Level::Hourly), ts(2024, 2, 29, 23, 0, 0));
        assert_eq!(start(Level::Daily), ts(2024, 2, 29, 0, 0, 0));
        assert_eq!(start(Level::Weekly), ts(2024, 2, 26, 0, 0, 0)); // a Monday
        assert_eq!(start(Level::Monthly), ts(2024, 2, 1, 0, 0, 0));
        assert_eq!(start(Level::Yearly), ts(2024, 1, 1, 0, 0, 0));
        let next_month = Bucket::containing(Level::Monthly, t).next();
        assert_eq!(next_month.start_us(), ts(2024, 3, 1, 0, 0, 0));
        let next_year = Bucket::containing(Level::Yearly, t).next();
        assert_eq!(next_year.start_us(), ts(2025, 1, 1, 0, 0, 0));
    }

    #[test]
    fn weeks_cross_year_boundaries() {
        // 2024-12-30 (Monday) .. 2025-01-05 is ISO week 2025-W01.
        let w = Bucket::containing(Level::Weekly, ts(2025, 1, 3, 12, 0, 0));
        assert_eq!(w.start_us(), ts(2024, 12, 30, 0, 0, 0));
        assert_eq!(
            w,
            Bucket::containing(Level::Weekly, ts(2024, 12, 30, 0, 0, 0))
        );
        assert_eq!(w.to_string(), "2025-W01");
        // 2021-01-03 (Sunday) is in 2020-W53; the next day starts 2021-W01.
        let sunday = Bucket::containing(Level::Weekly, ts(2021, 1, 3, 23, 59, 59));
        assert_eq!(sunday.to_string(), "2020-W53");
        assert_eq!(sunday.next().start_us(), ts(2021, 1, 4, 0, 0, 0));
        assert_eq!(sunday.next().to_string(), "2021-W01");
        // 2023-01-01 (Sunday) is in 2022-W52.
        assert_eq!(
            Bucket::containing(Level::Weekly, ts(2023, 1, 1, 0, 0, 0)).to_string(),
            "2022-W52"
        );
    }

    #[test]
    fn timestamps_before_1970() {
        let t = ts(1969, 12, 31, 23, 59, 59) + 999_999;
        assert_eq!(t, -1);
        assert_eq!(Bucket::containing(Level::Daily, t).index, -1);
        assert_eq!(
            Bucket::containing(Level::Minutely, t).start_us(),
            -US_PER_MINUTE
        );
        assert_eq!(Bucket::containing(Level::Yearly, t).index, 1969);
        assert_eq!(Bucket::containing(Level::Monthly, t).to_string(), "1969-12");
        // 1969-12-31 is a Wednesday in the week starting Monday 1969-12-29 (ISO 1970-W01).
        let w = Bucket::containing(Level::Weekly, t);
        assert_eq!((w.index, w.start_us()), (0, ts(1969, 12, 29, 0, 0, 0)));
        assert_eq!(w.to_string(), "1970-W01");
        // 1900 is not a leap year; 1600 is.
        assert_eq!(
            Bucket::containing(Level::Monthly, ts(1900, 2, 28, 12, 0, 0))
                .next()
                .start_us(),
            ts(1900, 3, 1, 0, 0, 0)
        );
        assert_eq!(
            Bucket::containing(Level::Daily, ts(1600, 2, 28, 12, 0, 0))
                .next()
                .start_us(),
            ts(1600, 2, 29, 0, 0, 0)
        );
    }

    #[test]
    fn display() {
        let t = ts(2024, 3, 5, 14, 7, 30);
        let show = |level| Bucket::containing(level, t).to_string();
        assert_eq!(show(Level::Minutely), "2024-03-05 14:07");
        assert_eq!(show(Level::Hourly), "2024-03-05 14:00");
        assert_eq!(show(Level::Daily), "2024-03-05");
        assert_eq!(show(Level::Weekly), "2024-W10");
        assert_eq!(show(Level::Monthly), "2024-03");
        assert_eq!(show(Level::Yearly), "2024");
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        for t in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
            for level in Level::ALL {
                let b = Bucket::containing(level, t);
                assert!(b.start_us() <= t, "{level:?} {t}");
                let _ = b.next().start_us();
                let _ = b.to_string();
            }
        }
    }
}
