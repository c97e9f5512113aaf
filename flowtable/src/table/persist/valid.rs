//! What a flow read from a state file (an adopted entry, an imported entry or record) must
//! be before the table takes it. The table checks what any table requires
//! ([`flow_refusal`]: protocol and state consistent, one address family, no unspecified or
//! multicast address, ports where the protocol has them, the backend id below
//! `backends_max`, two distinct tuples; and across the flows, one address per backend id,
//! [`BackendAddrs`]); the caller's [`FlowCheck`] checks the flow against its config.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, SocketAddr};

use shm::Refusal;

use crate::key::{FlowData, Protocol};
use crate::state::FlowState;
use crate::table::entry::state_fits;

/// A check of the running config on a flow read from a state file (adopted or imported):
/// `Err` names the field and the value this config cannot own, and the flow is dropped and
/// counted. The daemon's checks the config's frontends, backends and SNAT addresses;
/// [`AnyFlow`] takes whatever the table itself finds valid.
pub trait FlowCheck {
    /// Whether `flow`, in `state`, may be taken.
    fn check(&self, flow: &FlowData, state: FlowState) -> Result<(), Refusal>;
}

/// Takes every flow the table finds valid (tests, benchmarks, tools without a config).
#[derive(Clone, Copy, Debug, Default)]
pub struct AnyFlow;

impl FlowCheck for AnyFlow {
    fn check(&self, _: &FlowData, _: FlowState) -> Result<(), Refusal> {
        Ok(())
    }
}

impl<F: Fn(&FlowData, FlowState) -> Result<(), Refusal>> FlowCheck for F {
    fn check(&self, flow: &FlowData, state: FlowState) -> Result<(), Refusal> {
        self(flow, state)
    }
}

/// The state of stored code `code` for a flow of `proto`, if it is one.
pub(crate) fn state_of(code: u8, proto: Protocol) -> Result<FlowState, Refusal> {
    let state = FlowState::from_u8(code);
    if state.to_u8() != code || !state_fits(state, proto) {
        return Err(Refusal::new(
            "state",
            format!("code {code} for a flow of {}", proto.name()),
        ));
    }
    Ok(state)
}

/// Why no table may hold `d`, if none may; `backends_max` bounds its backend id (pass
/// `usize::MAX` where no table is known yet).
pub(crate) fn flow_refusal(d: &FlowData, backends_max: usize) -> Option<Refusal> {
    if !d.same_family() {
        return Some(Refusal::new(
            "family",
            format!(
                "client {} vip {} backend {} snat {} (mixed)",
                d.client, d.vip, d.backend, d.snat
            ),
        ));
    }
    let v6 = d.client.is_ipv6();
    if matches!(
        (d.proto, v6),
        (Protocol::Icmp, true) | (Protocol::Icmpv6, false)
    ) {
        return Some(Refusal::new(
            "protocol",
            format!("{} between {} addresses", d.proto.name(), family(v6)),
        ));
    }
    let ported = matches!(d.proto, Protocol::Tcp | Protocol::Udp | Protocol::Sctp);
    for (field, sa) in [
        ("client", d.client),
        ("vip", d.vip),
        ("backend", d.backend),
        ("snat", d.snat),
    ] {
        if !unicast(sa.ip()) {
            return Some(Refusal::new(field, format!("{sa} (not a unicast address)")));
        }
        if ported && sa.port() == 0 {
            return Some(Refusal::new(field, format!("{sa} (port 0)")));
        }
    }
    if d.backend_id.0 as usize >= backends_max {
        return Some(Refusal::new(
            "backend_id",
            format!("{} (backends_max {backends_max})", d.backend_id.0),
        ));
    }
    if d.original_key() == d.reply_key() {
        return Some(Refusal::new(
            "tuple",
            format!("{} -> {}: both directions alike", d.client, d.vip),
        ));
    }
    None
}

fn family(v6: bool) -> &'static str {
    if v6 { "IPv6" } else { "IPv4" }
}

fn unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !(a.is_unspecified() || a.is_multicast() || a.is_broadcast()),
        IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast()),
    }
}

/// The backend address each backend id had across the flows read: a consistent table has
/// one per id (a builder hands an id to one backend, and reuses it only once no flow holds
/// it). An id seen at two addresses makes every flow with it suspect: all are dropped.
#[derive(Debug, Default)]
pub(crate) struct BackendAddrs {
    seen: HashMap<u32, (SocketAddr, Option<SocketAddr>), BuildHasherDefault<IdHasher>>,
    conflicts: usize,
    /// Ids noted at their first address, by id modulo [`RECENT`]: noting one of these
    /// again changes nothing, so the many flows of one backend cost a compare each, not a
    /// hash lookup.
    recent: Vec<Option<(u32, SocketAddr)>>,
}

