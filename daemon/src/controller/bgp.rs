//! The controller's side of `[bgp]`: when the node announces, and what.
//!
//! - **Ready.** Nothing is announced (no [`Action::Announce`], so the driver opens no
//!   liveness device) until [`Controller::ready_to_announce`]: the first snapshot of the
//!   configured source is published. That method is the one place where readiness
//!   conditions go (a tier will add: the peers' full dump of their flows arrived).
//! - **What.** [`slowpath::bgp::announcement`] of the published snapshot: VIPs with a usable
//!   backend that is verified ([`super::health`]: with active probes, one has passed; at a
//!   start nothing is, so a VIP whose backends are all dead is never announced), this
//!   node's SNAT addresses, the peers' as backups; nothing while draining (an admin drain,
//!   until `undrain`; the drain after a stop signal). The include file
//!   ([`slowpath::bgp::render`]) is emitted whenever its text changes, including after a
//!   first passing probe and after a reload that changed `[bgp]` or the peers.
//! - **Stop.** Before [`Action::Stop`], an include file announcing nothing; the driver also
//!   closes the liveness device at the stop, which withdraws everything at once.

use std::net::IpAddr;

use slowpath::bgp::{self, Include, Inputs, RouteKind};

use super::{Action, Controller};

impl Controller {
    /// Whether the node may announce: the first snapshot of its source is published, and
    /// (with `[sync]`) the peers' flows are in, so that no flow ECMP brings here finds
    /// nothing (a node that announced before its peers' dump would reset them).
    pub fn ready_to_announce(&self) -> bool {
        self.synced_once && self.peers_ready
    }

    /// Flow sync says whether its start-up dumps are in (the driver, every loop).
    pub fn set_peers_ready(&mut self, ready: bool) {
        if ready != self.peers_ready {
            self.peers_ready = ready;
            if ready {
                tracing::info!(target: "xvs", "the peers' flows are in: announcing");
            }
            self.emit_announcement();
        }
    }

    /// This node's own addresses, besides `[node] addresses`: NodePort frontends listen on
    /// them, and they are never announced (the driver reads the interfaces' addresses).
    pub fn set_node_addresses(&mut self, addrs: Vec<IpAddr>) {
        self.node_addresses = addrs;
        self.announce_inputs = None;
        self.emit_announcement();
    }

    /// The include file for the published snapshot (nothing announced when `withdraw`).
    fn include(&self, withdraw: bool) -> Option<Include> {
        let snap = self.current.as_deref()?;
        let backups = self.cfg.bgp_backups();
        let mut node = self.node_addresses.clone();
        node.extend(self.cfg.node.addresses.iter().copied());
        let a = bgp::announcement(
            snap,
            &Inputs {
                snat_addresses: &self.cfg.dataplane.snat_addresses,
                backups: &backups,
                node_addresses: &node,
                unverified: self.health.unverified(),
                draining: withdraw || self.admin_drain || self.drain.is_some(),
            },
        );
        Some(Include {
            path: self.cfg.bgp.include.clone(),
            text: bgp::render(&self.cfg.bgp, &a),
            vips: a.count(RouteKind::Vip),
            snat: a.count(RouteKind::Snat),
            backups: a.count(RouteKind::Backup),
        })
    }

    /// Emits the include file when it changed (see the module doc).
    pub(super) fn emit_announcement(&mut self) {
        if !self.cfg.bgp.enable
            || self.stopping
            || self.awaiting.is_some()
            || !self.ready_to_announce()
        {
            return;
        }
        // Rendering costs a line per VIP: only when an input changed (the published
        // snapshot, the drain, the config, the backends verified).
        let inputs = (
            self.current.as_ref().map_or(0, |s| s.generation),
            self.admin_drain || self.drain.is_some(),
            self.counters.reloads_ok,
            self.health.epoch(),
        );
        if self.announce_inputs == Some(inputs) {
            return;
        }
        let Some(inc) = self.include(false) else {
            return;
        };
        self.announce_inputs = Some(inputs);
        if self.announced.as_ref() != Some(&inc) {
            debug_assert!(
                self.synced_once && !self.stopping,
                "BGP rule: announce only once ready, never once stopping"
            );
            self.log_announcement(&inc);
            self.announced = Some(inc.clone());
            self.actions.push_back(Action::Announce(inc));
        }
    }

    /// At the stop: an include file announcing nothing, if anything was announced.
    pub(super) fn withdraw_all(&mut self) {
        if self.announced.is_none() {
            return;
        }
        if let Some(inc) = self.include(true)
            && self.announced.as_ref() != Some(&inc)
        {
            self.announced = Some(inc.clone());
            self.actions.push_back(Action::Announce(inc));
        }
    }

    fn log_announcement(&self, inc: &Include) {
        let was = self.announced.as_ref();
        if was.map(|w| (w.vips, w.snat, w.backups)) != Some((inc.vips, inc.snat, inc.backups)) {
            tracing::info!(
                target: "xvs",
                vips = inc.vips,
                snat = inc.snat,
                backups = inc.backups,
                "BGP: announcing"
            );
        }
    }
}
