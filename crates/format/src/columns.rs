//! How each of a table's *current* columns gets its value from a tuple written under the row
//! type recorded at a snapshot (the column plan), and when no mapping is needed at all.
//!
//! Columns are matched by attribute number, never by name or position among the live
//! columns: PostgreSQL never reuses an attribute number, so attribute n today is attribute n
//! at the snapshot, renamed or not. For current column n:
//! - dropped today: NULL (the executor never shows it);
//! - no attribute n at the snapshot (added since), or attribute n was already dropped then:
//!   NULL;
//! - same type and type modifier: the old value as it is ([`ColumnPlan::Copy`]);
//! - otherwise the old value is converted through text, as `CAST(old::text AS new_type)`
//!   with today's modifier would ([`ColumnPlan::Convert`]); a type changed to a type that no
//!   longer exists cannot be converted, which is [`FormatError::TypeGone`].
//!
//! Invariants of a plan: one entry per current column; `Copy` only between columns of equal
//! type and modifier, `Convert` only between different ones, never from an old attribute
//! that was dropped, and always from the attribute with the same number.

use crate::rowtype::{Attribute, RowType};
use crate::FormatError;

/// One current column of the table (an attribute of its relation descriptor today).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Column {
    /// Dropped: still an attribute number, never returned.
    pub dropped: bool,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier (-1 if none).
    pub typmod: i32,
    /// Collation OID (0 if the type is not collatable). A changed collation needs no
    /// conversion (a value's bytes do not depend on it), so the plan does not look at it.
    pub collation: u32,
}

/// How one current column gets its value. `old` is the index of the old attribute in
/// [`RowType::attributes`] (attribute number `old + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnPlan {
    /// Always NULL: the column was added since the snapshot, or is dropped (then or now).
    Null,
    /// The old attribute's value as it is (same type and modifier).
    Copy {
        /// Index of the old attribute.
        old: usize,
    },
    /// The old attribute's value through its type's output function and the current type's
    /// input function with the current modifier.
    Convert {
        /// Index of the old attribute.
        old: usize,
    },
}

/// The old attribute with attribute number `attnum`, with its index.
fn old_attribute(old: &RowType, attnum: usize) -> Option<(usize, &Attribute)> {
    // A decoded row type lists attribute n at index n - 1; search only if one was built
    // otherwise.
    let matches = |a: &Attribute| usize::try_from(a.attnum).is_ok_and(|n| n == attnum);
    match old.attributes.get(attnum.wrapping_sub(1)) {
        Some(a) if matches(a) => Some((attnum - 1, a)),
        _ => old.attributes.iter().enumerate().find(|(_, a)| matches(a)),
    }
}

/// The plan of every current column (`current[i]` is attribute number `i + 1`) for tuples of
/// the row type `old`. `type_exists(oid)` tells whether a type still exists; it is asked only
/// about the old types of columns whose type changed. The error names the first such column
/// whose old type is gone.
pub fn plan_columns(
    old: &RowType,
    current: &[Column],
    mut type_exists: impl FnMut(u32) -> bool,
) -> Result<Vec<ColumnPlan>, FormatError> {
    current
        .iter()
        .enumerate()
        .map(|(i, now)| {
            if now.dropped {
                return Ok(ColumnPlan::Null);
            }
            let Some((index, then)) = old_attribute(old, i + 1) else {
                return Ok(ColumnPlan::Null);
            };
            if then.dropped {
                Ok(ColumnPlan::Null)
            } else if then.type_oid == now.type_oid && then.typmod == now.typmod {
                Ok(ColumnPlan::Copy { old: index })
            } else if then.type_oid != now.type_oid && !type_exists(then.type_oid) {
                Err(FormatError::TypeGone {
                    attnum: then.attnum,
                    column: then.name.clone(),
                    type_name: then.type_name.clone(),
                })
            } else {
                Ok(ColumnPlan::Convert { old: index })
            }
        })
        .collect()
}

