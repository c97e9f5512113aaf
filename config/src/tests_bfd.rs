//! `[bgp] bfd_*`: defaults, values, refusals with their key, line and column.

use std::time::Duration;

use super::*;

fn with(keys: &str) -> String {
    format!(
        "[bgp]\nenable = true\nlocal_as = 65001\nneighbors = [{{ address = \"198.18.2.1\", as = 65000 }}]\n{keys}"
    )
}

#[test]
fn bfd_keys_default_to_birds_and_take_durations_and_a_multiplier() {
    let c = parse(&with(""), "t.toml").unwrap();
    assert_eq!(c.bgp.bfd_interval.get(), Duration::from_millis(100));
    assert_eq!(c.bgp.bfd_idle_tx_interval.get(), Duration::from_secs(1));
    assert_eq!(c.bgp.bfd_multiplier, 5);
    assert_eq!(Bgp::default().bfd_multiplier, 5);
    let c = parse(
        &with("bfd_interval = \"50ms\"\nbfd_idle_tx_interval = \"2s\"\nbfd_multiplier = 3\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.bgp.bfd_interval.get(), Duration::from_millis(50));
    assert_eq!(c.bgp.bfd_idle_tx_interval.get(), Duration::from_secs(2));
    assert_eq!(c.bgp.bfd_multiplier, 3);
    // The bounds themselves are fine.
    parse(
        &with("bfd_interval = \"10ms\"\nbfd_idle_tx_interval = \"60s\"\nbfd_multiplier = 255\n"),
        "t.toml",
    )
    .unwrap();
}

#[test]
fn bad_bfd_values_are_refused_with_key_line_and_column() {
    let one = |keys: &str| -> Problem {
        match parse(&with(keys), "t.toml") {
            Ok(_) => panic!("accepted: {keys}"),
            Err(e) => {
                let p = e.problems();
                assert_eq!(p.len(), 1, "{e}");
                p[0].clone()
            }
        }
    };
    for (keys, key, says) in [
        (
            "bfd_interval = \"5ms\"",
            "bgp.bfd_interval",
            "5ms is outside 10ms..=60s",
        ),
        (
            "bfd_interval = \"2m\"",
            "bgp.bfd_interval",
            "120s is outside",
        ),
        (
            "bfd_idle_tx_interval = \"0s\"",
            "bgp.bfd_idle_tx_interval",
            "0ms is outside",
        ),
        (
            "bfd_multiplier = 0",
            "bgp.bfd_multiplier",
            "0 is outside 1..=255",
        ),
        (
            "bfd_multiplier = 256",
            "bgp.bfd_multiplier",
            "256 is outside",
        ),
        (
            "bfd_interval = \"fast\"",
            "bgp.bfd_interval",
            "invalid duration",
        ),
        ("bfd_multiplier = -1", "bgp.bfd_multiplier", ""),
    ] {
        let p = one(&format!("\n{keys}\n"));
        assert_eq!(p.key, key, "{keys}: {}", p.message);
        // At the value: line 6, after `key = `.
        let column = keys.find("= ").unwrap() + 3;
        assert_eq!((p.line, p.column), (6, column), "{keys}: {p:?}");
        assert!(p.message.contains(says), "{keys}: {}", p.message);
    }
}
