//! A retention policy in the words of restic, borg and sanoid.
//!
//! `within=2h minutely=10 hourly=48 daily=30 weekly=8 monthly=12 yearly=unlimited`:
//! rules separated by spaces or commas (`hourly = 48` is read as `hourly=48`), each at most
//! once, in any order, keys ASCII case-insensitive:
//!
//! - `within=<duration>` keeps every snapshot taken at most that long before the newest
//!   snapshot (see `duration.rs` for the syntax: `2h`, `1h30m`, `2w`);
//! - `minutely|hourly|daily|weekly|monthly|yearly=<count>|unlimited` keeps the members of
//!   the `count` most recent buckets of that level that hold a member (see `decide.rs`).
//!
//! The rules are a union: a snapshot is kept if any rule keeps it. The empty policy (no
//! rule) keeps everything; a policy with rules deletes what no rule keeps. A count is at
//! least 1 and a duration positive: a rule that would keep nothing is refused (leave it
//! out). `Display` writes the canonical form (rules in the order above, canonical
//! durations, single spaces), which parses back to an equal `Policy`.

use crate::duration::{format_seconds, parse_seconds, MAX_SECONDS};
use crate::error::{DurationProblem, PolicyError, PolicyProblem};
use crate::level::Level;
use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

/// How many buckets of a level a policy keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Keep {
    /// The most recent `n` buckets that hold a member.
    Last(NonZeroU32),
    /// Every bucket that holds a member.
    Unlimited,
}

impl Keep {
    /// Whether the bucket of this age (1 = the most recent holding a member) is kept.
    pub fn keeps_age(self, age: u32) -> bool {
        match self {
            Keep::Last(n) => age <= n.get(),
            Keep::Unlimited => true,
        }
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keep::Last(n) => write!(f, "{n}"),
            Keep::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// A retention policy: an optional `within` window and a count per level.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Policy {
    within_seconds: Option<NonZeroU64>,
    keep: [Option<Keep>; 6],
}

impl Policy {
    /// The empty policy: keeps every snapshot.
    pub fn keep_all() -> Policy {
        Policy::default()
    }

    /// Whether the policy has no rule (and so keeps everything).
    pub fn is_keep_all(&self) -> bool {
        self.within_seconds.is_none() && self.keep.iter().all(Option::is_none)
    }

    /// The `within` window.
    pub fn within(&self) -> Option<Duration> {
        self.within_seconds.map(|s| Duration::from_secs(s.get()))
    }

    /// The `within` window in microseconds.
    pub fn within_us(&self) -> Option<i64> {
        // At most MAX_SECONDS, so this does not overflow.
        self.within_seconds.map(|s| s.get() as i64 * 1_000_000)
    }

    /// The count kept at `level`, if the policy has that rule.
    pub fn keep(&self, level: Level) -> Option<Keep> {
        self.keep[level.position()]
    }

    /// The policy with this `within` window (whole seconds, at most [`MAX_SECONDS`]; `None`
    /// or less than a second removes the rule).
    pub fn with_within(mut self, within: Option<Duration>) -> Policy {
        self.within_seconds = within
            .map(|d| d.as_secs().min(MAX_SECONDS))
            .and_then(NonZeroU64::new);
        self
    }

    /// The policy with this count at `level` (`None` removes the rule).
    pub fn with_keep(mut self, level: Level, keep: Option<Keep>) -> Policy {
        self.keep[level.position()] = keep;
        self
    }

    /// Parses a policy; the error names the first bad rule.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let mut policy = Policy::keep_all();
        // The part that set each rule, for duplicate errors: within, then the levels.
        let mut given: [Option<String>; 7] = Default::default();
        for part in rule_parts(text) {
            let (key, value) = match part.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (part.as_str(), None),
            };
            let (slot, key) = if key.eq_ignore_ascii_case("within") {
                (0, "within")
            } else if let Some(level) = Level::from_name(key) {
                (1 + level.position(), level.name())
            } else {
                let problem = PolicyProblem::UnknownRule {
                    key: key.to_string(),
                };
                return Err(PolicyError::new(&part, problem));
            };
            if let Some(first) = &given[slot] {
                let problem = PolicyProblem::DuplicateRule {
                    key,
                    first: first.clone(),
                };
                return Err(PolicyError::new(&part, problem));
            }
            let value = value
                .filter(|value| !value.is_empty())
                .ok_or_else(|| PolicyError::new(&part, PolicyProblem::MissingValue { key }))?;
            if slot == 0 {
                policy.within_seconds =
                    Some(parse_within(value).map_err(|p| PolicyError::new(&part, p))?);
            } else {
                policy.keep[slot - 1] =
                    Some(parse_count(key, value).map_err(|p| PolicyError::new(&part, p))?);
            }
            given[slot] = Some(part);
        }
        Ok(policy)
    }
}

