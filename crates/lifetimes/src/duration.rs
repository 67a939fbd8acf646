//! Durations in policies: `90s`, `2h`, `1h30m`, `2w3d`.
//!
//! A duration is one or more `<whole number><unit>` terms, units largest first and each at
//! most once: `w` (7 days), `d`, `h`, `m` or `min`, `s` (units ASCII case-insensitive). It
//! is positive and at most [`MAX_SECONDS`] (what an `i64` of microseconds holds). The
//! canonical form ([`format_seconds`]) uses the largest units first and leaves zero terms
//! out (`5400` seconds is `1h30m`), and parses back to the same number of seconds.

use crate::calendar::US_PER_SECOND;
use crate::error::DurationProblem;

/// The longest duration, in seconds: the span of `i64` microseconds.
pub const MAX_SECONDS: u64 = (i64::MAX / US_PER_SECOND) as u64;

/// Units, largest first, with their length in seconds; the first name is the canonical one.
const UNITS: [(&[&str], u64); 5] = [
    (&["w"], 7 * 86_400),
    (&["d"], 86_400),
    (&["h"], 3_600),
    (&["m", "min"], 60),
    (&["s"], 1),
];

/// The number of seconds a duration stands for.
pub(crate) fn parse_seconds(text: &str) -> Result<u64, DurationProblem> {
    if text.starts_with('-') {
        return Err(DurationProblem::NotPositive);
    }
    let mut rest = text;
    let mut total: u64 = 0;
    // Index in UNITS of the smallest unit used so far: the next must be smaller.
    let mut last_unit: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(DurationProblem::MissingNumber {
                at: rest.to_string(),
            });
        }
        let (number, after) = rest.split_at(digits);
        if after.starts_with(['.', ',']) {
            return Err(DurationProblem::Fraction);
        }
        let letters = after.len()
            - after
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        if letters == 0 {
            return Err(DurationProblem::MissingUnit {
                number: number.to_string(),
            });
        }
        let (unit, after) = after.split_at(letters);
        let Some(position) = UNITS
            .iter()
            .position(|(names, _)| names.iter().any(|name| name.eq_ignore_ascii_case(unit)))
        else {
            return Err(DurationProblem::UnknownUnit {
                unit: unit.to_string(),
            });
        };
        if last_unit.is_some_and(|last| position <= last) {
            return Err(DurationProblem::UnitOrder {
                unit: unit.to_string(),
            });
        }
        last_unit = Some(position);
        let value: u64 = number.parse().map_err(|_| DurationProblem::TooLong)?;
        total = value
            .checked_mul(UNITS[position].1)
            .and_then(|seconds| total.checked_add(seconds))
            .filter(|&seconds| seconds <= MAX_SECONDS)
            .ok_or(DurationProblem::TooLong)?;
        rest = after;
    }
    if total == 0 {
        return Err(DurationProblem::NotPositive);
    }
    Ok(total)
}

/// The canonical form of a duration: largest units first, zero terms left out.
pub fn format_seconds(seconds: u64) -> String {
    if seconds == 0 {
        return "0s".to_string();
    }
    let mut left = seconds;
    let mut text = String::new();
    for (names, length) in UNITS {
        if left >= length {
            text.push_str(&format!("{}{}", left / length, names[0]));
            left %= length;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_seconds("90s"), Ok(90));
        assert_eq!(parse_seconds("2h"), Ok(7200));
        assert_eq!(parse_seconds("1h30m"), Ok(5400));
        assert_eq!(parse_seconds("1h30min"), Ok(5400));
        assert_eq!(parse_seconds("2W3D"), Ok(17 * 86_400));
        assert_eq!(parse_seconds("1d0h5s"), Ok(86_405));
        assert_eq!(parse_seconds("120m"), Ok(7200));
    }

    #[test]
    fn rejects() {
        use DurationProblem::*;
        assert_eq!(parse_seconds("2"), Err(MissingUnit { number: "2".into() }));
        assert_eq!(
            parse_seconds("1h30"),
            Err(MissingUnit {
                number: "30".into()
            })
        );
        assert_eq!(parse_seconds("2x"), Err(UnknownUnit { unit: "x".into() }));
        assert_eq!(
            parse_seconds("2hours"),
            Err(UnknownUnit {
                unit: "hours".into()
            })
        );
        assert_eq!(parse_seconds("h"), Err(MissingNumber { at: "h".into() }));
        assert_eq!(
            parse_seconds("2h 3m"),
            Err(MissingNumber { at: " 3m".into() })
        );
        assert_eq!(parse_seconds("1.5h"), Err(Fraction));
        assert_eq!(parse_seconds("30m1h"), Err(UnitOrder { unit: "h".into() }));
        assert_eq!(parse_seconds("1h1h"), Err(UnitOrder { unit: "h".into() }));
        assert_eq!(
            parse_seconds("1m2min"),
            Err(UnitOrder { unit: "min".into() })
        );
        assert_eq!(parse_seconds("0s"), Err(NotPositive));
        assert_eq!(parse_seconds("-2h"), Err(NotPositive));
        assert_eq!(parse_seconds("99999999999999999999s"), Err(TooLong));
        assert_eq!(parse_seconds("20000000w"), Err(TooLong));
    }

    #[test]
    fn canonical_form() {
        assert_eq!(format_seconds(5400), "1h30m");
        assert_eq!(format_seconds(7200), "2h");
        assert_eq!(format_seconds(14 * 86_400), "2w");
        assert_eq!(format_seconds(86_405), "1d5s");
        assert_eq!(format_seconds(59), "59s");
        for seconds in [
            1,
            59,
            60,
            61,
            3599,
            3600,
            86_399,
            86_400,
            604_801,
            MAX_SECONDS,
        ] {
            assert_eq!(parse_seconds(&format_seconds(seconds)), Ok(seconds));
        }
    }
}
