//! The xvs daemon as a library: between the data plane (`fastpath`), the slowpath's sources
//! and servers (`slowpath`), and the `xvs` binary, which keeps only argument parsing and
//! printing.
//!
//! - [`controller`]: the sans-IO controller. Events and `now` in, actions out; no threads,
//!   sockets, files or clock, so the daemon's rules (publish, endpoint removal, id reclaim,
//!   drain, reload, readiness) are tested on a fake clock without root.
//! - [`driver`]: the thin driver that owns the I/O: the flow table, AF_XDP sockets and pinned
//!   workers, the steering programs, ONE tokio runtime for the slowpath (Kubernetes source,
//!   health checks, neighbours, admin servers, health-check node ports) with one shutdown
//!   signal, and the loop that feeds the controller and performs its actions.
//! - [`startcheck`]: what `xvs run` refuses in a valid config without looking at the host
//!   (`xvs check` runs it too); [`preflight`] and [`caps`]: what it checks of the host before
//!   it touches anything (and `xvs check --host` lists), every problem at once;
//!   capabilities by name rather than uid 0.
//! - [`logging`]: `tracing` with `[log]` level and format; library logs (`log` users too) go
//!   through it.
//!
//! - [`watch`]: when a changed config file is reloaded (once it stopped changing).
//!
//! The fastpath never imports any of this; the arrows point from here down.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod admin;
pub mod caps;
pub mod controller;
pub mod driver;
pub mod hold;
pub mod logging;
pub mod preflight;
pub mod startcheck;
pub mod state;
pub mod takeover;
pub mod watch;

// The config's limits are the crates' own (see `config`'s `validate`).
const _: () = {
    assert!(config::MH_TABLE_SIZE_MAX == lb_algos::mh::TABLE_SIZE_MAX);
    assert!(config::WRR_SEQUENCE_MAX == lb_algos::wrr::SEQUENCE_MAX);
    assert!((config::FLOWS_MAX as usize) < flowtable::CAPACITY_MAX);
    assert!(config::BACKENDS_MAX as usize == lb_algos::BACKENDS_MAX);
};
