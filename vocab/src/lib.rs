//! The names xvs's parts share, each defined once: what the config file, the data plane (the
//! pipeline, the flow table, the schedulers) and the control plane (the snapshot builder, the
//! Kubernetes source, the daemon) must agree on.
//!
//! What belongs here:
//!
//! - IP protocol numbers ([`ip_proto`]) and the L4 [`Protocol`] (a flow's, a frontend's);
//! - TCP header flags ([`TcpFlags`]), and the SCTP chunk types ([`sctp`]) that the flow
//!   table's state machine reads as TCP flags ([`sctp_events`]);
//! - the scheduler kinds, by their IPVS names ([`SchedulerKind`]);
//! - modes: forwarding ([`Mode`], a DSR service's [`Encap`]), XDP attach ([`XdpMode`]), AF_XDP bind ([`ZeroCopy`]);
//! - IP prefixes ([`Cidr`]).
//!
//! Plain values with their names, numbers, parsing and formatting: no behaviour (no state
//! machine, no scheduler, no I/O, nothing that depends on a packet or a clock) and no
//! dependency on another xvs crate, so that every crate can use it. A type one crate alone
//! uses belongs in that crate.
//!
//! With the `serde` feature (the config crate turns it on) the config deserializes straight
//! into these types, under the names the config file uses.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod cidr;
pub mod ip_proto;
mod mode;
mod protocol;
mod scheduler;
pub mod sctp;
mod tcp;

pub use cidr::Cidr;
pub use mode::{Encap, Mode, XdpMode, ZeroCopy};
pub use protocol::Protocol;
pub use scheduler::{SchedulerKind, UnknownScheduler};
pub use sctp::sctp_events;
pub use tcp::TcpFlags;
