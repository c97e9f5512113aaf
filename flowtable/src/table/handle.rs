//! What callers hold: [`FlowHandle`] (one incarnation of one entry), the per-packet
//! [`FlowHit`], the copies [`FlowView`] and [`ExpiredFlow`], and the time unit [`Tick`].

use crate::key::{Direction, FlowData, bits_addr};
use crate::state::FlowState;
use lb_algos::BackendId;
use std::net::IpAddr;
use std::time::Instant;

/// A time in the table's unit (100 ms ticks since the epoch), from [`FlowTable::tick`](crate::FlowTable::tick).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(pub(super) u32);

impl Tick {
    /// The time in 100 ms ticks since the table's epoch (boot, for a table in a state file:
    /// the same clock in every process of a boot).
    #[inline]
    pub fn get(self) -> u32 {
        self.0
    }
}

/// What a packet of a known flow needs, from [`FlowTable::lookup_hit`](crate::FlowTable::lookup_hit): 48 bytes, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowHit {
    /// The flow.
    pub handle: FlowHandle,
    /// Which tuple the packet matched.
    pub dir: Direction,
    /// New source port.
    pub src_port: u16,
    /// New destination port.
    pub dst_port: u16,
    /// The flow's pipeline flags byte ([`FlowData::flags`]).
    pub flags: u8,
    pub(super) v6: bool,
    pub(super) src: u128,
    pub(super) dst: u128,
    pub(super) ctl: u64,
    pub(super) backend: u32,
}

impl FlowHit {
    /// New source address.
    #[inline]
    pub fn src_ip(&self) -> IpAddr {
        bits_addr(self.src, self.v6)
    }

    /// New destination address.
    #[inline]
    pub fn dst_ip(&self) -> IpAddr {
        bits_addr(self.dst, self.v6)
    }

    /// New source address bits: the IPv6 address, or the IPv4 one in the low 32 bits.
    #[inline]
    pub fn src_bits(&self) -> u128 {
        self.src
    }

    /// New destination address bits (like [`src_bits`](Self::src_bits)).
    #[inline]
    pub fn dst_bits(&self) -> u128 {
        self.dst
    }

    /// The backend the flow was scheduled to.
    #[inline]
    pub fn backend_id(&self) -> BackendId {
        BackendId(self.backend)
    }

    /// The flow's state when it was found.
    #[inline]
    pub fn state(&self) -> FlowState {
        FlowState::from_u8(super::entry::ctl_state(self.ctl))
    }
}

/// Identifies one incarnation of one entry. A handle to a removed or recycled flow is detected
/// (calls return `None`), so holding a handle across batches is safe, just possibly stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowHandle(pub(super) u64);

impl FlowHandle {
    pub(super) fn new(entry: u32, gen_: u64) -> Self {
        FlowHandle(u64::from(entry) | gen_ << 32)
    }
    /// Entry number (`0..capacity`).
    pub(crate) fn entry(self) -> u32 {
        self.0 as u32
    }
    pub(super) fn gen_(self) -> u64 {
        self.0 >> 32
    }
    /// The handle as one word (see [`from_bits`](Self::from_bits)); for tests.
    #[cfg(any(test, feature = "testing"))]
    pub fn to_bits(self) -> u64 {
        self.0
    }
    /// A handle back from [`to_bits`](Self::to_bits), for tests. Any word makes a handle that
    /// is safe to use: one that names no live flow is stale (calls return `None`).
    #[cfg(any(test, feature = "testing"))]
    pub fn from_bits(bits: u64) -> FlowHandle {
        FlowHandle(bits)
    }
}

/// A flow copied out of the table, with its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowView {
    /// The flow's handle.
    pub handle: FlowHandle,
    /// The immutable flow data.
    pub data: FlowData,
    /// Protocol state when read.
    pub state: FlowState,
    /// Last packet time when read (100 ms resolution, rounded down).
    pub last_seen: Instant,
    /// The flow's sequence word ([`FlowTable::seq`](crate::FlowTable::seq)); 0 when none was stored.
    pub seq: u64,
}

/// A flow that left the table (expired, removed or recycled): release what it held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiredFlow {
    /// Its (now stale) handle.
    pub handle: FlowHandle,
    /// Its data (SNAT port to release, backend id...).
    pub data: FlowData,
    /// Its last state.
    pub state: FlowState,
    /// Its last packet time.
    pub last_seen: Instant,
}
