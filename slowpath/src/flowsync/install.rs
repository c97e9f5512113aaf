//! Installing what a peer sends: its flows as copies with this node's ids, its ends.
//!
//! A record comes from a datagram whose tag verified, but its sender may be compromised or
//! buggy: nothing in it is trusted. A flow is installed only through
//! [`FlowTable::restore`] (which checks the families, the state against the protocol and
//! the tuples) after this node's snapshot gave it a service (by the frontend its client
//! addressed) and a backend (by address); a translated flow's SNAT address must be the
//! sending peer's (one of its `snat_addresses`, when it lists any) and never this node's
//! own. A refused record affects only itself.

use std::net::IpAddr;
use std::time::Instant;

use fastpath::pipeline::FLAG_PEER;
use fastpath::snapshot::{Frontend, Snapshot};
use flowtable::{FlowData, FlowRecord, FlowTable, InsertError};

use super::{END_IDLE, wire::End};

/// What installing one peer's flow did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// A new flow (a copy of the peer's).
    New,
    /// A flow already here was updated in place.
    Updated,
    /// Refused: no service here has the flow's frontend, or it has no such backend.
    Unknown,
    /// Refused: a flow of this node's own holds the tuple, with another backend or SNAT.
    Conflict,
    /// Refused: the record is inconsistent (why): a SNAT address that is not the peer's, a
    /// state of another protocol, equal tuples...
    Invalid(&'static str),
    /// Refused: full table, reply tuple taken.
    Refused,
}

/// Where a peer's flow comes from: what its SNAT address may be.
#[derive(Clone, Copy, Debug)]
pub struct Origin<'a> {
    /// This node's own SNAT addresses (a peer's flow never takes them).
    pub own_snat: &'a [IpAddr],
    /// The sending peer's SNAT addresses (`[sync] peers[].snat_addresses`); empty: not
    /// listed, any address but this node's own.
    pub peer_snat: &'a [IpAddr],
}

impl Origin<'_> {
    /// Why `d`'s SNAT address may not be installed from this peer, if it may not.
    fn refuses(&self, d: &FlowData) -> Option<&'static str> {
        if d.snat == d.client {
            // Not translated (nat mode): no SNAT address of anyone's.
            return None;
        }
        let ip = d.snat.ip();
        if self.own_snat.contains(&ip) {
            return Some("snat: one of this node's own SNAT addresses");
        }
        if !self.peer_snat.is_empty() && !self.peer_snat.contains(&ip) {
            return Some("snat: not one of the peer's snat_addresses");
        }
        None
    }
}

/// Installs a peer's flow `r` into `flows`, with `snap`'s ids (see the module doc).
pub fn install(
    flows: &FlowTable,
    snap: &Snapshot,
    r: &FlowRecord,
    origin: &Origin<'_>,
    now: Instant,
) -> Installed {
    let d = &r.data;
    let Some(service) = Frontend::of_flow(d).and_then(|f| snap.service_for(&f)) else {
        return Installed::Unknown;
    };
    let Some(backend) = service.backends.iter().find(|b| b.addr == d.backend) else {
        return Installed::Unknown;
    };
    if let Some(why) = origin.refuses(d) {
        return Installed::Invalid(why);
    }
    let data = FlowData {
        service_id: service.id,
        backend_id: backend.id,
        snapshot_gen: snap.generation as u32,
        flags: d.flags | FLAG_PEER,
        ..*d
    };
    let last_seen = flows.tick(now.checked_sub(r.idle).unwrap_or(flows.epoch()));
    match flows.restore(&data, r.state, last_seen, r.seq) {
        Ok(_) => Installed::New,
        Err(InsertError::Exists(h)) => {
            let Some(here) = flows.get(h) else {
                return Installed::Refused;
            };
            if here.data.backend != data.backend || here.data.snat != data.snat {
                return Installed::Conflict;
            }
            if flows.update(h, r.state, last_seen).is_none() {
                return Installed::Refused;
            }
            if r.seq != 0 && here.seq != r.seq {
                flows.set_seq(h, r.seq);
            }
            Installed::Updated
        }
        Err(InsertError::Invalid(why)) => Installed::Invalid(why),
        Err(_) => Installed::Refused,
    }
}

/// Applies a peer's end: removes this node's copy of the flow when it is a peer's copy idle
/// here for [`END_IDLE`] (and, translated, on an address `origin` may hold: a peer ends
/// only its own flows' copies, as far as their SNAT address tells); returns whether it did.
pub fn end(flows: &FlowTable, e: &End, origin: &Origin<'_>, now: Instant) -> bool {
    let Some(key) = flowtable::FlowKey::new(e.proto, e.client, e.vip) else {
        return false;
    };
    let Some((h, flowtable::Direction::Original)) = flows.lookup(&key) else {
        return false;
    };
    let Some(v) = flows.get(h) else { return false };
    if v.data.flags & FLAG_PEER == 0
        || now.saturating_duration_since(v.last_seen) < END_IDLE
        || origin.refuses(&v.data).is_some()
    {
        return false;
    }
    flows.remove(h).is_some()
}
