//! Levels, ranks and eager ranking at declaration (Thresher's rank-tree, section 4).
//!
//! The levels are minutely < hourly < daily < weekly < monthly < yearly; a snapshot's *rank*
//! is 0 (none) or one of them (1..=6). A snapshot of rank `r` is a *member* of its bucket at
//! every level `<= r` (Thresher's RT1), and a bucket a policy keeps keeps all its members.
//!
//! **Eager ranks.** A bucket's member is the first snapshot declared at or after the
//! bucket's boundary, so the rank is known when the snapshot is declared: it is the highest
//! level with a boundary in `(prev, taken_at]`, where `prev` is the latest `taken_at` of the
//! snapshots declared before (deleted ones included). The very first snapshot crosses every
//! boundary. A clock that steps backwards crosses nothing until it passes `prev` again, so
//! a bucket never gets two eager members at the level whose boundary it crossed.
//!
//! **Nesting.** Boundaries nest: a minute, hour or day boundary is a boundary of each finer
//! level, and so are the boundaries of a week (Monday 00:00) and of a month (the 1st 00:00),
//! which are day boundaries; a year's boundary is a month's. So the first snapshot of a
//! month is also the first of its day, hour and minute. A week and a month do not nest,
//! and ranks are one chain: the first snapshot of a month that began mid-week has rank
//! monthly, so it is also a member of its *week*, next to that week's own first snapshot
//! (the one after Monday 00:00). A kept week then keeps both: at most one extra snapshot per
//! month, and in exchange a rank alone says which buckets a snapshot belongs to (storage
//! keeps one byte, and raising a rank means the same thing whether done early or late).
//! [`levels_at_declaration`] returns the boundaries actually crossed, [`LevelSet::highest`]
//! the rank.
//!
//! **Lazy ranks.** A user may give a snapshot an explicit rank later; its rank is then
//! `max(eager, explicit)` ([`Rank::raise`]): it joins the buckets of every level up to the
//! new rank as an extra member. The eager rank is a floor (it records a fact about the
//! timeline); an explicit rank can only add memberships.

use crate::calendar::Bucket;
use crate::error::{PolicyError, PolicyProblem};
use std::fmt;

/// A level of the rank-tree, finest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Minutely = 1,
    Hourly = 2,
    Daily = 3,
    Weekly = 4,
    Monthly = 5,
    Yearly = 6,
}

impl Level {
    /// Every level, finest first.
    pub const ALL: [Level; 6] = [
        Level::Minutely,
        Level::Hourly,
        Level::Daily,
        Level::Weekly,
        Level::Monthly,
        Level::Yearly,
    ];

