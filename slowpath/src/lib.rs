//! The xvs slowpath: state sources, the snapshot builder, health checks and admin HTTP.
pub mod admin;
pub mod bgp;
pub mod flowsync;
pub mod health;
pub mod k8s;
pub mod neigh;
pub mod repeat;
pub mod service;
pub mod traffic;
