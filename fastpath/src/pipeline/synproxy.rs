//! The SYN proxy (as DPVS's synproxy): a TCP service's SYNs are answered by xvs with a SYN
//! cookie; the flow (and, in fullnat, its SNAT port) is created only for a client whose ACK
//! carries a valid cookie, and the backend connection is opened then, with the options the
//! cookie kept. Spoofed SYNs cost neither flow-table slots nor SNAT ports.
//!
//! # Contract
//!
//! - **When.** A TCP packet without a flow for a service whose setting is `On`, or `Auto`
//!   while the flow table's embryonic count is above the threshold (engaged until it falls
//!   below half of it: each pipeline keeps that state), goes here (`schedule` hands it
//!   over). An ACK without a flow comes here whenever the setting is not `Off` (a client
//!   answered while `auto` was engaged completes its handshake after it let go).
//! - **SYN → SYN-ACK.** The client's SYN is rewritten in place into the SYN-ACK (fresh
//!   IP header without options, TTL 64; MACs towards the client's next hop), ISN = cookie,
//!   `ack = client ISN + 1`, options: MSS (the cookie table's value, at most the client's),
//!   window scale [`WSCALE`] and SACK-permitted, each only when the client sent it. No
//!   timestamps: they are dropped, so neither side uses them (nothing to translate). No
//!   flow, no SNAT port; source ranges and the freeze switch apply (the rate limit applies
//!   to the ACK that makes the flow). Counted in `synproxy_syns`.
//! - **ACK → SYN.** A client ACK (no SYN, no RST) without a flow whose `ack - 1` is a valid
//!   cookie is rewritten into the SYN to the backend (`seq = client ISN = ack.seq - 1`, the
//!   cookie's MSS, the client's window scale and SACK-permitted; its own IP header kept) and
//!   takes the new-flow path (every check, the scheduler, the insert, the SNAT port), the
//!   flow marked `FLAG_SYNPROXY`, its sequence word pending (cookie, the client's window
//!   and scale). Counted in `synproxy_acks`. Data on that ACK is dropped (the client
//!   retransmits it). An invalid cookie is `Drop(SynCookieInvalid)` while the proxy is
//!   engaged, except for `mh` services, which schedule a non-SYN anyway as before; when it
//!   is not engaged the ACK takes the old path (`NoFlow`). The SYN is longer than the ACK
//!   (12 bytes of options): it needs a frame buffer with room (`process_frame`, a
//!   [`FrameBatch`](super::FrameBatch) with `buffer`); without room the ACK is
//!   `Drop(SynproxyNoRoom)` (never in the workers: UMEM frames have room).
//! - **Backend SYN-ACK → ACK.** The backend's SYN-ACK records the sequence delta (backend
//!   ISN − cookie) and the window scales in the flow's sequence word and is rewritten into
//!   the ACK to the backend (`seq = client ISN + 1`, `ack = backend ISN + 1`, the client's
//!   window), sent back to the backend; the flow becomes ESTABLISHED. A retransmitted
//!   SYN-ACK is answered again. A backend RST before that is forwarded to the client with
//!   `seq = cookie + 1` (so the client accepts it); anything else of a pending flow, either
//!   way, is `Drop(SynproxyPending)` (client data is retransmitted).
//! - **Established.** Client → backend: `ack += delta`, SACK block edges `+= delta`;
//!   backend → client: `seq -= delta`; windows rescaled where the two sides' scales differ
//!   (the backend chose its own, the client was told [`WSCALE`]). Incremental checksums,
//!   then the usual NAT rewrite.
//! - **Cost.** Proxied flows carry the flow table's `FLAG_SLOW`: the IPv4 shortcut's
//!   lookup (`lookup_v4`) does not find them, so the hits of other flows pay nothing (not a
//!   test); a shortcut miss looks again with the general lookup once the table ever held a
//!   proxied flow, and a proxied flow's packets take the general path (`forward` tests the
//!   flag there).

use std::net::IpAddr;
use std::time::Instant;

use flowtable::{Direction, FlowHit, TcpFlags};