    /// The name used in policies: `minutely` ... `yearly`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Minutely => "minutely",
            Level::Hourly => "hourly",
            Level::Daily => "daily",
            Level::Weekly => "weekly",
            Level::Monthly => "monthly",
            Level::Yearly => "yearly",
        }
    }

    /// The level of a name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL
            .into_iter()
            .find(|level| level.name().eq_ignore_ascii_case(name))
    }

    /// The rank whose highest level this is.
    pub fn rank(self) -> Rank {
        Rank(self as u8)
    }

    /// The bucket of this level holding `t_us`.
    pub fn bucket(self, t_us: i64) -> Bucket {
        Bucket::containing(self, t_us)
    }

    /// 0 for minutely .. 5 for yearly.
    pub(crate) fn position(self) -> usize {
        self as usize - 1
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A snapshot's rank: 0 (a member of no bucket) or the highest level it is a member of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank(u8);

impl Rank {
    pub const NONE: Rank = Rank(0);
    pub const MAX: Rank = Rank(Level::Yearly as u8);

    /// The rank with this number (0..=6), as stored.
    pub fn new(value: u8) -> Option<Rank> {
        (value <= Rank::MAX.0).then_some(Rank(value))
    }

    /// The number stored for this rank: 0 (none), 1 (minutely) ... 6 (yearly).
    pub fn value(self) -> u8 {
        self.0
    }

    /// The highest level, or `None` for rank 0.
    pub fn level(self) -> Option<Level> {
        Level::ALL.into_iter().find(|level| *level as u8 == self.0)
    }

    /// Whether a snapshot of this rank is a member of its bucket at `level`.
    pub fn includes(self, level: Level) -> bool {
        level as u8 <= self.0
    }

    /// The levels a snapshot of this rank is a member of.
    pub fn levels(self) -> LevelSet {
        let mut set = LevelSet::EMPTY;
        for level in Level::ALL.into_iter().filter(|level| self.includes(*level)) {
            set.insert(level);
        }
        set
    }

    /// Lazy ranking: the rank after a user asks for `explicit` (never lower than `self`).
    pub fn raise(self, explicit: Rank) -> Rank {
        self.max(explicit)
    }

    /// A rank as a user writes it: a number 0..=6, `none`, or a level name.
    pub fn parse(text: &str) -> Result<Rank, PolicyError> {
        let word = text.trim();
        if word.eq_ignore_ascii_case("none") {
            return Ok(Rank::NONE);
        }
        if let Some(level) = Level::from_name(word) {
            return Ok(level.rank());
        }
        match word.parse::<u8>().ok().and_then(Rank::new) {
            Some(rank) => Ok(rank),
            None => Err(PolicyError::new(text, PolicyProblem::UnknownRank)),
        }
    }
}

impl From<Level> for Rank {
    fn from(level: Level) -> Rank {
        level.rank()
    }
}

/// `none` or the level's name.
impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level() {
            Some(level) => f.write_str(level.name()),
            None => f.write_str("none"),
        }
    }
}

/// A set of levels (a bit per level).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LevelSet(u8);

impl LevelSet {
    pub const EMPTY: LevelSet = LevelSet(0);
    pub const ALL: LevelSet = LevelSet(0b11_1111);

    pub fn contains(self, level: Level) -> bool {
        self.0 & (1 << level.position()) != 0
    }