/// True if tuples of row type `old` can be handed to the executor as they are, as tuples of
/// the current row type: nothing is dropped (then or now), every old attribute has the same
/// type and modifier today, none has a missing value to fill in (a tuple older than `ADD
/// COLUMN ... DEFAULT` would read NULL where the decoder shows the default), and no attribute
/// was removed (old count <= current count). Columns added since read as NULL either way:
/// a tuple with fewer attributes than its descriptor reads NULL for the others (as long as
/// the descriptor the executor deforms with carries no missing values).
pub fn in_place(old: &RowType, current: &[Column]) -> bool {
    old.attributes.len() <= current.len()
        && current.iter().all(|c| !c.dropped)
        && old.attributes.iter().enumerate().all(|(i, then)| {
            let now = &current[i];
            usize::try_from(then.attnum).is_ok_and(|n| n == i + 1)
                && !then.dropped
                && then.missing.is_none()
                && then.type_oid == now.type_oid
                && then.typmod == now.typmod
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INT4: u32 = 23;
    const TEXT: u32 = 25;
    const VARCHAR: u32 = 1043;
    const GONE: u32 = 99_999;

    fn attribute(attnum: i16, type_oid: u32, typmod: i32) -> Attribute {
        Attribute {
            attnum,
            name: format!("c{attnum}"),
            type_oid,
            typmod,
            type_name: format!("type {type_oid}"),
            len: -1,
            align: b'i',
            ..Default::default()
        }
    }

    fn dropped(attnum: i16) -> Attribute {
        Attribute {
            dropped: true,
            type_oid: 0,
            ..attribute(attnum, 0, -1)
        }
    }

    fn column(type_oid: u32, typmod: i32) -> Column {
        Column {
            type_oid,
            typmod,
            ..Default::default()
        }
    }

    fn exists(oid: u32) -> bool {
        oid != GONE
    }

    #[test]
    fn schema_changes() {
        // At the snapshot: c1 int4, c2 text, c3 dropped, c4 varchar(20), c5 int4.
        let old = RowType {
            definition: None,
            attributes: vec![
                attribute(1, INT4, -1),
                attribute(2, TEXT, -1),
                dropped(3),
                attribute(4, VARCHAR, 24),
                attribute(5, INT4, -1),
            ],
        };
        // Today: c1 unchanged, c2 changed to int4, c3 still dropped, c4 varchar(10),
        // c5 dropped, c6 added.
        let now = [
            column(INT4, -1),
            column(INT4, -1),
            Column {
                dropped: true,
                ..Default::default()
            },
            column(VARCHAR, 14),
            Column {
                dropped: true,
                ..Default::default()
            },
            column(TEXT, -1),
        ];
        assert_eq!(
            plan_columns(&old, &now, exists),
            Ok(vec![
                ColumnPlan::Copy { old: 0 },
                ColumnPlan::Convert { old: 1 },
                ColumnPlan::Null,
                ColumnPlan::Convert { old: 3 },
                ColumnPlan::Null,
                ColumnPlan::Null,
            ])
        );
        assert!(!in_place(&old, &now));
    }

    #[test]
    fn a_gone_type_is_an_error_only_where_it_must_be_converted() {
        let old = RowType {
            definition: None,
            attributes: vec![attribute(1, GONE, -1), attribute(2, GONE, -1)],
        };
        // Column 1 was dropped since: no error. Column 2 changed type: error.
        let now = [
            Column {
                dropped: true,
                ..Default::default()
            },
            column(TEXT, -1),
        ];
        let err = plan_columns(&old, &now, exists).unwrap_err();
        assert_eq!(
            err,
            FormatError::TypeGone {
                attnum: 2,
                column: "c2".into(),
                type_name: format!("type {GONE}"),
            }
        );
        assert_eq!(
            err.to_string(),
            format!("column \"c2\" had type type {GONE}, which no longer exists")
        );
        // Unchanged type: never asked about.
        let now = [column(GONE, -1), column(GONE, -1)];
        let plans = plan_columns(&old, &now, |_| panic!("not asked")).unwrap();
        assert_eq!(
            plans,
            vec![ColumnPlan::Copy { old: 0 }, ColumnPlan::Copy { old: 1 }]
        );
    }

    #[test]
    fn matched_by_attribute_number_even_out_of_order() {
        let old = RowType {
            definition: None,
            attributes: vec![attribute(2, TEXT, -1), attribute(1, INT4, -1)],
        };
        let now = [column(INT4, -1), column(TEXT, -1)];
        assert_eq!(
            plan_columns(&old, &now, exists),
            Ok(vec![
                ColumnPlan::Copy { old: 1 },
                ColumnPlan::Copy { old: 0 }
            ])
        );
        assert!(
            !in_place(&old, &now),
            "tuples are laid out in position order"
        );
    }

    #[test]
    fn in_place_cases() {
        let old = RowType {
            definition: None,
            attributes: vec![attribute(1, INT4, -1), attribute(2, TEXT, -1)],
        };
        let same = [column(INT4, -1), column(TEXT, -1)];
        assert!(in_place(&old, &same));
        assert!(
            in_place(&old, &[same[0], same[1], column(INT4, -1)]),
            "added since"
        );
        assert!(!in_place(&old, &same[..1]), "fewer columns today");
        assert!(
            !in_place(&old, &[same[0], column(VARCHAR, -1)]),
            "type changed"
        );
        assert!(
            !in_place(&old, &[same[0], column(TEXT, 7)]),
            "modifier changed"
        );
        assert!(
            !in_place(
                &old,
                &[
                    same[0],
                    same[1],
                    Column {
                        dropped: true,
                        ..Default::default()
                    }
                ]
            ),
            "dropped today"
        );
        let mut with_missing = old.clone();
        with_missing.attributes[1].missing = Some("x".into());
        assert!(
            !in_place(&with_missing, &same),
            "a missing value to fill in"
        );
        let with_dropped = RowType {
            definition: None,
            attributes: vec![attribute(1, INT4, -1), dropped(2)],
        };
        assert!(!in_place(&with_dropped, &same));
        assert!(in_place(&RowType::default(), &[]));
    }

    /// Small type and modifier ranges so that equal types are common.
    fn arb_old() -> impl Strategy<Value = RowType> {
        proptest::collection::vec((any::<bool>(), 0u32..4, -1i32..1, any::<bool>()), 0..12)
            .prop_map(|atts| RowType {
                definition: None,
                attributes: atts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (is_dropped, t, m, missing))| {
                        let n = i as i16 + 1;
                        if is_dropped {
                            dropped(n)
                        } else {
                            Attribute {
                                missing: missing.then(|| "0".into()),
                                ..attribute(n, 100 + t, m)
                            }
                        }
                    })
                    .collect(),
            })
    }

    fn arb_current() -> impl Strategy<Value = Vec<Column>> {
        proptest::collection::vec((any::<bool>(), 0u32..4, -1i32..1), 0..14).prop_map(|cols| {
            cols.into_iter()
                .map(|(d, t, m)| Column {
                    dropped: d,
                    type_oid: 100 + t,
                    typmod: m,
                    collation: 0,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn plans_follow_the_rules(old in arb_old(), current in arb_current(), gone in 100u32..105) {
            let type_exists = |oid: u32| oid != gone;
            match plan_columns(&old, &current, type_exists) {
                Ok(plans) => {
                    prop_assert_eq!(plans.len(), current.len());
                    for (i, (plan, now)) in plans.iter().zip(&current).enumerate() {
                        let then = old.attributes.get(i);
                        match *plan {
                            ColumnPlan::Null => prop_assert!(
                                now.dropped || then.is_none_or(|a| a.dropped)
                            ),
                            ColumnPlan::Copy { old: k } | ColumnPlan::Convert { old: k } => {
                                prop_assert_eq!(k, i, "matched by attribute number");
                                let a = &old.attributes[k];
                                prop_assert!(!a.dropped && !now.dropped);
                                let same = a.type_oid == now.type_oid && a.typmod == now.typmod;
                                prop_assert_eq!(matches!(plan, ColumnPlan::Copy { .. }), same);
                                if !same && a.type_oid != now.type_oid {
                                    prop_assert!(type_exists(a.type_oid));
                                }
                            }
                        }
                    }
                }
                Err(FormatError::TypeGone { attnum, .. }) => {
                    // The first column that must be converted from the gone type.
                    let first = current.iter().enumerate().position(|(i, now)| {
                        old.attributes.get(i).is_some_and(|a| {
                            !now.dropped && !a.dropped && a.type_oid != now.type_oid
                                && a.type_oid == gone
                        })
                    });
                    prop_assert_eq!(first.map(|i| i as i16 + 1), Some(attnum));
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        #[test]
        fn in_place_means_every_plan_is_a_copy_or_an_added_column(old in arb_old(), current in arb_current()) {
            if in_place(&old, &current) {
                let plans = plan_columns(&old, &current, |_| true).unwrap();
                for (i, plan) in plans.iter().enumerate() {
                    if i < old.attributes.len() {
                        prop_assert_eq!(*plan, ColumnPlan::Copy { old: i });
                    } else {
                        prop_assert_eq!(*plan, ColumnPlan::Null);
                    }
                }
            }
        }

        #[test]
        fn the_same_row_type_is_in_place(old in arb_old()) {
            let current: Vec<Column> = old.attributes.iter().map(|a| Column {
                dropped: a.dropped,
                type_oid: a.type_oid,
                typmod: a.typmod,
                collation: a.collation,
            }).collect();
            let plans = plan_columns(&old, &current, |_| false).unwrap();
            let converts = plans.iter().filter(|p| matches!(p, ColumnPlan::Convert { .. })).count();
            prop_assert_eq!(converts, 0);
            let simple = old.attributes.iter().all(|a| !a.dropped && a.missing.is_none());
            prop_assert_eq!(in_place(&old, &current), simple);
        }
    }
}
