use std::net::SocketAddr;

use super::*;
use crate::testutil::{backends, flow};
use crate::{BackendId, SchedFlags};

fn params(m: u32, port: bool, fallback: bool) -> SchedParams {
    SchedParams {
        flags: SchedFlags {
            mh_port: port,
            mh_fallback: fallback,
        },
        mh_table_size: m,
        ..SchedParams::default()
    }
}

/// Slot owners as addresses, so tables built from differently ordered lists compare.
fn owners(s: &Maglev, b: &[Backend]) -> Vec<SocketAddr> {
    s.table().iter().map(|&i| b[i as usize].addr).collect()
}

fn shares(s: &Maglev, n: usize) -> Vec<usize> {
    let mut c = vec![0; n];
    s.table().iter().for_each(|&i| c[i as usize] += 1);
    c
}

/// Largest relative deviation of a backend's slot count from its weighted share.
fn max_dev(s: &Maglev, b: &[Backend]) -> f64 {
    let total_w: f64 = b.iter().map(|b| f64::from(b.weight)).sum();
    let m = s.table().len() as f64;
    shares(s, b.len())
        .iter()
        .zip(b)
        .map(|(&c, b)| {
            let want = m * f64::from(b.weight) / total_w;
            (c as f64 - want).abs() / want
        })
        .fold(0.0, f64::max)
}

#[test]
fn table_size_must_be_prime_and_bounded() {
    let b = backends(&[1, 1]);
    assert_eq!(
        Maglev::build(&b, &params(65536, false, false)).unwrap_err(),
        BuildError::MhTableSizeNotPrime(65536)
    );
    assert_eq!(
        Maglev::build(&b, &params(1, false, false)).unwrap_err(),
        BuildError::MhTableSizeNotPrime(1)
    );
    assert!(matches!(
        Maglev::build(&b, &params(TABLE_SIZE_MAX + 1, false, false)),
        Err(BuildError::MhTableSizeTooLarge { .. })
    ));
    assert!(Maglev::build(&b, &params(2, false, false)).is_ok());
    assert!(is_prime(65537) && is_prime(4093) && !is_prime(65535) && !is_prime(9));
}

#[test]
fn more_turns_than_slots_is_refused() {
    let err = Maglev::build(&backends(&[1; 40]), &params(31, false, false)).unwrap_err();
    assert_eq!(
        err,
        BuildError::MhTooManyBackends {
            turns: 40,
            table_size: 31
        }
    );
}

#[test]
fn evenness_within_one_percent_when_m_is_100_times_n() {
    let b = backends(&[1; 10]);
    let s = Maglev::build(&b, &params(1009, false, false)).unwrap();
    assert!(max_dev(&s, &b) <= 0.01, "dev {}", max_dev(&s, &b));

    let b = backends(&vec![1; 1000]);
    let s = Maglev::build(&b, &params(100_003, false, false)).unwrap();
    assert!(max_dev(&s, &b) <= 0.01, "dev {}", max_dev(&s, &b));
}

#[test]
fn weighted_shares_are_proportional() {
    // Weights with gcd 5 reduce to 1,2,3,4 (10 turns per round); M = 1009 ≥ 100 × 10.
    let b = backends(&[5, 10, 15, 20]);
    let s = Maglev::build(&b, &params(1009, false, false)).unwrap();
    assert!(max_dev(&s, &b) <= 0.01, "dev {}", max_dev(&s, &b));
    // A huge spread is shifted down but every backend keeps at least one slot.
    let b = backends(&[1, 1_000_000, 3]);
    let s = Maglev::build(&b, &params(65537, false, false)).unwrap();
    let c = shares(&s, 3);
    assert!(c.iter().all(|&c| c > 0), "{c:?}");
    assert!(c[1] > 100 * c[0], "{c:?}");
}

#[test]
fn removing_one_backend_moves_few_other_keys() {
    for n in [10usize, 50] {
        let all = backends(&vec![1; n]);
        let before = Maglev::build(&all, &params(65537, false, false)).unwrap();
        let removed = n / 3;
        let rest: Vec<Backend> = all
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != removed)
            .map(|(_, b)| *b)
            .collect();
        let after = Maglev::build(&rest, &params(65537, false, false)).unwrap();
        let (old, new) = (owners(&before, &all), owners(&after, &rest));
        let gone = all[removed].addr;
        let kept: Vec<usize> = (0..old.len()).filter(|&s| old[s] != gone).collect();
        let moved = kept.iter().filter(|&&s| old[s] != new[s]).count();
        let frac = moved as f64 / kept.len() as f64;
        assert!(
            frac <= 2.0 / n as f64,
            "n={n}: {frac:.4} of other keys moved"
        );
        // Every slot of the removed backend went to someone else.
        assert!(new.iter().all(|&a| a != gone));
    }
}

