//! Property tests of the policy language: the canonical form parses back to the same
//! policy, any layout of the same rules parses the same, and garbage never panics and
//! names a part of the text.

mod common;

use gsnap_lifetimes::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn parse_of_display_is_identity(p in common::policy()) {
        let text = p.to_string();
        prop_assert_eq!(Policy::parse(&text), Ok(p.clone()));
        prop_assert_eq!(text.is_empty(), p.is_keep_all());
    }

    #[test]
    fn any_layout_and_order_parses_the_same(
        p in common::policy(),
        order in any::<prop::sample::Index>(),
        layout in prop::collection::vec(0u8..5, 8),
        upper in any::<bool>(),
    ) {
        let mut rules: Vec<String> = p.to_string().split(' ').filter(|r| !r.is_empty()).map(String::from).collect();
        if !rules.is_empty() {
            let k = order.index(rules.len());
            rules.rotate_left(k);
        }
        let mut text = String::new();
        for (i, rule) in rules.iter().enumerate() {
            let rule = if upper { rule.to_uppercase() } else { rule.clone() };
            let rule = match layout[i % layout.len()] {
                0 => rule,
                1 => rule.replacen('=', " = ", 1),
                2 => rule.replacen('=', "= ", 1),
                3 => rule.replacen('=', " =", 1),
                _ => format!("\t{rule}\n"),
            };
            text.push_str(&rule);
            text.push_str(if i % 2 == 0 { " " } else { ", " });
        }
        prop_assert_eq!(Policy::parse(&text), Ok(p));
    }

    #[test]
    fn garbage_is_an_error_naming_a_part(text in "[a-z0-9=, .+-]{0,40}") {
        match Policy::parse(&text) {
            Ok(p) => prop_assert_eq!(Policy::parse(&p.to_string()), Ok(p)),
            Err(e) => {
                let squeezed: String = text.chars().filter(|c| !c.is_whitespace() && *c != ',').collect();
                prop_assert!(squeezed.contains(&e.part), "{:?} not in {:?}", e.part, text);
                let prefix = format!("'{}': ", e.part);
                prop_assert!(e.to_string().starts_with(&prefix));
            }
        }
    }

    #[test]
    fn durations_round_trip(seconds in 1u64..=MAX_SECONDS) {
        let text = format!("within={}", format_seconds(seconds));
        let p = Policy::parse(&text).unwrap();
        prop_assert_eq!(p.within().unwrap().as_secs(), seconds);
        prop_assert_eq!(p.to_string(), text);
    }
}
