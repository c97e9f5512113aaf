//! The receiving side of the service: judging a datagram (`super`'s module doc gives the
//! order of the checks), counting and logging refusals, acting on what is admitted.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::peer::{self, Refusal, Value};
use super::wire::{self, Kind, Message, Refused};
use super::{
    Installed, LOG_EVERY, Origin, Scan, Service, SyncStats, end, install, random_id, unix_us,
};

/// At most one log line per (reason, source) every [`LOG_EVERY`].
#[derive(Debug, Default)]
pub(super) struct LogGate {
    last: Vec<(&'static str, SocketAddr, Instant, u64)>,
}

impl LogGate {
    /// `Some(refusals not logged since the last line)` when this one may be logged.
    pub(super) fn pass(
        &mut self,
        what: &'static str,
        from: SocketAddr,
        now: Instant,
    ) -> Option<u64> {
        match self.last.iter_mut().find(|e| e.0 == what && e.1 == from) {
            Some(e) if now.saturating_duration_since(e.2) < LOG_EVERY => {
                e.3 += 1;
                None
            }
            Some(e) => {
                let missed = e.3;
                e.2 = now;
                e.3 = 0;
                Some(missed)
            }
            None => {
                // Bounded by the peers times the reasons (strangers share one entry); 256
                // at most all the same.
                if self.last.len() >= 256 {
                    self.last.remove(0);
                }
                self.last.push((what, from, now, 0));
                Some(0)
            }
        }
    }
}

impl Service {
    /// Checks datagram `d` from `from` (see the module doc's order) and admits it through
    /// its peer's state: the peer's index, the message and what admitting it did.
    pub(super) fn judge(
        &mut self,
        d: &[u8],
        from: SocketAddr,
        now: Instant,
    ) -> Result<(usize, Message, peer::Admitted), Refusal> {
        let Some(p) = self.peers.iter().position(|p| p.addr == from) else {
            return Err(Refusal::new(
                Refused::UnknownPeer,
                "source address",
                Value::Addr(from),
            ));
        };
        let m = wire::open(&self.cfg.key, d).map_err(|r| match r {
            Refused::Version if d.len() > 4 => {
                Refusal::new(r, "version", Value::Num(u64::from(d[4])))
            }
            Refused::Auth => Refusal::new(r, "tag", Value::None),
            // Too short, bad magic, kind, record count or node id: its length says enough.
            _ => Refusal::new(r, "datagram of bytes", Value::Num(d.len() as u64)),
        })?;
        let h = &m.head;
        if h.sender == self.cfg.listen {
            return Err(Refusal::new(
                Refused::Reflected,
                "sender",
                Value::Addr(h.sender),
            ));
        }
        if h.receiver != self.cfg.listen {
            return Err(Refusal::new(
                Refused::WrongReceiver,
                "receiver",
                Value::Addr(h.receiver),
            ));
        }
        if h.sender != from {
            return Err(Refusal::new(
                Refused::WrongSender,
                "sender",
                Value::Addr(h.sender),
            ));
        }
        let rng = &self.rng;
        let mut reissue = || random_id(rng);
        let peer = &mut self.peers[p];
        let before = peer.session();
        let r = peer.admit(&m, now, unix_us(), &mut reissue);
        if peer.session() != before && before.is_some() {
            // Whatever became of the datagram that announced it, the peer has a new ticket
            // to learn (and had better hear of it now than at the next hello).
            tracing::info!(peer = %from, session = %format_args!("{:016x}", h.session), "flow sync: the peer has a new session (it restarted); its old datagrams are refused from now on");
            self.hello(Some(p));
        }
        r.map(|a| (p, m, a))
    }

    pub(super) fn receive(&mut self, d: &[u8], from: SocketAddr, now: Instant) {
        let (p, m, a) = match self.judge(d, from, now) {
            Ok(x) => x,
            Err(r) => return self.refused(from, &r, now),
        };
        SyncStats::add(&self.stats.messages_received, 1);
        if a.learnt {
            self.learnt(p, now);
        }
        if a.act {
            self.act(p, m, now);
        }
    }

    /// Counts refusal `r` of a datagram from `from`, and logs it (gated).
    fn refused(&mut self, from: SocketAddr, r: &Refusal, now: Instant) {
        SyncStats::add(&self.stats.rejected[r.reason as usize], 1);
        // Strangers share one gate (their addresses are anyone's to choose); the others
        // come from a listed peer's address.
        let gate = if r.reason == Refused::UnknownPeer {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            from
        };
        if let Some(missed) = self.log_gate.pass(r.reason.name(), gate, now) {
            tracing::warn!(
                from = %from,
                reason = r.reason.name(),
                field = r.field,
                value = %r.value,
                refused_since_last_line = missed,
                "flow sync: datagram refused"
            );
        }
    }