use super::classify::{self, Frag, PROTO_TCP, Packet};
use super::{DropReason, FrameBatch, Pipeline, Verdict, flow_key, reject};
use crate::snapshot::{Frontend, SynproxySetting};
use crate::wire::{TcpPacket, checksum};

mod cookie;

pub use cookie::CookieKey;
use cookie::{SynOptions, Tuple};

/// The window scale xvs tells a client (Linux's usual choice, so that most backends' windows
/// need no rescaling).
pub const WSCALE: u8 = 7;

/// The window xvs advertises in its SYN-ACK (unscaled, as in any SYN).
const SYNACK_WINDOW: u16 = 65535;
/// The window of the ACK answering a retransmitted SYN-ACK (the client's is no longer known).
const REACK_WINDOW: u16 = 1024;
/// TTL / hop limit of the frames xvs makes (SYN-ACK, ACK).
const TTL: u8 = 64;
/// Most bytes of an ACK's headers saved to restore it when its SYN is not sent.
const SAVE_MAX: usize = 256;

/// The sequence word: established (the delta is known).
const EST: u64 = 1 << 52;
const _: () = assert!(EST >> flowtable::SEQ_BITS == 0);

/// A pending word: the cookie, the client's window field and window scale (15: none).
fn pending(cookie: u32, window: u16, wscale: Option<u8>) -> u64 {
    u64::from(cookie) | u64::from(window) << 32 | u64::from(wscale.map_or(15, |w| w.min(14))) << 48
}

/// An established word: the delta and the shifts (backend's in, client's out, client →
/// backend's left shift when only the client scales).
fn established(delta: u32, b_in: u8, c_out: u8, c2b: u8) -> u64 {
    EST | u64::from(delta)
        | u64::from(b_in & 15) << 32
        | u64::from(c_out & 15) << 36
        | u64::from(c2b & 15) << 40
}

#[inline]
fn put(d: &mut [u8], at: usize, b: &[u8]) {
    if let Some(x) = d.get_mut(at..at + b.len()) {
        x.copy_from_slice(b);
    }
}

/// A TCP segment header to write (also the reject's RST, `reject`).
pub(super) struct Seg {
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) seq: u32,
    pub(super) ack: u32,
    pub(super) flags: u8,
    pub(super) window: u16,
    pub(super) opts: SynOptions,
}

impl Seg {
    pub(super) fn len(&self) -> usize {
        20 + self.opts.len()
    }

    /// Writes the header (checksum 0) at the start of `out` (which holds `len()` bytes).
    fn write(&self, out: &mut [u8]) {
        let Some(hdr) = out.get_mut(..self.len()) else {
            return;
        };
        hdr[12] = 0;
        let mut t = TcpPacket::new_unchecked(&mut hdr[..]);
        t.set_src_port(self.sport);
        t.set_dst_port(self.dport);
        t.set_seq_number(self.seq);
        t.set_ack_number(self.ack);
        t.set_header_len(self.len());
        t.set_flags(TcpFlags(self.flags));
        t.set_window_len(self.window);
        t.set_checksum(0);
        t.set_urgent_at(0);
        self.opts.write(&mut hdr[20..]);
    }
}

/// The TCP checksum of `seg` between `src` and `dst`, computed from scratch.
fn tcp_checksum(src: IpAddr, dst: IpAddr, seg: &[u8]) -> u16 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            checksum::l4_checksum_v4(&s.octets(), &d.octets(), PROTO_TCP, seg)
        }
        (s, d) => {
            let b = |a: IpAddr| match a {
                IpAddr::V6(v6) => v6.octets(),
                IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            };
            checksum::l4_checksum_v6(&b(s), &b(d), PROTO_TCP, seg)
        }
    }
}

