//! A table's owner killed with SIGKILL in the middle of inserts, state changes, removals and
//! sweeps (entries INSERTING or DYING, index slots claimed or frozen, counts half-updated):
//! the next `open` adopts the file, and the recovery pass leaves a table that holds every
//! invariant and keeps working.
//!
//! The owner is a forked child of this test process. This file holds one test, so the fork
//! happens with no other thread running; the child only touches the mapped table (nothing
//! it does allocates or takes a lock) until it is killed.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{check, flow};
use flowtable::*;

/// Below the capacity (2048): a full table recycles embryonic flows, whose tombstones
/// would make this a test of index pressure, not of recovery.
const FLOWS: u32 = 1500;
const ROUNDS: u32 = 20;

/// The child's loop: pseudo-random inserts, handshakes, closes, removals and small sweeps,
/// forever (until SIGKILL).
fn churn(t: &FlowTable, seed: u64) -> ! {
    let mut x = seed | 1;
    let mut handles = [None::<FlowHandle>; FLOWS as usize];
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % u64::from(FLOWS)) as u32;
        let now = Instant::now();
        match (x >> 32) % 8 {
            0..=2 => {
                if let Ok(h) = t.insert(&flow(i), TcpFlags::SYN, t.tick(now)) {
                    handles[i as usize] = Some(h);
                }
            }
            3 => {
                if let Some(h) = handles[i as usize] {
                    t.on_packet(
                        h,
                        Direction::Reply,
                        TcpFlags::SYN | TcpFlags::ACK,
                        t.tick(now),
                    );
                    t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(now));
                }
            }
            4 => {
                if let Some(h) = handles[i as usize] {
                    t.on_packet(
                        h,
                        Direction::Original,
                        TcpFlags::FIN | TcpFlags::ACK,
                        t.tick(now),
                    );
                }
            }
            5 | 6 => {
                if let Some(h) = handles[i as usize].take() {
                    t.remove(h);
                }
            }
            _ => {
                // Expire everything idle for a minute (nothing is): walks entries and clears
                // index tombstones (freezing slots).
                t.sweep(t.tick(now + Duration::from_secs(60)), 64, |_| {});
            }
        }
    }
}

#[test]
fn a_killed_owner_leaves_a_table_the_next_open_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    // Room for every flow: half of them IPv6, which take two entries.
    let cfg = FlowTableConfig::new(3072, common::BACKENDS as usize);
    let (mut t, _) = FlowTable::open(&path, cfg, Instant::now(), &AnyFlow).unwrap();
    let mut torn = 0;
    let mut reset = 0;
    for round in 0..ROUNDS {
        // SAFETY: the only thread of this process forks; the child runs `churn` on memory it
        // inherited (the shared mapping) and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            churn(&t, 0x9e37_79b9 + u64::from(round));
        }
        std::thread::sleep(Duration::from_millis(20 + u64::from(round) * 7));
        // SAFETY: our child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        drop(t);
        let (adopted, opened) = FlowTable::open(&path, cfg, Instant::now(), &AnyFlow).unwrap();
        let Opened::Adopted(r) = opened else {
            panic!("round {round}: not adopted: {opened:?}")
        };
        assert!(!r.clean, "a killed owner did not stop cleanly");
        torn += r.torn_down;
        reset += r.words_reset;
        let views = check(&adopted);
        assert_eq!(views.len(), r.flows, "round {round}");
        // It keeps working: a sweep clears the tombstones, then every flow inserts (or
        // exists).
        let now = Instant::now();
        adopted.sweep(adopted.tick(now), adopted.capacity(), |_| {});
        let mut inserted = 0;
        for i in 0..FLOWS {
            match adopted.insert(&flow(i), TcpFlags::SYN, adopted.tick(now)) {
                Ok(_) => inserted += 1,
                Err(InsertError::Exists(_)) => {}
                Err(e) => panic!("round {round}: flow {i}: {e}"),
            }
        }
        assert_eq!(check(&adopted).len(), FLOWS as usize, "{inserted} inserted");
        if round == ROUNDS - 1 {
            for v in check(&adopted) {
                assert!(adopted.remove(v.handle).is_some());
            }
            assert_eq!(check(&adopted).len(), 0);
            for b in 0..common::BACKENDS {
                assert_eq!(
                    adopted.active(BackendId(b)) + adopted.inactive(BackendId(b)),
                    0
                );
            }
        }
        t = adopted;
    }
    // How many kills caught an operation in progress varies from run to run (the recovery
    // of each torn state is tested deterministically in the crate's unit tests).
    println!("torn down {torn} entries and reset {reset} index words over {ROUNDS} kills");
}
