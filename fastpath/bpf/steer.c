// SPDX-License-Identifier: Apache-2.0
//
// xvs XDP steering program.
//
// Contract: redirect to the AF_XDP socket of the receiving queue ONLY the frames xvs owns,
// XDP_PASS everything else. A frame xvs owns that finds no socket on its queue is passed too,
// except while a restart hold runs (`hold` below, set by the loader and refreshed by the live
// daemon): until its deadline such frames are XDP_DROPped, so that while no xvs runs the
// kernel does not answer them (RST, port unreachable) and kill the flows the next xvs adopts.
// That is the only XDP_DROP. What xvs owns is described by the maps below, which the Rust
// loader (`fastpath::steer::Steering`) keeps in step with the snapshot:
//
//   frontends  {ip, port, proto}  frames TO a VIP:port/proto (TCP, UDP, SCTP)
//   snat       {ip} -> ports      full-NAT replies: TO a SNAT address, dst port in the range
//   backends   {ip, port, proto}  nat-mode replies: FROM a backend's ip:port/proto
//   vips       {ip} -> flags      later IPv4/IPv6 fragments and IPv6 extension headers TO a VIP;
//                                 VIP_REJECT_UNSERVED: TCP/UDP/SCTP to it on ANY port (a
//                                 ClusterIP: xvs rejects the ports no frontend serves)
//   cidrs      LPM {prefix, ip}   TCP/UDP/SCTP TO an address inside a Service CIDR (xvs drops
//                                 those no Service has)
//   xsks       queue -> AF_XDP socket
//   counters   per-CPU u64 array, indexed by enum counter (mirrored in steer/counters.rs)
//   hold       one {deadline_ns, owner_pid}: drop owned frames with no socket until
//              bpf_ktime_get_ns() (CLOCK_MONOTONIC) reaches deadline_ns; 0 means no hold
//
// Addresses are 16 bytes; IPv4 is stored v4-mapped (::ffff:a.b.c.d). Ports in keys are in
// network byte order; the SNAT port range value is in host byte order.
//
// Malformed or short frames go to the kernel (XDP_PASS), which drops them with its own
// counters. Every packet read is bounds-checked against data_end for the verifier.
//
// Only UAPI headers: the map-definition macros and the shared helper prototype are in the
// prelude (bpf-build/include/xvs_bpf.h), the rest here, so the build needs no libbpf-dev.

#include "xvs_bpf.h"
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>

static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define IPPROTO_SCTP_ 132
#define IPV4_FRAG_OFFSET_MASK 0x1fff
#define IPV6_FRAG_OFFSET_MASK 0xfff8

// Capacities; the loader checks against the same numbers (steer/maps.rs).
#define XSKS_MAX 256
#define FRONTENDS_MAX 65536
#define BACKENDS_MAX 65536
#define VIPS_MAX 65536
#define SNAT_MAX 256
#define HOLD_MAX 1
#define CIDRS_MAX 64

// Bits of a `vips` value: a frontend's address; a ClusterIP (every TCP/UDP/SCTP port is xvs's).
#define VIP_FRONTEND 1
#define VIP_REJECT_UNSERVED 2

// Counter indices. Keep in step with `Counter` in steer/counters.rs.
enum counter {
	C_PASS_NOT_IP = 0,      // ARP, LLDP, anything not IPv4/IPv6
	C_PASS_MALFORMED = 1,   // short or malformed headers
	C_PASS_NOT_OURS = 2,    // IP, but no map matched
	C_PASS_ICMP = 3,        // ICMP that is not an error about xvs traffic (echo, ND, RA...)
	C_MATCH_FRONTEND = 4,   // to a VIP:port/proto
	C_MATCH_SNAT = 5,       // to a SNAT address and port range
	C_MATCH_BACKEND = 6,    // from a backend (nat-mode reply)
	C_MATCH_FRAGMENT = 7,   // a later fragment to a VIP or SNAT address
	C_MATCH_ICMP_ERROR = 8, // an ICMP error about xvs traffic
	C_MATCH_IPV6_EXT = 9,   // IPv6 with extension headers to a VIP or SNAT address
	C_REDIRECTED = 10,      // matched and handed to an AF_XDP socket
	C_NO_SOCKET = 11,       // matched, but no socket on this queue and no hold: passed
	C_HELD = 12,            // matched, no socket on this queue, a restart hold runs: dropped
	C_MATCH_CLUSTER_IP = 13,   // to a ClusterIP on a port no frontend serves (xvs rejects)
	C_MATCH_SERVICE_CIDR = 14, // to an address inside a Service CIDR (xvs drops or rejects)
	C_MAX = 15,
};