/// Writes a new IP header (IPv4 without options, or IPv6 without extension headers) at
/// `l3` from `src` to `dst`, then `seg`, with every checksum; zeroes the rest of the frame.
/// `None` (nothing written) when the frame is too short: the caller made sure it is not.
pub(super) fn emit(frame: &mut [u8], l3: usize, src: IpAddr, dst: IpAddr, seg: &Seg) -> Option<()> {
    let ip_len = if src.is_ipv6() { 40 } else { 20 };
    let l4 = l3 + ip_len;
    let end = l4 + seg.len();
    frame.get(..end)?;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut frame[l3..l4];
            let total = (ip_len + seg.len()) as u16;
            h[..12].copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, TTL, PROTO_TCP, 0, 0]);
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let c = checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let h = &mut frame[l3..l4];
            h[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, PROTO_TCP, TTL]);
            h[4..6].copy_from_slice(&(seg.len() as u16).to_be_bytes());
            h[8..24].copy_from_slice(&s.octets());
            h[24..40].copy_from_slice(&d.octets());
        }
        _ => return None,
    }
    if l3 >= 14 {
        // A VLAN-tagged frame keeps its tag; the EtherType before l3 says the family.
        let et: u16 = if src.is_ipv6() { 0x86dd } else { 0x0800 };
        put(frame, l3 - 2, &et.to_be_bytes());
    }
    seg.write(&mut frame[l4..end]);
    let c = tcp_checksum(src, dst, &frame[l4..end]);
    frame[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
    frame[end..].fill(0);
    Some(())
}

/// Updates the TCP checksum of the segment at `l4` (header `hdr` bytes) for whatever `f`
/// changes in bytes 4..16 and 18..hdr (sequence numbers, flags, window, options): the sums
/// of those ranges before and after, as one word (RFC 1624).
fn retouch(frame: &mut [u8], l4: usize, hdr: usize, f: impl FnOnce(&mut [u8])) {
    let Some(tcp) = frame.get_mut(l4..l4 + hdr) else {
        return;
    };
    let region = |t: &[u8]| checksum::add(checksum::sum(&t[4..16]), checksum::sum(&t[18..]));
    let before = region(tcp);
    f(tcp);
    let after = region(tcp);
    let mut t = TcpPacket::new_unchecked(tcp);
    let c = checksum::update_u16(t.checksum(), before, after);
    t.set_checksum(c);
}

/// `delta` added to both edges of every SACK block among the options `opts`.
fn shift_sack(opts: &mut [u8], delta: u32) {
    let mut i = 0;
    while let Some(&kind) = opts.get(i) {
        match kind {
            0 => return,
            1 => i += 1,
            _ => {
                let len = usize::from(opts.get(i + 1).copied().unwrap_or(0));
                if len < 2 || i + len > opts.len() {
                    return;
                }
                if kind == 5 {
                    for at in (i + 2..i + len).step_by(4) {
                        if let Some(b) = opts.get_mut(at..at + 4) {
                            let v = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                            b.copy_from_slice(&v.wrapping_add(delta).to_be_bytes());
                        }
                    }
                }
                i += len;
            }
        }
    }
}

/// A window field rescaled from `from` to `to` shifts, saturated.
#[inline]
fn rescale(win: u16, from: u8, to: u8) -> u16 {
    ((u32::from(win) << from) >> to).min(0xffff) as u16
}

/// What the SYN proxy decided for a packet without a flow.
enum Miss {
    /// The verdict, and the frame's new length (for `Tx`).
    Done(Verdict, usize),
    /// Not the proxy's: the usual new-flow path, without the proxy.
    Usual,
}

impl Pipeline {
    /// From `schedule`, for a TCP packet with TCP flags `flags` without a flow, of a service
    /// with SYN proxy `setting`: whether the SYN proxy takes it (see the module doc).
    #[inline(never)]
    pub(super) fn synproxy_takes(&self, setting: SynproxySetting, flags: u8) -> bool {
        match TcpFlags(flags).handshake() {
            TcpFlags::SYN => self.synproxy_engaged(setting),
            TcpFlags::ACK => setting != SynproxySetting::Off,
            _ => false,
        }
    }

    /// Whether `setting` engages the proxy now (`Auto`: the flow table's embryonic count,
    /// with this pipeline's hysteresis).
    fn synproxy_engaged(&self, setting: SynproxySetting) -> bool {
        match setting {
            SynproxySetting::Off => false,
            SynproxySetting::On => true,
            SynproxySetting::Auto { embryonic_max } => {
                let n = self.flows.embryonic();
                let max = u64::from(embryonic_max);
                let on = if self.synproxy_auto.get() {
                    n >= max / 2
                } else {
                    n > max
                };
                self.synproxy_auto.set(on);
                on
            }
        }
    }