/// The rules of a policy text: split at whitespace and commas, then `key`, `=`, `value`
/// pieces glued back together (`hourly = 48`, `hourly= 48`, `hourly =48`).
fn rule_parts(text: &str) -> Vec<String> {
    let mut pieces = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|piece| !piece.is_empty())
        .peekable();
    let mut parts = Vec::new();
    while let Some(piece) = pieces.next() {
        let mut part = piece.to_string();
        loop {
            let glue = match pieces.peek() {
                Some(next) if next.starts_with('=') => !part.contains('='),
                Some(next) if part.ends_with('=') => {
                    !next.contains('=') && part.matches('=').count() == 1
                }
                _ => false,
            };
            if !glue {
                break;
            }
            part.push_str(pieces.next().unwrap_or_default());
        }
        parts.push(part);
    }
    parts
}

fn parse_within(value: &str) -> Result<NonZeroU64, PolicyProblem> {
    if value.eq_ignore_ascii_case("unlimited") {
        return Err(PolicyProblem::UnlimitedWithin);
    }
    let bad = |reason| PolicyProblem::BadDuration {
        value: value.to_string(),
        reason,
    };
    let seconds = parse_seconds(value).map_err(bad)?;
    NonZeroU64::new(seconds).ok_or_else(|| bad(DurationProblem::NotPositive))
}

fn parse_count(key: &'static str, value: &str) -> Result<Keep, PolicyProblem> {
    if value.eq_ignore_ascii_case("unlimited") {
        return Ok(Keep::Unlimited);
    }
    let digits = value.strip_prefix('-').unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PolicyProblem::BadCount {
            value: value.to_string(),
        });
    }
    if value.starts_with('-') {
        return Err(PolicyProblem::CountNotPositive { key });
    }
    let count: u32 = match digits.parse::<u64>() {
        Ok(n) => u32::try_from(n).map_err(|_| PolicyProblem::CountTooLarge)?,
        Err(_) => return Err(PolicyProblem::CountTooLarge),
    };
    NonZeroU32::new(count)
        .map(Keep::Last)
        .ok_or(PolicyProblem::CountNotPositive { key })
}