// linux/icmp.h pulls in libc's sys/socket.h (through linux/if.h), which does not build for the
// bpf target; the ICMPv4 header is small enough to spell out.
struct icmp4hdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u32 rest;
};
#define ICMP4_DEST_UNREACH 3
#define ICMP4_TIME_EXCEEDED 11
#define ICMP4_PARAMETERPROB 12

struct addr_key {
	__u32 ip[4];
};

struct port_key {
	__u32 ip[4];
	__u16 port; // network order
	__u8 proto;
	__u8 pad;
};

// An LPM trie key: the prefix length in bits, then the address (IPv4 v4-mapped: 96 + its
// prefix length).
struct lpm_key {
	__u32 prefixlen;
	__u32 ip[4];
};

struct port_range {
	__u16 lo; // host order, inclusive
	__u16 hi; // host order, inclusive
};

struct hold {
	__u64 deadline_ns; // CLOCK_MONOTONIC; 0: no hold
	__u32 owner_pid;   // who set it (for the operator and the daemon's watchdog)
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, XSKS_MAX);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FRONTENDS_MAX);
	__type(key, struct port_key);
	__type(value, __u32);
} frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BACKENDS_MAX);
	__type(key, struct port_key);
	__type(value, __u32);
} backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VIPS_MAX);
	__type(key, struct addr_key);
	__type(value, __u32);
} vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CIDRS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key);
	__type(value, __u32);
} cidrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SNAT_MAX);
	__type(key, struct addr_key);
	__type(value, struct port_range);
} snat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HOLD_MAX);
	__type(key, __u32);
	__type(value, struct hold);
} hold SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &idx);
	if (c)
		*c += 1;
}

static __always_inline int pass(__u32 reason)
{
	count(reason);
	return XDP_PASS;
}

// Whether a restart hold runs: its deadline is still ahead. A deadline of 0 never is.
static __always_inline int held(void)
{
	__u32 zero = 0;
	struct hold *h = bpf_map_lookup_elem(&hold, &zero);
	return h && bpf_ktime_get_ns() < h->deadline_ns;
}

// A frame xvs owns: to the queue's socket; with none, dropped while a hold runs (the kernel
// would answer it with an RST or port unreachable), passed otherwise.
static __always_inline int redirect(struct xdp_md *ctx, __u32 reason)
{
	count(reason);
	if (bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS) == XDP_REDIRECT) {
		count(C_REDIRECTED);
		return XDP_REDIRECT;
	}
	if (held()) {
		count(C_HELD);
		return XDP_DROP;
	}
	count(C_NO_SOCKET);
	return XDP_PASS;
}

static __always_inline void v4_mapped(struct addr_key *k, __u32 addr)
{
	k->ip[0] = 0;
	k->ip[1] = 0;
	k->ip[2] = host_to_be32(0x0000ffff);
	k->ip[3] = addr;
}

static __always_inline void v6_copy(struct addr_key *k, const struct in6_addr *a)
{
	k->ip[0] = a->in6_u.u6_addr32[0];
	k->ip[1] = a->in6_u.u6_addr32[1];
	k->ip[2] = a->in6_u.u6_addr32[2];
	k->ip[3] = a->in6_u.u6_addr32[3];
}

static __always_inline int is_vip_or_snat(struct addr_key *k)
{
	return bpf_map_lookup_elem(&vips, k) || bpf_map_lookup_elem(&snat, k);
}

