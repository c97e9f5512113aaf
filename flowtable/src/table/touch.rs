//! A packet's effect on its flow: the protocol state machine tabulated over state codes
//! (`next_code`: a row block per direction, and one for the original direction of a
//! [`FLAG_ONE_WAY`] flow), [`FlowTable::touch`] from a hit's state word, [`FlowTable::on_packet`] from a
//! handle, and [`FlowTable::update`] (a peer's state). Control-word changes are CAS loops; the
//! winner of each transition adjusts the backend counts for exactly that transition.

use super::FlowTable;
use super::entry::debug_transition;
use super::entry::{
    FLAG_ONE_WAY, W_CTL, W_IDS, W_META, ctl, ctl_gen, ctl_ls, ctl_readable, ctl_state, ctl_status,
    state_fits,
};
use super::handle::{FlowHandle, FlowHit, Tick};
use crate::key::{Direction, Protocol};
use crate::state::{FlowState, STATE_CODES, TcpFlags, TcpState};
use crate::sync::{Ordering, fence};

/// State codes padded to a power of two (the `next_code` table's last dimension).
pub(super) const CODES_PAD: usize = 32;
const _: () = assert!(STATE_CODES <= CODES_PAD);

/// Row blocks of the `next_code` table: [`ROW_ORIGINAL`], [`ROW_REPLY`], [`ROW_ONE_WAY`].
pub(super) const ROWS: usize = 3;
/// `next_code` rows of the original direction.
pub(super) const ROW_ORIGINAL: usize = 0;
/// `next_code` rows of the reply direction.
pub(super) const ROW_REPLY: usize = 1;
/// `next_code` rows of the original direction of a [`FLAG_ONE_WAY`] flow (IPVS's
/// input-only rows).
pub(super) const ROW_ONE_WAY: usize = 2;

/// The `next_code` rows of a packet in direction `dir` of a flow with flags byte `flags`.
#[inline(always)]
pub(super) fn row(dir: Direction, flags: u8) -> usize {
    match dir {
        Direction::Reply => ROW_REPLY,
        Direction::Original if flags & FLAG_ONE_WAY != 0 => ROW_ONE_WAY,
        Direction::Original => ROW_ORIGINAL,
    }
}

/// ESTABLISHED's state code.
pub(super) const EST_CODE: u8 = TcpState::Established as u8;

/// The four flag bits `FlowState::next` reads (FIN, SYN, RST, ACK) as a 4-bit index.
#[inline(always)]
pub(super) fn flags_index(f: u8) -> usize {
    usize::from((f & 0x07) | ((f >> 1) & 0x08))
}

/// [`FlowState::next`] tabulated over state codes, both directions and every combination of
/// the flag bits it reads; then [`FlowState::next_one_way`] likewise (row [`ROW_ONE_WAY`]).
pub(super) fn next_code_table() -> [[[u8; CODES_PAD]; 16]; ROWS] {
    let mut t = [[[0u8; CODES_PAD]; 16]; ROWS];
    for (r, rows) in t.iter_mut().enumerate() {
        for fi in 0..16u8 {
            let flags = TcpFlags((fi & 0x07) | ((fi & 0x08) << 1));
            debug_assert_eq!(flags_index(flags.0), usize::from(fi));
            for (code, next) in rows[usize::from(fi)].iter_mut().enumerate() {
                let s = FlowState::from_u8(code as u8);
                *next = match r {
                    ROW_ORIGINAL => s.next(Direction::Original, flags),
                    ROW_REPLY => s.next(Direction::Reply, flags),
                    _ => s.next_one_way(flags),
                }
                .to_u8();
            }
        }
    }
    t
}

impl FlowTable {
    /// [`on_packet`](Self::on_packet) for a flow just found by [`lookup_hit`](Self::lookup_hit):
    /// starts from the state word the lookup read, so a packet that changes neither the state
    /// nor the 100 ms tick costs no memory access at all. Same result as `on_packet` at the
    /// time of the lookup (call it right after: a hit held across batches may be stale, and
    /// then only a packet that needs a write notices, by returning `None`).
    ///
    /// `seq` gives the packet's TCP sequence number; it is called only when the packet
    /// writes (a state change or a new tick), whose writer records it as the direction's
    /// sequence sample ([`rst_window`](Self::rst_window)), so a packet that writes nothing
    /// does not even read it.
    ///
    /// A [`FLAG_ONE_WAY`] flow's packets (the original direction's) move its state by IPVS's
    /// input-only rows.
    #[inline]
    pub fn touch(
        &self,
        hit: &FlowHit,
        tcp_flags: TcpFlags,
        now: Tick,
        seq: impl FnOnce() -> u32,
    ) -> Option<FlowState> {
        self.touch_ctl(
            hit.handle.entry(),
            row(hit.dir, hit.flags),
            hit.backend,
            hit.ctl,
            tcp_flags,
            now,
            seq,
        )
    }