    /// Peer `p` issued this node a new ticket: it can be sent to now. Ask it for its flows
    /// unless its dump is in (also when this node stopped waiting for it: it started while
    /// the peer could not be reached, or asked with a ticket that turned out stale), and
    /// send it this node's own flows active since its start (those its workers logged
    /// before went to nobody; a peer that restarted asks for a dump anyway, which replaces
    /// this).
    fn learnt(&mut self, p: usize, now: Instant) {
        self.hello(Some(p));
        if !self.peers[p].dump_in {
            self.ask(p, now);
        }
        if !self.scans.iter().any(|s| s.to == Some(p)) {
            self.scans.push(Scan {
                to: Some(p),
                dump: false,
                cursor: 0,
                sent: 0,
                since: Some(self.started),
            });
        }
    }

    /// Acts on an admitted datagram of peer `p`.
    fn act(&mut self, p: usize, m: Message, now: Instant) {
        let peer = &mut self.peers[p];
        let was_silent = peer.heard.is_some() && peer.silent(now);
        peer.heard = Some(now);
        if was_silent {
            // A partition healed (or the peer's link came back): what it did meanwhile.
            tracing::info!(peer = %peer.addr, "flow sync: peer heard again; asking for its flows");
            self.ask(p, now);
        }
        match m.kind {
            Kind::Flows => self.install_flows(p, &m, now),
            Kind::Ends => {
                let peer = &self.peers[p];
                let origin = Origin {
                    own_snat: &self.cfg.snat_addresses,
                    peer_snat: &peer.snat,
                };
                let removed = m
                    .ends
                    .iter()
                    .filter(|e| end(&self.flows, e, &origin, now))
                    .count();
                SyncStats::add(&self.stats.flows_removed, removed as u64);
                self.malformed_records(p, m.invalid, now);
            }
            Kind::DumpRequest => {
                // A dump supersedes a catch-up.
                self.scans.retain(|s| s.to != Some(p) || s.dump);
                if !self.scans.iter().any(|s| s.to == Some(p)) {
                    tracing::info!(peer = %self.peers[p].addr, "flow sync: peer asked for a dump");
                    self.scans.push(Scan {
                        to: Some(p),
                        dump: true,
                        cursor: 0,
                        sent: 0,
                        since: None,
                    });
                }
            }
            Kind::DumpEnd => {
                SyncStats::add(&self.stats.dumps_received, 1);
                self.peers[p].dumped = true;
                self.peers[p].dump_in = true;
                tracing::info!(peer = %self.peers[p].addr, flows = m.head.aux, "flow sync: dump received");
            }
            Kind::Hello => {}
        }
    }

    fn install_flows(&mut self, p: usize, m: &Message, now: Instant) {
        self.stats
            .lag_us
            .store(unix_us().saturating_sub(m.head.seq), Ordering::Relaxed);
        let snap = self.snapshot.load();
        let peer = &self.peers[p];
        let origin = Origin {
            own_snat: &self.cfg.snat_addresses,
            peer_snat: &peer.snat,
        };
        let mut invalid = None;
        for r in &m.flows {
            let counter = match install(&self.flows, &snap, r, &origin, now) {
                Installed::New => &self.stats.flows_installed,
                Installed::Updated => &self.stats.flows_updated,
                Installed::Unknown => &self.stats.refused_unknown,
                Installed::Conflict => &self.stats.refused_conflict,
                Installed::Invalid(why) => {
                    invalid = Some((why, r.data));
                    &self.stats.refused_invalid
                }
                Installed::Refused => &self.stats.refused_other,
            };
            SyncStats::add(counter, 1);
        }
        let from = peer.addr;
        if let Some((why, d)) = invalid
            && let Some(missed) = self.log_gate.pass("invalid flow", from, now)
        {
            tracing::warn!(peer = %from, client = %d.client, vip = %d.vip, backend = %d.backend, snat = %d.snat, why, refused_since_last_line = missed, "flow sync: a peer's flow refused");
        }
        self.malformed_records(p, m.invalid, now);
    }

    /// Counts (and logs, gated) `n` records of a datagram of peer `p` that did not decode.
    fn malformed_records(&mut self, p: usize, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        SyncStats::add(&self.stats.refused_malformed, n as u64);
        let from = self.peers[p].addr;
        if let Some(missed) = self.log_gate.pass("malformed record", from, now) {
            tracing::warn!(peer = %from, records = n, refused_since_last_line = missed, "flow sync: a peer's records that do not decode refused");
        }
    }
}