// The port-based matches shared by TCP, UDP and SCTP (ports are at the same offsets): a
// frontend, the SNAT ports, a nat-mode backend, then any port of a ClusterIP and any address
// of a Service CIDR (xvs answers those itself; the node's own addresses are in neither: the
// loader refuses such CIDRs). Returns the counter of the match, or -1.
static __always_inline int match_ports(struct addr_key *src, struct addr_key *dst, __u16 sport,
				       __u16 dport, __u8 proto)
{
	struct port_key pk = {};
	pk.port = dport;
	pk.proto = proto;
	pk.ip[0] = dst->ip[0];
	pk.ip[1] = dst->ip[1];
	pk.ip[2] = dst->ip[2];
	pk.ip[3] = dst->ip[3];
	if (bpf_map_lookup_elem(&frontends, &pk))
		return C_MATCH_FRONTEND;

	struct port_range *range = bpf_map_lookup_elem(&snat, dst);
	if (range) {
		__u16 p = be16_to_host(dport);
		if (p >= range->lo && p <= range->hi)
			return C_MATCH_SNAT;
	}

	pk.port = sport;
	pk.ip[0] = src->ip[0];
	pk.ip[1] = src->ip[1];
	pk.ip[2] = src->ip[2];
	pk.ip[3] = src->ip[3];
	if (bpf_map_lookup_elem(&backends, &pk))
		return C_MATCH_BACKEND;

	__u32 *vip = bpf_map_lookup_elem(&vips, dst);
	if (vip && (*vip & VIP_REJECT_UNSERVED))
		return C_MATCH_CLUSTER_IP;
	struct lpm_key lk = {};
	lk.prefixlen = 128;
	lk.ip[0] = dst->ip[0];
	lk.ip[1] = dst->ip[1];
	lk.ip[2] = dst->ip[2];
	lk.ip[3] = dst->ip[3];
	if (bpf_map_lookup_elem(&cidrs, &lk))
		return C_MATCH_SERVICE_CIDR;
	return -1;
}

static __always_inline int is_port_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP_;
}

