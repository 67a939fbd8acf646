//! Property tests of the calendar: every timestamp lies in its bucket, buckets follow each
//! other, and coarser boundaries are finer boundaries (except week vs month).

use gsnap_lifetimes::*;
use proptest::prelude::*;

/// Timestamps anywhere in `i64`, and many in PostgreSQL's range near boundaries.
fn timestamp() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        (-4713i64..294_276, 1u32..=12, 1u32..=31, 0i64..3).prop_filter_map(
            "a real date",
            |(y, m, d, off)| utc_timestamp_us(y, m, d, 0, 0, 0).map(|t| t - 1 + off)
        ),
        -3 * US_PER_DAY..3 * US_PER_DAY,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn a_timestamp_lies_in_its_bucket(t in timestamp()) {
        for level in Level::ALL {
            let b = level.bucket(t);
            prop_assert!(b.start_us() <= t);
            let next = b.next();
            if next.start_us() < i64::MAX {
                prop_assert!(t < next.start_us());
                prop_assert_eq!(level.bucket(next.start_us()), next);
                prop_assert_eq!(level.bucket(next.start_us() - 1), b);
            }
            if b.start_us() > i64::MIN {
                prop_assert_eq!(level.bucket(b.start_us()), b);
                prop_assert_eq!(level.bucket(b.start_us() - 1).index, b.index - 1);
            }
        }
    }

    #[test]
    fn buckets_never_decrease(a in timestamp(), b in timestamp()) {
        let (lo, hi) = (a.min(b), a.max(b));
        for level in Level::ALL {
            prop_assert!(level.bucket(lo) <= level.bucket(hi));
        }
    }

    #[test]
    fn boundaries_nest(t in timestamp()) {
        for coarse in Level::ALL {
            let start = coarse.bucket(t).start_us();
            if start == i64::MIN {
                continue;
            }
            for fine in Level::ALL.into_iter().filter(|l| *l < coarse) {
                if fine == Level::Weekly {
                    continue; // months and years do not start on Mondays
                }
                prop_assert_eq!(fine.bucket(start).start_us(), start, "{:?} in {:?}", coarse, fine);
            }
        }
    }

    #[test]
    fn starts_are_the_calendar_starts(y in -4713i64..294_000, m in 1u32..=12, d in 1u32..=28) {
        let day = utc_timestamp_us(y, m, d, 13, 14, 15).unwrap();
        let month = Level::Monthly.bucket(day);
        prop_assert_eq!(month.start_us(), utc_timestamp_us(y, m, 1, 0, 0, 0).unwrap());
        prop_assert_eq!(month.index, y * 12 + i64::from(m) - 1);
        prop_assert_eq!(Level::Yearly.bucket(day).start_us(), utc_timestamp_us(y, 1, 1, 0, 0, 0).unwrap());
        prop_assert_eq!(Level::Daily.bucket(day).start_us(), utc_timestamp_us(y, m, d, 0, 0, 0).unwrap());
        prop_assert_eq!(Level::Hourly.bucket(day).start_us(), utc_timestamp_us(y, m, d, 13, 0, 0).unwrap());
        // A week starts on a Monday at most 6 days before, and 1970-01-05 was a Monday.
        let week = Level::Weekly.bucket(day).start_us();
        let monday = utc_timestamp_us(1970, 1, 5, 0, 0, 0).unwrap();
        prop_assert_eq!((week - monday).rem_euclid(7 * US_PER_DAY), 0);
        prop_assert!(day - week < 7 * US_PER_DAY);
    }
}
