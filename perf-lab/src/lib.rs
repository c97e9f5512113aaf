//! perf-lab: the xvs benchmark rig (issue 7).
//!
//! - [`rig`]: the network namespaces (client, LB node, switch, backends) and their veths.
//! - [`frame`]: the packets the generator sends (Ethernet/IPv4/UDP|TCP + a 20-byte payload
//!   carrying a sequence number and a send timestamp) and their checksums.
//! - [`generator`], [`sink`]: AF_XDP transmit in the client namespace, AF_XDP receive in each
//!   backend namespace (libxdp's default program), loss by sequence bitmap, latency histogram.
//! - [`reflect`]: the XDP reflector of saturation mode (`bpf/reflect.c`).
//! - [`target`]: the load balancers under test (xvs, nftables, iptables, AF_XDP l2fwd).
//! - [`l2fwd`]: the AF_XDP MAC-rewrite forwarder (the AF_XDP ceiling).
//! - [`bench`]: scenarios, one measured run, the NDR search, the JSON result.
//! - [`restart`]: the restart scenario's figures (xvs killed or stopped under load).
//! - [`realclient`]: the real-client scenarios (iperf3 bulk TCP, ab connection rate).
//! - [`meta`], [`hgrm`]: each result's metadata; latency percentile distributions (`.hgrm`).
//! - [`report`]: Markdown tables and hand-written SVG plots.
//! - [`sys`], [`xsk`]: commands, namespaces, CPU accounting; opening AF_XDP sockets.

pub mod bench;
pub mod cpu;
pub mod frame;
pub mod generator;
pub mod hgrm;
pub mod l2fwd;
pub mod meta;
pub mod realclient;
pub mod reflect;
pub mod report;
pub mod restart;
pub mod rig;
pub mod sink;
pub mod sys;
pub mod target;
pub mod xsk;