#[test]
fn same_table_whatever_the_input_order() {
    let b = backends(&[3, 1, 2, 1, 5, 1, 1]);
    let s = Maglev::build(&b, &params(4093, true, false)).unwrap();
    let mut rev = b.clone();
    rev.reverse();
    let mut rot = b.clone();
    rot.rotate_left(3);
    for other in [rev, rot] {
        let t = Maglev::build(&other, &params(4093, true, false)).unwrap();
        assert_eq!(owners(&s, &b), owners(&t, &other));
        // And the same flows reach the same addresses, through different indices.
        for i in 0..200 {
            let f = flow(i, i as u16);
            assert_eq!(b[s.pick(&f).unwrap()].addr, other[t.pick(&f).unwrap()].addr);
        }
    }
}

#[test]
fn golden_table_is_stable_across_builds_and_processes() {
    // Computed once with this implementation; a change to the hashes or the population order
    // changes every node's table, so it must be deliberate.
    let b = backends(&[1, 2, 1]);
    let s = Maglev::build(&b, &params(31, false, false)).unwrap();
    assert_eq!(s.table(), GOLDEN_31);
    let f = flow(7, 0);
    assert_eq!(s.pick(&f), Some(GOLDEN_PICK_7));
    // The flow hash too, with ports and for IPv6 clients.
    let s = Maglev::build(&b, &params(31, true, false)).unwrap();
    let mut picks: Vec<usize> = (0..8)
        .map(|i| s.pick(&flow(i, 1000 + i as u16)).unwrap())
        .collect();
    let mut f6 = flow(0, 443);
    f6.src = "2001:2::17".parse().unwrap();
    picks.push(s.pick(&f6).unwrap());
    assert_eq!(picks, GOLDEN_PICKS_PORT);
}

const GOLDEN_PICKS_PORT: &[usize] = &[0, 0, 2, 0, 1, 2, 1, 1, 2];

const GOLDEN_31: &[u32] = &[
    2, 0, 1, 1, 1, 2, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 2, 2, 1, 0, 1, 2, 0, 2, 1, 0, 2, 1, 1, 1, 1,
];
const GOLDEN_PICK_7: usize = 2;

#[test]
fn mh_port_hashes_the_source_port() {
    let b = backends(&[1; 8]);
    let no_port = Maglev::build(&b, &params(65537, false, false)).unwrap();
    let port = Maglev::build(&b, &params(65537, true, false)).unwrap();
    let mut spread = 0;
    for i in 0..100 {
        let a = no_port.pick(&flow(i, 1)).unwrap();
        assert!((2..50).all(|p| no_port.pick(&flow(i, p)) == Some(a)));
        let ports: std::collections::HashSet<_> =
            (1..50).map(|p| port.pick(&flow(i, p)).unwrap()).collect();
        spread += ports.len();
        assert_eq!(port.pick(&flow(i, 9)), port.pick(&flow(i, 9)));
    }
    assert!(
        spread > 100 * 6,
        "one client's ports reach most backends ({spread})"
    );
}

#[test]
fn fallback_keeps_drained_slots_and_moves_only_their_flows() {
    let live = backends(&[1, 1, 1, 1]);
    let mut drained = live.clone();
    drained[2].weight = 0;
    let p = params(4093, false, true);
    let a = Maglev::build(&live, &p).unwrap();
    let d = Maglev::build(&drained, &p).unwrap();
    assert_eq!(a.table(), d.table(), "a drain does not change the table");
    let mut moved = 0;
    for i in 0..4000 {
        let f = flow(i, 0);
        let (x, y) = (a.pick(&f).unwrap(), d.pick(&f).unwrap());
        assert_ne!(y, 2);
        if x == 2 {
            moved += 1;
            assert_eq!(d.pick(&f), Some(y), "fallback is deterministic");
        } else {
            assert_eq!(x, y, "flow {i} moved although its backend is live");
        }
    }
    assert!(
        moved > 500,
        "about a quarter of flows were on the drained backend ({moved})"
    );

    // Without the flag the drained backend leaves the table.
    let n = Maglev::build(&drained, &params(4093, false, false)).unwrap();
    assert!(n.table().iter().all(|&i| i != 2));
}