static __always_inline int steer_ipv4(struct xdp_md *ctx, void *l3, void *data_end)
{
	struct iphdr *ip = l3;
	if ((void *)(ip + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	__u32 ihl = ip->ihl;
	if (ihl < 5)
		return pass(C_PASS_MALFORMED);

	struct addr_key src, dst;
	v4_mapped(&src, ip->saddr);
	v4_mapped(&dst, ip->daddr);

	if (be16_to_host(ip->frag_off) & IPV4_FRAG_OFFSET_MASK) {
		// A later fragment carries no ports: the userspace fragment table follows it.
		if (is_vip_or_snat(&dst))
			return redirect(ctx, C_MATCH_FRAGMENT);
		return pass(C_PASS_NOT_OURS);
	}

	__u8 *l4 = (__u8 *)l3 + ihl * 4;
	if (is_port_proto(ip->protocol)) {
		if ((void *)(l4 + 4) > data_end)
			return pass(C_PASS_MALFORMED);
		__u16 sport = *(__u16 *)l4;
		__u16 dport = *(__u16 *)(l4 + 2);
		int m = match_ports(&src, &dst, sport, dport, ip->protocol);
		if (m >= 0)
			return redirect(ctx, m);
		return pass(C_PASS_NOT_OURS);
	}

	if (ip->protocol == IPPROTO_ICMP) {
		struct icmp4hdr *icmp = (struct icmp4hdr *)l4;
		if ((void *)(icmp + 1) > data_end)
			return pass(C_PASS_MALFORMED);
		__u8 t = icmp->type;
		if (t != ICMP4_DEST_UNREACH && t != ICMP4_TIME_EXCEEDED && t != ICMP4_PARAMETERPROB)
			return pass(C_PASS_ICMP);
		if (bpf_map_lookup_elem(&snat, &dst))
			return redirect(ctx, C_MATCH_ICMP_ERROR);
		struct iphdr *inner = (struct iphdr *)(icmp + 1);
		if ((void *)(inner + 1) > data_end)
			return pass(C_PASS_ICMP);
		struct addr_key isrc;
		v4_mapped(&isrc, inner->saddr);
		if (is_vip_or_snat(&isrc))
			return redirect(ctx, C_MATCH_ICMP_ERROR);
		return pass(C_PASS_ICMP);
	}
	return pass(C_PASS_NOT_OURS);
}

static __always_inline int is_ipv6_ext(__u8 nh)
{
	// Hop-by-hop, routing, destination options, AH, mobility, HIP, shim6.
	return nh == 0 || nh == 43 || nh == 60 || nh == 51 || nh == 135 || nh == 139 || nh == 140;
}

struct frag6 {
	__u8 nexthdr;
	__u8 reserved;
	__u16 frag_off; // network order: offset << 3 | flags
	__u32 id;
};

static __always_inline int steer_ipv6(struct xdp_md *ctx, void *l3, void *data_end)
{
	struct ipv6hdr *ip6 = l3;
	if ((void *)(ip6 + 1) > data_end)
		return pass(C_PASS_MALFORMED);

	struct addr_key src, dst;
	v6_copy(&src, &ip6->saddr);
	v6_copy(&dst, &ip6->daddr);

	__u8 nh = ip6->nexthdr;
	__u8 *l4 = (__u8 *)(ip6 + 1);

	if (nh == 44) {
		struct frag6 *fh = (struct frag6 *)l4;
		if ((void *)(fh + 1) > data_end)
			return pass(C_PASS_MALFORMED);
		if (be16_to_host(fh->frag_off) & IPV6_FRAG_OFFSET_MASK) {
			if (is_vip_or_snat(&dst))
				return redirect(ctx, C_MATCH_FRAGMENT);
			return pass(C_PASS_NOT_OURS);
		}
		nh = fh->nexthdr;
		l4 = (__u8 *)(fh + 1);
	}

	if (is_port_proto(nh)) {
		if ((void *)(l4 + 4) > data_end)
			return pass(C_PASS_MALFORMED);
		__u16 sport = *(__u16 *)l4;
		__u16 dport = *(__u16 *)(l4 + 2);
		int m = match_ports(&src, &dst, sport, dport, nh);
		if (m >= 0)
			return redirect(ctx, m);
		return pass(C_PASS_NOT_OURS);
	}

	if (nh == IPPROTO_ICMPV6) {
		struct icmp6hdr *icmp = (struct icmp6hdr *)l4;
		if ((void *)(icmp + 1) > data_end)
			return pass(C_PASS_MALFORMED);
		__u8 t = icmp->icmp6_type;
		if (t < ICMPV6_DEST_UNREACH || t > ICMPV6_PARAMPROB)
			return pass(C_PASS_ICMP);
		if (bpf_map_lookup_elem(&snat, &dst))
			return redirect(ctx, C_MATCH_ICMP_ERROR);
		struct ipv6hdr *inner = (struct ipv6hdr *)(icmp + 1);
		if ((void *)(inner + 1) > data_end)
			return pass(C_PASS_ICMP);
		struct addr_key isrc;
		v6_copy(&isrc, &inner->saddr);
		if (is_vip_or_snat(&isrc))
			return redirect(ctx, C_MATCH_ICMP_ERROR);
		return pass(C_PASS_ICMP);
	}

	// Extension headers are not walked here: userspace parses them.
	if (is_ipv6_ext(nh) && is_vip_or_snat(&dst))
		return redirect(ctx, C_MATCH_IPV6_EXT);
	return pass(C_PASS_NOT_OURS);
}

SEC("xdp")
int xvs_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	__u16 proto = eth->h_proto;
	void *l3 = eth + 1;

	// One 802.1Q / 802.1ad tag: 2 bytes TCI, 2 bytes inner EtherType.
	if (proto == host_to_be16(ETH_P_8021Q_) || proto == host_to_be16(ETH_P_8021AD_)) {
		if (l3 + 4 > data_end)
			return pass(C_PASS_MALFORMED);
		proto = *(__u16 *)(l3 + 2);
		l3 += 4;
	}

	if (proto == host_to_be16(ETH_P_IP))
		return steer_ipv4(ctx, l3, data_end);
	if (proto == host_to_be16(ETH_P_IPV6))
		return steer_ipv6(ctx, l3, data_end);
	return pass(C_PASS_NOT_IP);
}

char _license[] SEC("license") = "Apache-2.0";