    /// The no-write case of `touch` inline; `c` is the validated state word of a hit, `row`
    /// the packet's `next_code` rows ([`row`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn touch_ctl(
        &self,
        e: u32,
        row: usize,
        backend: u32,
        c: u64,
        tcp_flags: TcpFlags,
        now: Tick,
        seq: impl FnOnce() -> u32,
    ) -> Option<FlowState> {
        let old = ctl_state(c);
        // The common packet first: an ACK without SYN, FIN or RST on an established
        // connection keeps it established (a test checks the table agrees).
        if tcp_flags.events() == TcpFlags::ACK && old == EST_CODE && ctl_ls(c) >= now.0 {
            return Some(FlowState::Tcp(TcpState::Established));
        }
        // Codes are < STATE_CODES <= CODES_PAD; the mask only spares a bounds check.
        let new = self.next_code[row][flags_index(tcp_flags.0)][usize::from(old) & (CODES_PAD - 1)];
        // A hit's word is readable and of the hit's generation: nothing to check for a
        // packet that changes neither the state nor the time tick.
        if new == old && ctl_ls(c) >= now.0 {
            return Some(FlowState::from_u8(old));
        }
        self.touch_write(e, row, backend, c, tcp_flags, now, seq())
    }

    /// The rest of `touch`: a CAS loop from the hit's state word; its winner records `seq`
    /// as the direction's sequence sample.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub(super) fn touch_write(
        &self,
        e: u32,
        row: usize,
        backend: u32,
        mut c: u64,
        tcp_flags: TcpFlags,
        now: Tick,
        seq: u32,
    ) -> Option<FlowState> {
        let reply = row == ROW_REPLY;
        let next = &self.next_code.get(row)?[flags_index(tcp_flags.0)];
        let gen_ = ctl_gen(c);
        loop {
            if !ctl_readable(c) || ctl_gen(c) != gen_ {
                return None;
            }
            let old = ctl_state(c);
            let new = next[usize::from(old) & (CODES_PAD - 1)];
            let ls = ctl_ls(c).max(now.0);
            if new == old && ls == ctl_ls(c) {
                return Some(FlowState::from_u8(old));
            }
            let entry = self.entries.get(e as usize)?;
            let nc = ctl(ctl_gen(c), ctl_status(c), new, ls);
            debug_transition!(c, nc);
            match entry.w[W_CTL].compare_exchange_weak(c, nc, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    #[cfg(not(loom))]
                    if new != old {
                        crate::log::changed(FlowHandle::new(e, gen_));
                    }
                    self.take_sample(e, gen_, reply, seq);
                    let (old, new) = (FlowState::from_u8(old), FlowState::from_u8(new));
                    self.recount(backend, old, new);
                    return Some(new);
                }
                Err(a) => c = a,
            }
        }
    }

    /// Sets flow `h`'s state to `state` and its last-seen time to `last_seen` when that is
    /// later than the flow's (a peer's copy of a flow it serves, see the slowpath's flow
    /// sync); the per-backend counts follow the state. Returns the state set, or `None`
    /// when the handle is stale or `state` is of another protocol. Not for the packet path.
    pub fn update(&self, h: FlowHandle, state: FlowState, last_seen: Tick) -> Option<FlowState> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let data = self.read_data(e)?;
        if !state_fits(state, data.proto) {
            return None;
        }
        let t = last_seen.0;
        let new = state.to_u8();
        let mut c = entry.w[W_CTL].load(Ordering::Acquire);
        loop {
            if !ctl_readable(c) || ctl_gen(c) != h.gen_() {
                return None;
            }
            let old = ctl_state(c);
            let ls = ctl_ls(c).max(t);
            if new == old && ls == ctl_ls(c) {
                return Some(state);
            }
            let nc = ctl(ctl_gen(c), ctl_status(c), new, ls);
            debug_transition!(c, nc);
            match entry.w[W_CTL].compare_exchange_weak(c, nc, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.recount(data.backend_id.0, FlowState::from_u8(old), state);
                    return Some(state);
                }
                Err(a) => c = a,
            }
        }
    }

    /// [`FlowState::initial`]'s code, from the `next_code` table: the first packet's
    /// transition from the protocol's starting state.
    #[inline]
    pub(super) fn initial_code(&self, proto: Protocol, tcp_flags: TcpFlags) -> u8 {
        let start = match proto {
            Protocol::Tcp => TcpState::None as u8,
            Protocol::Udp => FlowState::Udp.to_u8(),
            Protocol::Icmp | Protocol::Icmpv6 => FlowState::Icmp.to_u8(),
            Protocol::Sctp => FlowState::Sctp(crate::state::SctpState::Established).to_u8(),
        };
        // (The input-only rows agree on a new flow's first packet: `state`'s tests.)
        self.next_code[ROW_ORIGINAL][flags_index(tcp_flags.0)][usize::from(start) & (CODES_PAD - 1)]
    }

    /// Account one packet of flow `h` travelling in `dir`: update the state from `tcp_flags`
    /// (ignored for UDP/ICMP; a [`FLAG_ONE_WAY`] flow's by the input-only rows), the
    /// last-seen time and the backend's counts. Returns the new state, or `None` if the
    /// handle is stale. Writes nothing when neither the state nor the 100 ms time tick
    /// changes, so a busy flow's entry stays read-mostly.
    #[inline]
    pub fn on_packet(
        &self,
        h: FlowHandle,
        dir: Direction,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Option<FlowState> {
        let entry = self.entries.get(h.entry() as usize)?;
        let t = now.0;
        let mut c = entry.w[W_CTL].load(Ordering::Acquire);
        let backend = (self.word(h.entry(), W_IDS) >> 32) as u32;
        let flags = (self.word(h.entry(), W_META) >> 48) as u8;
        // Orders the reads above before the CAS: if they saw a recycler's write, the CAS
        // fails.
        fence(Ordering::Acquire);
        loop {
            if !ctl_readable(c) || ctl_gen(c) != h.gen_() {
                return None;
            }
            let old = FlowState::from_u8(ctl_state(c));
            let new = match row(dir, flags) {
                ROW_ONE_WAY => old.next_one_way(tcp_flags),
                _ => old.next(dir, tcp_flags),
            };
            let ls = ctl_ls(c).max(t);
            if new == old && ls == ctl_ls(c) {
                return Some(old);
            }
            let nc =
                c & !((0xff << 32) | 0xffff_ffff) | u64::from(new.to_u8()) << 32 | u64::from(ls);
            debug_transition!(c, nc);
            match entry.w[W_CTL].compare_exchange_weak(c, nc, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.recount(backend, old, new);
                    return Some(new);
                }
                Err(a) => c = a,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::table::FlowTableConfig;

    #[test]
    fn initial_codes_agree_with_initial_states() {
        let t = FlowTable::new(FlowTableConfig::new(4, 1), std::time::Instant::now()).unwrap();
        let protos = [
            Protocol::Tcp,
            Protocol::Udp,
            Protocol::Icmp,
            Protocol::Icmpv6,
            Protocol::Sctp,
        ];
        for p in protos {
            for f in 0..=u8::MAX {
                let want = FlowState::initial(p, TcpFlags(f)).to_u8();
                assert_eq!(t.initial_code(p, TcpFlags(f)), want, "{p:?} flags {f:#x}");
            }
        }
    }

    #[test]
    fn the_code_table_agrees_with_the_state_machine_on_every_row() {
        let t = next_code_table();
        for f in 0..=u8::MAX {
            for code in 0..STATE_CODES as u8 {
                let s = FlowState::from_u8(code);
                let i = flags_index(f);
                let c = usize::from(code);
                let f = TcpFlags(f);
                assert_eq!(
                    t[ROW_ORIGINAL][i][c],
                    s.next(Direction::Original, f).to_u8()
                );
                assert_eq!(t[ROW_REPLY][i][c], s.next(Direction::Reply, f).to_u8());
                assert_eq!(t[ROW_ONE_WAY][i][c], s.next_one_way(f).to_u8());
            }
        }
        assert_eq!(row(Direction::Original, FLAG_ONE_WAY | 1), ROW_ONE_WAY);
        assert_eq!(row(Direction::Original, 0x83), ROW_ORIGINAL);
        assert_eq!(row(Direction::Reply, FLAG_ONE_WAY), ROW_REPLY);
    }

    #[test]
    fn touch_shortcut_agrees_with_the_state_table() {
        // Every flags byte the shortcut takes (ACK set; SYN, FIN, RST clear), both ways.
        let t = next_code_table();
        for f in (0..=u8::MAX).filter(|f| TcpFlags(*f).events() == TcpFlags::ACK) {
            for (d, dir) in [Direction::Original, Direction::Reply]
                .into_iter()
                .enumerate()
            {
                let est = FlowState::Tcp(TcpState::Established);
                assert_eq!(est.next(dir, TcpFlags(f)), est, "flags {f:#x} {dir:?}");
                assert_eq!(t[d][flags_index(f)][usize::from(EST_CODE)], EST_CODE);
            }
            // A one-way flow's pure ACK too (the shortcut does not read the rows).
            assert_eq!(
                t[ROW_ONE_WAY][flags_index(f)][usize::from(EST_CODE)],
                EST_CODE
            );
        }
    }
}
