//! Robustness: mutated fixture frames (truncated, bytes flipped, 16-bit fields overwritten,
//! lengths/flags/offsets) never make `Pipeline::process` panic, and a frame it does not
//! transmit is left as it came.

use std::cell::RefCell;
use std::time::Instant;

use etherparse::{Icmpv4Type, PacketBuilder, icmpv4::DestUnreachableHeader};
use fastpath::pipeline::{Pipeline, Verdict};
use fastpath::testing::*;
use proptest::prelude::*;

fn seeds() -> Vec<Vec<u8>> {
    let mut v = vec![
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("198.18.0.1:40001"),
            sa("198.18.100.1:80"),
            64,
            SYN,
        ),
        frame(
            B1_MAC,
            XVS_MAC,
            sa("198.18.1.1:8080"),
            sa("198.18.1.254:40000"),
            64,
            ACK,
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("198.18.0.1:40001"),
            sa("198.18.100.2:80"),
            64,
            ACK,
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("198.18.0.1:5000"),
            sa("198.18.100.54:53"),
            64,
            L4::Udp,
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("198.18.0.1:5000"),
            sa("198.18.100.9:3868"),
            64,
            L4::Sctp(1),
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("198.18.0.1:5000"),
            sa("198.18.100.7:443"),
            64,
            ACK,
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("[2001:2::1]:40001"),
            sa("[2001:2:0:100::1]:80"),
            64,
            SYN,
        ),
        frame(
            B61_MAC,
            XVS_MAC,
            sa("[2001:2:0:1::1]:8080"),
            sa("[2001:2:0:1::fe]:40001"),
            64,
            ACK,
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("[2001:2::1]:40001"),
            sa("[2001:2:0:100::53]:53"),
            64,
            L4::Udp,
        ),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("[2001:2::1]:40001"),
            sa("[2001:2:0:100::9]:3868"),
            64,
            L4::Sctp(1),
        ),
    ];
    // An ICMP error about the first flow, quoting the forwarded SYN.
    let quoted = frame(
        XVS_MAC,
        B1_MAC,
        sa("198.18.1.254:40000"),
        sa("198.18.1.1:8080"),
        63,
        SYN,
    );
    let mut icmp = Vec::new();
    PacketBuilder::ethernet2(B1_MAC, XVS_MAC)
        .ipv4([198, 18, 1, 1], [198, 18, 1, 254], 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut icmp, &quoted[14..])
        .unwrap();
    v.push(icmp);
    // A first and a later fragment.
    let mut f = frame(
        CLIENT_MAC,
        XVS_MAC,
        sa("198.18.0.1:5000"),
        sa("198.18.100.54:53"),
        64,
        L4::Udp,
    );
    f[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    v.push(f.clone());
    f[20..22].copy_from_slice(&0x0002u16.to_be_bytes());
    v.push(f);
    v
}

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Xor(usize, u8),
    Set16(usize, u16),
    Append(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..200).prop_map(Mutation::Truncate),
        (0usize..200, 1u8..=255).prop_map(|(a, b)| Mutation::Xor(a, b)),
        // Concentrate on header bytes: lengths, IHL, flags, offsets, ports, types.
        (0usize..80, any::<u16>()).prop_map(|(a, b)| Mutation::Set16(a, b)),
        (0usize..64).prop_map(Mutation::Append),
    ]
}

thread_local! {
    static PIPE: RefCell<Option<(Pipeline, Instant)>> = const { RefCell::new(None) };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

    #[test]
    fn process_never_panics(seed in 0usize..13, muts in proptest::collection::vec(mutation(), 1..5), ms in 0u64..5000) {
        let seeds = seeds();
        let mut f = seeds[seed % seeds.len()].clone();
        for m in muts {
            match m {
                Mutation::Truncate(n) => f.truncate(n),
                Mutation::Xor(at, b) => if let Some(x) = f.get_mut(at) { *x ^= b },
                Mutation::Set16(at, v) => if at + 2 <= f.len() { f[at..at + 2].copy_from_slice(&v.to_be_bytes()) },
                Mutation::Append(n) => f.extend(std::iter::repeat_n(0xa5, n)),
            }
        }
        PIPE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let (p, epoch) = cell.get_or_insert_with(|| {
                let epoch = Instant::now();
                let mut p = pipeline(epoch);
                for s in seeds.iter() {
                    p.process(&mut s.clone(), epoch);
                }
                (p, epoch)
            });
            let before = f.clone();
            let v = p.process(&mut f, at(*epoch, ms));
            if !matches!(v, Verdict::Tx(_)) {
                prop_assert_eq!(&f, &before, "non-Tx verdict {:?} modified the frame", v);
            }
            Ok(())
        })?;
    }
}