/// Slots of [`BackendAddrs::recent`].
const RECENT: usize = 256;

/// A hasher for backend ids (one per adopted flow: SipHash would cost as much as the rest
/// of the check). Fibonacci hashing; ids are not chosen by anyone who could flood it (a
/// file's writer could only slow its own adoption).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl BackendAddrs {
    /// Notes a flow to backend id `id` at `addr`.
    pub(crate) fn note(&mut self, id: u32, addr: SocketAddr) {
        if self.recent.is_empty() {
            self.recent = vec![None; RECENT];
        }
        let slot = &mut self.recent[id as usize % RECENT];
        if *slot == Some((id, addr)) {
            return;
        }
        let e = self.seen.entry(id).or_insert((addr, None));
        if e.0 == addr {
            *slot = Some((id, addr));
        } else if e.1.is_none() {
            e.1 = Some(addr);
            self.conflicts += 1;
        }
    }

    /// Whether some id was seen at two addresses.
    pub(crate) fn any(&self) -> bool {
        self.conflicts > 0
    }

    /// Why flows with backend id `id` are dropped, if they are.
    pub(crate) fn conflict(&self, id: u32) -> Option<Refusal> {
        match self.seen.get(&id) {
            Some((a, Some(b))) => Some(Refusal::new(
                "backend_id",
                format!("{id} at both {a} and {b}"),
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use lb_algos::BackendId;

    use super::*;

    fn flow() -> FlowData {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        FlowData {
            proto: Protocol::Tcp,
            client: sa("198.18.0.1:40000"),
            vip: sa("198.18.100.1:80"),
            backend: sa("198.18.1.1:8080"),
            snat: sa("198.18.0.254:2000"),
            service_id: 1,
            backend_id: BackendId(3),
            snapshot_gen: 1,
            flags: 0,
        }
    }

    #[test]
    fn a_valid_flow_passes_and_each_fault_is_named() {
        assert_eq!(flow_refusal(&flow(), 8), None);
        let field = |f: FlowData, max: usize| flow_refusal(&f, max).map(|r| r.field);
        assert_eq!(field(flow(), 3), Some("backend_id"));
        let mut f = flow();
        f.vip = "[2001:2::1]:80".parse().unwrap();
        assert_eq!(field(f, 8), Some("family"));
        let mut f = flow();
        f.backend.set_port(0);
        assert_eq!(field(f, 8), Some("backend"));
        let mut f = flow();
        f.snat = "224.0.0.1:2000".parse().unwrap();
        assert_eq!(field(f, 8), Some("snat"));
        let mut f = flow();
        f.client = "0.0.0.0:1".parse().unwrap();
        assert_eq!(field(f, 8), Some("client"));
        let mut f = flow();
        (f.backend, f.snat) = (f.client, f.vip);
        assert_eq!(field(f, 8), Some("tuple"));
        let mut f = flow();
        f.proto = Protocol::Icmpv6;
        assert_eq!(field(f, 8), Some("protocol"));
        // ICMP flows carry identifiers, not ports: 0 is one.
        let mut f = flow();
        f.proto = Protocol::Icmp;
        f.client.set_port(0);
        f.vip.set_port(0);
        assert_eq!(field(f, 8), None);
    }

    #[test]
    fn states_must_be_of_the_protocol() {
        assert!(state_of(FlowState::Udp.to_u8(), Protocol::Udp).is_ok());
        assert_eq!(state_of(16, Protocol::Tcp).unwrap_err().field, "state");
        // Codes between the TCP and the other states decode as nothing.
        for code in 11..16 {
            assert!(state_of(code, Protocol::Tcp).is_err(), "{code}");
        }
        assert!(state_of(200, Protocol::Sctp).is_err());
    }

    #[test]
    fn a_backend_id_at_two_addresses_is_a_conflict() {
        let mut b = BackendAddrs::default();
        let a1: SocketAddr = "198.18.1.1:80".parse().unwrap();
        let a2: SocketAddr = "198.18.1.2:80".parse().unwrap();
        b.note(1, a1);
        b.note(1, a1);
        b.note(2, a2);
        assert!(!b.any());
        b.note(1, a2);
        assert!(b.any());
        // Noted again at the first address (remembered) and at the second: still the one
        // conflict, named the same.
        b.note(1, a1);
        b.note(1, a2);
        b.note(1 + RECENT as u32, a2);
        b.note(1 + RECENT as u32, a1);
        assert_eq!(b.conflicts, 2);
        let r = b.conflict(1).unwrap();
        assert_eq!(r.field, "backend_id");
        assert!(r.value.contains("198.18.1.2:80"), "{r}");
        assert_eq!(b.conflict(2), None);
    }
}
