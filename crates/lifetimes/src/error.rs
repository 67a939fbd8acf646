//! The one error type of the crate: a policy (or rank) a user wrote that does not parse.
//!
//! A `PolicyError` names the exact part that is wrong, as the user wrote it, and says what
//! was expected, so the SQL layer only prefixes the setting's name:
//! `gsnap.retention: 'hourlyy=5': unknown rule 'hourlyy' (expected within, minutely,
//! hourly, daily, weekly, monthly or yearly)`.

use std::fmt;

/// A policy or rank that does not parse: the bad part and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// The rule as written (`hourlyy=5`), or the whole text for a rank.
    pub part: String,
    pub problem: PolicyProblem,
}

/// What is wrong with a part of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyProblem {
    /// The key before `=` is not a rule.
    UnknownRule { key: String },
    /// `hourly` or `hourly=` without a value.
    MissingValue { key: &'static str },
    /// The rule was already given (by `first`).
    DuplicateRule { key: &'static str, first: String },
    /// A count is neither a whole number nor `unlimited`.
    BadCount { value: String },
    /// A count of zero or less (the rule would keep nothing: leave it out).
    CountNotPositive { key: &'static str },
    /// A count above `u32::MAX`.
    CountTooLarge,
    /// `within=unlimited`: within takes a duration.
    UnlimitedWithin,
    /// A duration that does not parse; `reason` says why.
    BadDuration {
        value: String,
        reason: DurationProblem,
    },
    /// A rank that is neither 0..=6, `none` nor a level name.
    UnknownRank,
}

/// Why a duration does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DurationProblem {
    /// A number without a unit (`2`).
    MissingUnit { number: String },
    /// A unit that is not s, m, min, h, d or w.
    UnknownUnit { unit: String },
    /// A unit without a number before it (`h`), or a stray character.
    MissingNumber { at: String },
    /// A fraction (`1.5h`).
    Fraction,
    /// Units out of order or repeated (`30m1h`, `1h1h`).
    UnitOrder { unit: String },
    /// Zero or negative.
    NotPositive,
    /// Longer than a timestamp can express.
    TooLong,
}

impl PolicyError {
    pub(crate) fn new(part: &str, problem: PolicyProblem) -> PolicyError {
        PolicyError {
            part: part.to_string(),
            problem,
        }
    }
}

const EXPECTED_RULES: &str = "within, minutely, hourly, daily, weekly, monthly or yearly";
const UNITS: &str = "s, m or min, h, d or w";

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}': ", self.part)?;
        match &self.problem {
            PolicyProblem::UnknownRule { key } => {
                write!(f, "unknown rule '{key}' (expected {EXPECTED_RULES})")
            }
            PolicyProblem::MissingValue { key: "within" } => {
                write!(f, "missing value (write within=<duration>, e.g. within=2h)")
            }
            PolicyProblem::MissingValue { key } => {
                write!(f, "missing value (write {key}=<count> or {key}=unlimited)")
            }
            PolicyProblem::DuplicateRule { key, first } => {
                write!(f, "duplicate rule '{key}' (already given as '{first}')")
            }
            PolicyProblem::BadCount { value } => write!(
                f,
                "bad count '{value}' (expected a positive whole number or 'unlimited')"
            ),
            PolicyProblem::CountNotPositive { key } => write!(
                f,
                "count must be at least 1 (leave the rule out to keep no {key} snapshots)"
            ),
            PolicyProblem::CountTooLarge => {
                write!(
                    f,
                    "count is too large (at most {}; or write 'unlimited')",
                    u32::MAX
                )
            }
            PolicyProblem::UnlimitedWithin => write!(
                f,
                "within takes a duration such as 2h or 1d12h (an empty policy keeps everything)"
            ),
            PolicyProblem::BadDuration { value, reason } => {
                write!(f, "bad duration '{value}': ")?;
                match reason {
                    DurationProblem::MissingUnit { number } => {
                        write!(f, "missing unit after '{number}' (use {UNITS}, e.g. {number}h)")
                    }
                    DurationProblem::UnknownUnit { unit } => {
                        write!(f, "unknown unit '{unit}' (use {UNITS})")
                    }
                    DurationProblem::MissingNumber { at } => {
                        write!(f, "expected a number at '{at}' (e.g. 2h or 1h30m)")
                    }
                    DurationProblem::Fraction => {
                        write!(f, "whole numbers only (write 1h30m, not 1.5h)")
                    }
                    DurationProblem::UnitOrder { unit } => write!(
                        f,
                        "unit '{unit}' repeated or out of order (largest first, each once, e.g. 1d12h)"
                    ),
                    DurationProblem::NotPositive => write!(f, "must be positive"),
                    DurationProblem::TooLong => write!(f, "too long"),
                }
            }
            PolicyProblem::UnknownRank => {
                write!(f, "unknown rank (expected 0..6, none, minutely, hourly, daily, weekly, monthly or yearly)")
            }
        }
    }
}

impl std::error::Error for PolicyError {}