#[test]
fn all_drained_or_empty_gives_none_and_ids_do_not_matter() {
    for fb in [false, true] {
        let s = Maglev::build(&backends(&[0, 0]), &params(31, false, fb)).unwrap();
        assert_eq!(s.pick(&flow(1, 1)), None);
    }
    // The table depends on addresses, not on the BackendIds assigned to them.
    let b = backends(&[1, 1, 1]);
    let mut renumbered = b.clone();
    renumbered
        .iter_mut()
        .for_each(|b| b.id = BackendId(b.id.0 * 7));
    let p = params(4093, false, false);
    assert_eq!(
        Maglev::build(&b, &p).unwrap().table(),
        Maglev::build(&renumbered, &p).unwrap().table()
    );
}

/// A small deterministic generator for the order tests (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
    /// Distinct ids in a random order: what another node's (or process's) builder may have
    /// assigned, since it numbers backends in the order it learned them.
    fn ids(&mut self, n: usize) -> Vec<BackendId> {
        let mut ids: Vec<BackendId> = (0..n as u32)
            .map(|i| BackendId(i * 3 + (self.next() % 3) as u32))
            .collect();
        self.shuffle(&mut ids);
        ids
    }
}

/// Backends of both families, several ports on one address, uneven weights, one drained.
fn tier_backends() -> Vec<Backend> {
    let mut out = Vec::new();
    for i in 0..12u32 {
        let addr: SocketAddr = format!("10.{}.{}.{}:{}", i % 2, i % 3, i, 8080 + i % 4)
            .parse()
            .unwrap();
        out.push(Backend {
            id: BackendId(i),
            addr,
            weight: 1 + i % 4,
        });
    }
    for (i, a) in [
        "[2001:db8::1]:443",
        "[2001:db8::1]:8443",
        "[2001:db8::2]:443",
    ]
    .iter()
    .enumerate()
    {
        out.push(Backend {
            id: BackendId(100 + i as u32),
            addr: a.parse().unwrap(),
            weight: 2,
        });
    }
    out[5].weight = 0;
    out
}

/// The same backends listed in any order under any ids give the same slot owners (by
/// address) and send every flow to the same address: what two nodes of a tier, or a node
/// before and after a restart, must agree on.
#[test]
fn same_table_for_any_order_and_any_ids() {
    let base = tier_backends();
    let mut rng = Rng(0x5eed_0001);
    for (port, fallback) in [(false, false), (true, false), (true, true)] {
        let p = params(4093, port, fallback);
        let reference = Maglev::build(&base, &p).unwrap();
        let want = owners(&reference, &base);
        for round in 0..64 {
            let mut b = base.clone();
            rng.shuffle(&mut b);
            for (b, id) in b.iter_mut().zip(rng.ids(base.len())) {
                b.id = id;
            }
            let t = Maglev::build(&b, &p).unwrap();
            assert_eq!(
                owners(&t, &b),
                want,
                "round {round} port={port} fb={fallback}"
            );
            for i in 0..256 {
                let f = flow(i * 7919, (i * 31) as u16);
                assert_eq!(
                    reference.pick(&f).map(|x| base[x].addr),
                    t.pick(&f).map(|x| b[x].addr),
                    "round {round}: flow {i}"
                );
            }
        }
    }
}

/// Weights large enough to be shifted down, with a gcd to divide out, in any order.
#[test]
fn same_weighted_table_for_any_order() {
    let weights = [6_000_000u32, 3_000, 12, 600_000, 6, 30_000, 3];
    let base: Vec<Backend> = backends(&weights);
    let p = params(65537, false, false);
    let want = owners(&Maglev::build(&base, &p).unwrap(), &base);
    let mut rng = Rng(0x5eed_0002);
    for _ in 0..16 {
        let mut b = base.clone();
        rng.shuffle(&mut b);
        for (b, id) in b.iter_mut().zip(rng.ids(base.len())) {
            b.id = id;
        }
        assert_eq!(owners(&Maglev::build(&b, &p).unwrap(), &b), want);
    }
}

/// A backend that leaves and comes back (under a new id, at another place in the list)
/// gives back the table from before it left.
#[test]
fn removing_and_re_adding_a_backend_restores_the_table() {
    let base = tier_backends();
    let p = params(4093, true, false);
    let want = owners(&Maglev::build(&base, &p).unwrap(), &base);
    let mut rng = Rng(0x5eed_0003);
    for gone in 0..base.len() {
        let mut rest: Vec<Backend> = base.clone();
        let mut back = rest.remove(gone);
        let without = Maglev::build(&rest, &p).unwrap();
        assert!(owners(&without, &rest).iter().all(|&a| a != back.addr));
        rng.shuffle(&mut rest);
        back.id = BackendId(10_000 + gone as u32);
        rest.insert(rng.below(rest.len() + 1), back);
        assert_eq!(owners(&Maglev::build(&rest, &p).unwrap(), &rest), want);
    }
}