/// The canonical form: `within=1h30m minutely=10 ... yearly=unlimited`; empty for the
/// empty policy.
impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rules = Vec::new();
        if let Some(seconds) = self.within_seconds {
            rules.push(format!("within={}", format_seconds(seconds.get())));
        }
        for level in Level::ALL {
            if let Some(keep) = self.keep(level) {
                rules.push(format!("{level}={keep}"));
            }
        }
        f.write_str(&rules.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Policy::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_the_example() {
        let text = "within=2h minutely=10 hourly=48 daily=30 weekly=8 monthly=12 yearly=unlimited";
        let p = Policy::parse(text).unwrap();
        assert_eq!(p.within(), Some(Duration::from_secs(7200)));
        assert_eq!(
            p.keep(Level::Hourly),
            Some(Keep::Last(NonZeroU32::new(48).unwrap()))
        );
        assert_eq!(p.keep(Level::Yearly), Some(Keep::Unlimited));
        assert_eq!(p.to_string(), text);
        assert!(!p.is_keep_all());
    }

    #[test]
    fn empty_keeps_all() {
        for text in ["", "   ", " , ,\n"] {
            let p = Policy::parse(text).unwrap();
            assert!(p.is_keep_all());
            assert_eq!(p.to_string(), "");
        }
    }

    #[test]
    fn lenient_layout_canonical_output() {
        let p = Policy::parse("  Daily = 7,yearly=UNLIMITED\twithin= 90m hourly =24 ").unwrap();
        assert_eq!(
            p.to_string(),
            "within=1h30m hourly=24 daily=7 yearly=unlimited"
        );
        assert_eq!(Policy::parse(&p.to_string()).unwrap(), p);
    }

    #[test]
    fn errors_name_the_bad_part() {
        assert_eq!(
            err("daily=7 hourlyy=5"),
            "'hourlyy=5': unknown rule 'hourlyy' (expected within, minutely, hourly, daily, weekly, monthly or yearly)"
        );
        assert_eq!(err("keep"), "'keep': unknown rule 'keep' (expected within, minutely, hourly, daily, weekly, monthly or yearly)");
        assert_eq!(
            err("hourly"),
            "'hourly': missing value (write hourly=<count> or hourly=unlimited)"
        );
        assert_eq!(
            err("hourly= daily=3"),
            "'hourly=': missing value (write hourly=<count> or hourly=unlimited)"
        );
        assert_eq!(
            err("within="),
            "'within=': missing value (write within=<duration>, e.g. within=2h)"
        );
        assert_eq!(
            err("hourly=48 hourly=24"),
            "'hourly=24': duplicate rule 'hourly' (already given as 'hourly=48')"
        );
        assert_eq!(
            err("Within=2h within=1h"),
            "'within=1h': duplicate rule 'within' (already given as 'Within=2h')"
        );
        assert_eq!(
            err("daily=7x"),
            "'daily=7x': bad count '7x' (expected a positive whole number or 'unlimited')"
        );
        assert_eq!(
            err("daily=+7"),
            "'daily=+7': bad count '+7' (expected a positive whole number or 'unlimited')"
        );
        assert_eq!(
            err("daily=0"),
            "'daily=0': count must be at least 1 (leave the rule out to keep no daily snapshots)"
        );
        assert_eq!(
            err("daily=-3"),
            "'daily=-3': count must be at least 1 (leave the rule out to keep no daily snapshots)"
        );
        assert_eq!(
            err("daily=4294967296"),
            "'daily=4294967296': count is too large (at most 4294967295; or write 'unlimited')"
        );
        assert_eq!(err("within=unlimited"), "'within=unlimited': within takes a duration such as 2h or 1d12h (an empty policy keeps everything)");
        assert_eq!(err("within=2"), "'within=2': bad duration '2': missing unit after '2' (use s, m or min, h, d or w, e.g. 2h)");
        assert_eq!(
            err("within=2y"),
            "'within=2y': bad duration '2y': unknown unit 'y' (use s, m or min, h, d or w)"
        );
        assert_eq!(
            err("within=1.5h"),
            "'within=1.5h': bad duration '1.5h': whole numbers only (write 1h30m, not 1.5h)"
        );
        assert_eq!(err("within=30m1h"), "'within=30m1h': bad duration '30m1h': unit 'h' repeated or out of order (largest first, each once, e.g. 1d12h)");
        assert_eq!(
            err("within=0s"),
            "'within=0s': bad duration '0s': must be positive"
        );
        assert_eq!(
            err("within=-1h"),
            "'within=-1h': bad duration '-1h': must be positive"
        );
        assert_eq!(
            err("daily=1=2"),
            "'daily=1=2': bad count '1=2' (expected a positive whole number or 'unlimited')"
        );
    }

    #[test]
    fn the_first_bad_part_is_reported() {
        let e = Policy::parse("hourly=x daily=y").unwrap_err();
        assert_eq!(e.part, "hourly=x");
        assert_eq!(e.problem, PolicyProblem::BadCount { value: "x".into() });
    }

    #[test]
    fn builders() {
        let p = Policy::keep_all()
            .with_within(Some(Duration::from_secs(5400)))
            .with_keep(Level::Daily, Some(Keep::Unlimited));
        assert_eq!(p.to_string(), "within=1h30m daily=unlimited");
        assert_eq!(p.within_us(), Some(5_400_000_000));
        assert!(p
            .clone()
            .with_within(Some(Duration::from_millis(999)))
            .within()
            .is_none());
        assert!(p
            .with_within(None)
            .with_keep(Level::Daily, None)
            .is_keep_all());
    }
}
