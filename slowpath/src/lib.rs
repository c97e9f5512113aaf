//! The xvs slowpath: state sources, the snapshot builder, health checks and admin HTTP.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
pub mod admin;
pub mod bgp;
pub mod flowsync;
pub mod health;
pub mod k8s;
pub mod neigh;
pub mod repeat;
pub mod service;
pub mod traffic;