    pub fn insert(&mut self, level: Level) {
        self.0 |= 1 << level.position();
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The levels in the set, finest first.
    pub fn iter(self) -> impl Iterator<Item = Level> {
        Level::ALL
            .into_iter()
            .filter(move |level| self.contains(*level))
    }

    /// The highest level in the set as a rank (0 if empty).
    pub fn highest(self) -> Rank {
        self.iter().last().map_or(Rank::NONE, Level::rank)
    }
}

/// The levels with a boundary in `(prev_taken_at_us, taken_at_us]`: those whose bucket the
/// new snapshot is the first member of. `prev_taken_at_us` is the latest `taken_at` of the
/// snapshots declared before (deleted ones included), `None` for the very first snapshot,
/// which crosses every boundary.
pub fn levels_at_declaration(prev_taken_at_us: Option<i64>, taken_at_us: i64) -> LevelSet {
    let Some(prev) = prev_taken_at_us else {
        return LevelSet::ALL;
    };
    let mut crossed = LevelSet::EMPTY;
    for level in Level::ALL {
        if level.bucket(prev) < level.bucket(taken_at_us) {
            crossed.insert(level);
        }
    }
    crossed
}

/// The eager rank of a snapshot declared at `taken_at_us` (see [`levels_at_declaration`]).
pub fn rank_at_declaration(prev_taken_at_us: Option<i64>, taken_at_us: i64) -> Rank {
    levels_at_declaration(prev_taken_at_us, taken_at_us).highest()
}

/// The eager ranks of a whole timeline, given every snapshot's `taken_at` in declaration
/// order (deleted snapshots included): for assigning ranks to snapshots taken before ranks
/// existed, and for tests.
pub fn eager_ranks(taken_at_us: &[i64]) -> Vec<Rank> {
    let mut latest: Option<i64> = None;
    taken_at_us
        .iter()
        .map(|&t| {
            let rank = rank_at_declaration(latest, t);
            latest = Some(latest.map_or(t, |l| l.max(t)));
            rank
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::utc_timestamp_us;

    fn ts(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        utc_timestamp_us(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn names_and_numbers() {
        for level in Level::ALL {
            assert_eq!(Level::from_name(level.name()), Some(level));
            assert_eq!(Rank::parse(level.name()).unwrap(), level.rank());
            assert_eq!(level.rank().level(), Some(level));
            assert_eq!(level.rank().to_string(), level.name());
        }
        assert_eq!(Level::from_name("Daily"), Some(Level::Daily));
        assert_eq!(Rank::parse("0").unwrap(), Rank::NONE);
        assert_eq!(Rank::parse("none").unwrap(), Rank::NONE);
        assert_eq!(Rank::parse("6").unwrap(), Rank::MAX);
        assert_eq!(Rank::NONE.to_string(), "none");
        assert_eq!(Rank::new(7), None);
        let err = Rank::parse("7").unwrap_err();
        assert_eq!(
            err.to_string(),
            "'7': unknown rank (expected 0..6, none, minutely, hourly, daily, weekly, monthly or yearly)"
        );
    }

    #[test]
    fn membership_is_downward_closed() {
        assert_eq!(Rank::NONE.levels(), LevelSet::EMPTY);
        assert_eq!(Rank::MAX.levels(), LevelSet::ALL);
        let daily = Level::Daily.rank();
        assert!(daily.includes(Level::Minutely) && daily.includes(Level::Daily));
        assert!(!daily.includes(Level::Weekly));
        // A monthly snapshot is also a member of its week (the chain; see the module comment).
        assert!(Level::Monthly.rank().includes(Level::Weekly));
        assert_eq!(daily.raise(Rank::NONE), daily);
        assert_eq!(daily.raise(Level::Yearly.rank()), Rank::MAX);
    }

    #[test]
    fn declaration_levels() {
        assert_eq!(levels_at_declaration(None, 0), LevelSet::ALL);
        let t = ts(2024, 3, 5, 14, 7, 30);
        // Same minute: nothing.
        assert!(levels_at_declaration(Some(t), t + 20_000_000).is_empty());
        // Next minute only.
        assert_eq!(
            rank_at_declaration(Some(t), t + 40_000_000),
            Level::Minutely.rank()
        );
        // Midnight into Wednesday 2024-03-06: daily but not weekly or monthly.
        let midnight = ts(2024, 3, 6, 0, 0, 0);
        assert_eq!(rank_at_declaration(Some(t), midnight), Level::Daily.rank());
        // Into Friday 2024-03-01 (a month began mid-week): monthly, not weekly.
        let crossed =
            levels_at_declaration(Some(ts(2024, 2, 29, 23, 0, 0)), ts(2024, 3, 1, 0, 0, 0));
        assert!(crossed.contains(Level::Monthly) && !crossed.contains(Level::Weekly));
        assert_eq!(crossed.highest(), Level::Monthly.rank());
        // Into Monday 2024-01-01: every level.
        let new_year =
            levels_at_declaration(Some(ts(2023, 12, 31, 23, 59, 59)), ts(2024, 1, 1, 0, 0, 0));
        assert_eq!(new_year, LevelSet::ALL);
        // A step backwards crosses nothing.
        assert!(levels_at_declaration(Some(t), ts(2020, 1, 1, 0, 0, 0)).is_empty());
    }

    #[test]
    fn eager_ranks_use_the_latest_time_so_far() {
        let h = |hour| ts(2024, 3, 5, hour, 0, 0);
        // 10:00, 12:00, then the clock steps back to 11:00, then 12:00:30 (the minute of 12:00), 13:00.
        let ranks = eager_ranks(&[h(10), h(12), h(11), h(12) + 30_000_000, h(13)]);
        let hourly = Level::Hourly.rank();
        assert_eq!(
            ranks,
            vec![Rank::MAX, hourly, Rank::NONE, Rank::NONE, hourly]
        );
    }
}
