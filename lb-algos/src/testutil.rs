//! Test helpers: backend lists, a settable `ConnCounts`, flows.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::{Backend, BackendId, ConnCounts, FlowTuple};

/// Backend `i` has id `100 + i` (so an id/index mix-up shows) and address 198.18.1.i:8080.
pub(crate) fn backends(weights: &[u32]) -> Vec<Backend> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| Backend {
            id: BackendId(100 + i as u32),
            addr: addr(i as u32),
            weight,
        })
        .collect()
}

pub(crate) fn addr(i: u32) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0xC612_0000u32 + 0x100 + i)), 8080)
}

/// Counts for backends built by [`backends`]: entry `i` is `(active, inactive)` of id `100+i`.
pub(crate) struct Counts(pub(crate) Vec<(u32, u32)>);

impl Counts {
    pub(crate) fn new(c: &[(u32, u32)]) -> Counts {
        Counts(c.to_vec())
    }
    fn get(&self, id: BackendId) -> (u32, u32) {
        self.0[(id.0 - 100) as usize]
    }
}

impl ConnCounts for Counts {
    fn active(&self, id: BackendId) -> u32 {
        self.get(id).0
    }
    fn inactive(&self, id: BackendId) -> u32 {
        self.get(id).1
    }
    fn counts_run(&self, first: BackendId, out: &mut [[u32; 2]]) -> bool {
        let Some(start) = first.0.checked_sub(100) else {
            return false;
        };
        let Some(src) = self.0.get(start as usize..start as usize + out.len()) else {
            return false;
        };
        for (o, &(a, i)) in out.iter_mut().zip(src) {
            *o = [a, i];
        }
        true
    }
}

/// A flow from 198.19.(i) port `port` to the VIP 198.18.100.1:80.
pub(crate) fn flow(i: u32, port: u16) -> FlowTuple {
    FlowTuple {
        src: IpAddr::V4(Ipv4Addr::from(0xC613_0000u32.wrapping_add(i))),
        src_port: port,
        dst: IpAddr::V4(Ipv4Addr::new(198, 18, 100, 1)),
        dst_port: 80,
    }
}

/// A flow to destination `dst` (for dh/lblc/lblcr) from a fixed client.
pub(crate) fn flow_to(dst: IpAddr) -> FlowTuple {
    FlowTuple {
        src: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)),
        src_port: 40000,
        dst,
        dst_port: 80,
    }
}