    /// A packet without a flow that `schedule` gave the SYN proxy, in a frame that cannot
    /// grow (its SYN-ACK fits; its SYN to a backend does not: `Drop(SynproxyNoRoom)`, which
    /// a caller with room turns into [`synproxy_room`](Self::synproxy_room)).
    #[cold]
    #[inline(never)]
    pub(super) fn synproxy_miss(&mut self, frame: &mut [u8], now: Instant) -> Verdict {
        let len = frame.len();
        self.synproxy_grow(frame, len, false, now).0
    }

    /// [`synproxy_miss`](Self::synproxy_miss) for frame `i` of a batch, with its buffer's
    /// room; the verdict, uncounted.
    #[cold]
    #[inline(never)]
    pub(super) fn synproxy_room<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        i: usize,
        now: Instant,
    ) -> Verdict {
        let len = frames.frame(i).len();
        let buf = frames.buffer(i);
        let (v, n) = self.synproxy_grow(buf, len, true, now);
        if v.tx_port().is_some() && n != len {
            frames.set_len(i, n);
        }
        v
    }

    /// The SYN proxy for the frame `buf[..len]` (room: the rest of `buf` may be used): the
    /// verdict and, for `Tx`, the frame's new length.
    pub(super) fn synproxy_grow(
        &mut self,
        buf: &mut [u8],
        len: usize,
        room: bool,
        now: Instant,
    ) -> (Verdict, usize) {
        let Some(frame) = buf.get_mut(..len) else {
            return (Verdict::Drop(DropReason::Truncated), len);
        };
        let p = match classify::classify(frame) {
            Ok(p) => p,
            Err(v) => return (v, len),
        };
        let key = flow_key(&p);
        match self.synproxy_decide(buf, len, room, &p, now) {
            Miss::Done(v, n) => (v, n),
            Miss::Usual => {
                let frame = &mut buf[..len];
                let v = self.new_flow_as(frame, &p, key, now, super::create::Proxy::Never);
                if v == reject::NO_ROOM && room {
                    return self.reject_again(buf, len, now);
                }
                (v, len)
            }
        }
    }

    fn synproxy_decide(
        &mut self,
        buf: &mut [u8],
        len: usize,
        room: bool,
        p: &Packet,
        now: Instant,
    ) -> Miss {
        if p.proto != PROTO_TCP || p.frag != Frag::No {
            return Miss::Usual;
        }
        let fe = Frontend {
            vip: p.dst,
            protocol: vocab::Protocol::Tcp,
            port: p.dport,
        };
        let Some(svc) = self.snapshot.service_for(&fe) else {
            return Miss::Usual;
        };
        let (setting, admits, frozen) = (
            svc.synproxy,
            svc.admits(p.src),
            svc.frozen || self.snapshot.frozen,
        );
        let mh = matches!(svc.scheduler, lb_algos::Scheduler::Mh(_));
        if p.ttl <= 1 {
            return Miss::Done(Verdict::Drop(DropReason::TtlExceeded), len);
        }
        match TcpFlags(p.flags).handshake() {
            TcpFlags::SYN if self.synproxy_engaged(setting) => {
                if !admits {
                    return Miss::Done(Verdict::Drop(DropReason::SourceRange), len);
                }
                if frozen {
                    return Miss::Done(Verdict::Drop(DropReason::Frozen), len);
                }
                let frame = &mut buf[..len];
                Miss::Done(self.syn_cookie(frame, p, now), len)
            }
            TcpFlags::ACK if setting != SynproxySetting::Off => {
                let tcp = &buf[p.l4..p.l4 + p.l4_len];
                let t = TcpPacket::new_unchecked(tcp);
                let (seq, ack) = (t.seq_number(), t.ack_number());
                let t = Tuple {
                    client: p.src,
                    client_port: p.sport,
                    vip: p.dst,
                    vip_port: p.dport,
                };
                let count = cookie::count_of(self.tick(now).get());
                let (cookie, client_isn) = (ack.wrapping_sub(1), seq.wrapping_sub(1));
                match cookie::check(&self.config.synproxy_key, &t, cookie, client_isn, count) {
                    Some(_) if !room => Miss::Done(Verdict::Drop(DropReason::SynproxyNoRoom), len),
                    Some(data) => self.cookie_ack(buf, len, p, (cookie, client_isn, data), now),
                    None if mh || !self.synproxy_engaged(setting) => Miss::Usual,
                    None => Miss::Done(Verdict::Drop(DropReason::SynCookieInvalid), len),
                }
            }
            _ => Miss::Usual,
        }
    }

    /// A client's SYN answered: the frame becomes the SYN-ACK with the cookie.
    fn syn_cookie(&mut self, frame: &mut [u8], p: &Packet, now: Instant) -> Verdict {
        let Some(nh) = self.next_hop(p.src) else {
            return Verdict::Slow;
        };
        let Some(tcp) = frame.get(p.l4..p.l4 + p.l4_len) else {
            return Verdict::Drop(DropReason::Truncated);
        };
        let t = TcpPacket::new_unchecked(tcp);
        let hdr = t.header_len();
        let opts = SynOptions::parse(tcp.get(20..hdr).unwrap_or(&[]), p.v6);
        let client_isn = t.seq_number();
        let t = Tuple {
            client: p.src,
            client_port: p.sport,
            vip: p.dst,
            vip_port: p.dport,
        };
        let data = opts.data(p.v6);
        let count = cookie::count_of(self.tick(now).get());
        let isn = cookie::make(&self.config.synproxy_key, &t, client_isn, count, data);
        let kept = SynOptions::of_data(data, p.v6);
        let seg = Seg {
            sport: p.dport,
            dport: p.sport,
            seq: isn,
            ack: client_isn.wrapping_add(1),
            flags: (TcpFlags::SYN | TcpFlags::ACK).bits(),
            window: SYNACK_WINDOW,
            opts: SynOptions {
                mss: kept.mss,
                mss_sent: opts.mss_sent,
                wscale: opts.wscale.map(|_| WSCALE),
                sack: opts.sack,
            },
        };
        // (The echoed options take no more room than the client's: the SYN-ACK fits.)
        if emit(frame, p.l3, p.dst, p.src, &seg).is_none() {
            return Verdict::Drop(DropReason::Truncated);
        }
        frame[..6].copy_from_slice(&nh.dst_mac);
        frame[6..12].copy_from_slice(&nh.src_mac.unwrap_or(self.config.mac));
        self.counters.synproxy_syns += 1;
        Verdict::Tx(nh.port)
    }

    /// A client's ACK with a valid cookie (`cookie`, the client's ISN, the cookie's data):
    /// the frame becomes the SYN to the backend, which the new-flow path sends.
    fn cookie_ack(
        &mut self,
        buf: &mut [u8],
        len: usize,
        p: &Packet,
        (cookie, client_isn, data): (u32, u32, u32),
        now: Instant,
    ) -> Miss {
        let opts = SynOptions::of_data(data, p.v6);
        let window = TcpPacket::new_unchecked(&buf[p.l4..]).window_len();
        let seg = Seg {
            sport: p.sport,
            dport: p.dport,
            seq: client_isn,
            ack: 0,
            flags: TcpFlags::SYN.bits(),
            window: rescale(window, opts.wscale.unwrap_or(0), 0),
            opts,
        };
        let end = p.l4 + seg.len();
        if end > buf.len() || end - p.l3 > SAVE_MAX {
            return Miss::Done(Verdict::Drop(DropReason::SynproxyNoRoom), len);
        }
        let mut saved = [0u8; SAVE_MAX];
        let keep = end.min(len) - p.l3;
        saved[..keep].copy_from_slice(&buf[p.l3..p.l3 + keep]);
        // The client's IP header stays (the usual rewrite follows); its length changes.
        let ip_hdr = p.l4 - p.l3;
        if p.v6 {
            let plen = (ip_hdr - 40 + seg.len()) as u16;
            put(buf, p.l3 + 4, &plen.to_be_bytes());
        } else {
            put(buf, p.l3 + 2, &((ip_hdr + seg.len()) as u16).to_be_bytes());
            put(buf, p.l3 + 10, &[0, 0]);
            let c = checksum::checksum(&buf[p.l3..p.l4]);
            put(buf, p.l3 + 10, &c.to_be_bytes());
        }
        seg.write(&mut buf[p.l4..end]);
        let c = tcp_checksum(p.src, p.dst, &buf[p.l4..end]);
        put(buf, p.l4 + 16, &c.to_be_bytes());
        let frame = &mut buf[..end];
        let verdict = match classify::classify(frame) {
            Ok(q) => {
                let word = pending(cookie, window, opts.wscale);
                let key = flow_key(&q);
                self.new_flow_as(frame, &q, key, now, super::create::Proxy::Proxied(word))
            }
            Err(v) => v,
        };
        if let Verdict::Tx(_) = verdict {
            self.counters.synproxy_acks += 1;
            return Miss::Done(verdict, end);
        }
        // Not sent: the frame as it arrived.
        buf[p.l3..p.l3 + keep].copy_from_slice(&saved[..keep]);
        if let Some(reason) = reject::pending_reason(verdict) {
            // No backend for a client that holds a connection (the cookie's): reset it.
            let (v, n) = self.reject_grow(buf, len, reason, now);
            return Miss::Done(v, n);
        }
        Miss::Done(verdict, len)
    }

    /// A packet of a proxied flow (`hit`): translated, or the handshake's next step.
    #[cold]
    #[inline(never)]
    pub(super) fn proxied(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        now: Instant,
        touch: bool,
    ) -> Verdict {
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let Some(tcp) = frame.get(p.l4..p.l4 + p.l4_len.min(60)) else {
            return Verdict::Drop(DropReason::Truncated);
        };
        if p.proto != PROTO_TCP || !p.has_l4() || tcp.len() < 20 {
            return self.forward_plain(frame, p, hit, now, touch);
        }
        let hdr = TcpPacket::new_unchecked(tcp).header_len();
        if hdr > tcp.len() {
            return Verdict::Drop(DropReason::BadL4Header);
        }
        let Some(word) = self.flows.seq(hit.handle) else {
            return Verdict::Drop(DropReason::SynproxyPending);
        };
        let reply = hit.dir == Direction::Reply;
        if reply && TcpFlags(p.flags).handshake() == TcpFlags::SYN | TcpFlags::ACK {
            return self.synack_to_ack(frame, p, hit, word, now);
        }
        // What the rewrite below needs first: a next hop (else the frame stays as it came).
        if self.next_hop(hit.dst_ip()).is_none() {
            return Verdict::Slow;
        }
        let delta = word as u32;
        let (b_in, c_out, c2b) = (
            (word >> 32) as u8 & 15,
            (word >> 36) as u8 & 15,
            (word >> 40) as u8 & 15,
        );
        match (reply, word & EST != 0) {
            (true, false) if TcpFlags(p.flags).contains(TcpFlags::RST) => {
                // The backend refused: the client takes a reset in its own sequence space.
                retouch(frame, p.l4, hdr, |t| {
                    TcpPacket::new_unchecked(t).set_seq_number(delta.wrapping_add(1))
                });
            }
            (_, false) => return Verdict::Drop(DropReason::SynproxyPending),
            (true, true) => retouch(frame, p.l4, hdr, |t| {
                let mut t = TcpPacket::new_unchecked(t);
                t.set_seq_number(t.seq_number().wrapping_sub(delta));
                if b_in != c_out {
                    t.set_window_len(rescale(t.window_len(), b_in, c_out));
                }
            }),
            (false, true) => retouch(frame, p.l4, hdr, |t| {
                let mut v = TcpPacket::new_unchecked(&mut t[..]);
                if v.flags().contains(TcpFlags::ACK) {
                    v.set_ack_number(v.ack_number().wrapping_add(delta));
                }
                if c2b != 0 {
                    v.set_window_len(rescale(v.window_len(), c2b, 0));
                }
                if let Some(opts) = t.get_mut(20..) {
                    shift_sack(opts, delta);
                }
            }),
        }
        self.forward_plain(frame, p, hit, now, touch)
    }

    /// The backend's SYN-ACK on a proxied flow: the delta recorded (first time), the frame
    /// rewritten into the ACK back to the backend.
    fn synack_to_ack(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        word: u64,
        now: Instant,
    ) -> Verdict {
        let Some(nh) = self.next_hop(p.src) else {
            return Verdict::Slow;
        };
        let tcp = &frame[p.l4..];
        let t = TcpPacket::new_unchecked(tcp);
        let hdr = t.header_len();
        let (backend_isn, ack_in) = (t.seq_number(), t.ack_number());
        let window = if word & EST == 0 {
            let backend = SynOptions::parse(tcp.get(20..hdr).unwrap_or(&[]), p.v6);
            let (cookie, window, ws) = (word as u32, (word >> 32) as u16, (word >> 48) as u8 & 15);
            let (b_in, c_out, c2b) = match (ws != 15, backend.wscale) {
                (false, _) => (0, 0, 0),
                (true, Some(wb)) => (wb, WSCALE, 0),
                (true, None) => (0, WSCALE, ws),
            };
            let new = established(backend_isn.wrapping_sub(cookie), b_in, c_out, c2b);
            if self.flows.update_seq(hit.handle, word, new) {
                rescale(window, c2b, 0)
            } else {
                // Another worker's copy of this SYN-ACK won; or the flow is gone.
                match self.flows.seq(hit.handle) {
                    Some(w) if w & EST != 0 => REACK_WINDOW,
                    _ => return Verdict::Drop(DropReason::SynproxyPending),
                }
            }
        } else {
            REACK_WINDOW
        };
        let seg = Seg {
            sport: p.dport,
            dport: p.sport,
            seq: ack_in,
            ack: backend_isn.wrapping_add(1),
            flags: TcpFlags::ACK.bits(),
            window,
            opts: SynOptions::default(),
        };
        if emit(frame, p.l3, p.dst, p.src, &seg).is_none() {
            return Verdict::Drop(DropReason::Truncated);
        }
        frame[..6].copy_from_slice(&nh.dst_mac);
        frame[6..12].copy_from_slice(&nh.src_mac.unwrap_or(self.config.mac));
        // SYN_SENT -> SYN_RECV (passive health: answered), then our ACK: ESTABLISHED. (A
        // proxied flow keeps no sequence samples: what the rewritten frame holds is not read.)
        self.touch(hit, p.flags, frame, p.l4, now);
        let tick = self.tick(now);
        self.flows
            .on_packet(hit.handle, Direction::Original, TcpFlags::ACK, tick);
        Verdict::Tx(nh.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sack_blocks_shift_and_garbage_is_left_alone() {
        let mut o = [
            1, 1, 5, 18, 0, 0, 0, 1, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,
        ];
        shift_sack(&mut o, 10);
        assert_eq!(
            o,
            [
                1, 1, 5, 18, 0, 0, 0, 11, 0, 0, 0, 12, 0, 0, 0, 9, 0, 0, 0, 10
            ]
        );
        for bad in [&mut [5u8, 0, 1, 2][..], &mut [5, 40, 1], &mut [5]] {
            let before = bad.to_vec();
            shift_sack(bad, 1);
            assert_eq!(bad.to_vec(), before);
        }
    }

    #[test]
    fn windows_rescale_saturating() {
        assert_eq!(rescale(100, 7, 7), 100);
        assert_eq!(rescale(100, 9, 7), 400);
        assert_eq!(rescale(400, 7, 9), 100);
        assert_eq!(rescale(0x8000, 7, 0), 0xffff);
    }

    #[test]
    fn words_keep_their_fields() {
        let w = pending(0xdead_beef, 502, Some(7));
        assert_eq!(
            (w as u32, (w >> 32) as u16, (w >> 48) & 15),
            (0xdead_beef, 502, 7)
        );
        assert_eq!((pending(1, 2, None) >> 48) & 15, 15);
        let e = established(0x8000_0001, 8, 7, 0);
        assert!(e & EST != 0 && e >> flowtable::SEQ_BITS == 0);
        assert_eq!(
            (e as u32, (e >> 32) & 15, (e >> 36) & 15),
            (0x8000_0001, 8, 7)
        );
    }
}
