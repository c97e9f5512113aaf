// SPDX-License-Identifier: Apache-2.0
//
// xvs decap: the backend side of direct server return (`xvs decap`, loaded by
// `fastpath/src/decap/`). Two programs share the maps below:
//
// xvs_decap (XDP, on the interfaces encapsulated packets arrive on):
//   - IPIP: outer IPv4 or IPv6 whose protocol / next header is 4 (an IPv4 packet inside) or 41
//     (an IPv6 packet inside);
//   - GUE variant 1 (Katran's layout): outer IPv4 or IPv6, UDP to `settings.gue_port`, the
//     inner IP packet straight after the UDP header (its version nibble says which);
//   whose INNER destination is in `vips` are decapsulated: the outer IP (and UDP) header is
//   removed, the Ethernet header (and one VLAN tag) kept with the inner EtherType, and an
//   outer ECN CE mark copied onto an ECN-capable inner packet (RFC 6040, as the kernel's
//   tunnels do). Everything else passes untouched: other protocols, other VIPs (a kernel
//   ipip/fou device may want them), outer fragments (the kernel reassembles), IPv6 outer
//   extension headers, and anything truncated or malformed (counted; the kernel drops it).
//   Then, on the decapsulated packet and on plain (L2 DSR) packets alike: a TCP or UDP
//   packet to a `ports` entry {VIP, port, protocol} gets its destination port rewritten to
//   the entry's target port, with the L4 checksum updated incrementally (RFC 1624; a zero
//   IPv4 UDP checksum stays zero). Later fragments carry no ports and are left alone. The
//   program never drops, except a packet it began to rewrite when the kernel refused to
//   move its head (counted `error`).
//
// xvs_decap_egress (tc, egress of the same interfaces, only when a translation exists):
//   a TCP or UDP packet FROM an `rports` entry {VIP, target port, protocol} gets its source
//   port rewritten back to the service port, the checksum through bpf_l4_csum_replace (which
//   leaves a CHECKSUM_PARTIAL packet's pseudo-header sum alone). Always TC_ACT_OK.
//
//   vips      {ip} -> 1                    inner destinations to decapsulate
//   ports     {ip, port, proto} -> port    ingress: service port -> target port
//   rports    {ip, port, proto} -> port    egress: target port -> service port
//   settings  [0] {gue_port}
//   counters  per-CPU u64 array, indexed by enum counter (mirrored in decap/counters.rs)
//
// Addresses are 16 bytes, IPv4 v4-mapped; every port is in network byte order. Every packet
// read is bounds-checked against data_end.

#include "xvs_bpf.h"
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>

static long (*bpf_xdp_adjust_head)(struct xdp_md *ctx, int delta) = (void *)BPF_FUNC_xdp_adjust_head;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to,
				   __u64 flags) = (void *)BPF_FUNC_l4_csum_replace;
static long (*bpf_skb_store_bytes)(struct __sk_buff *skb, __u32 offset, const void *from,
				   __u32 len, __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;
static long (*bpf_skb_pull_data)(struct __sk_buff *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define IPPROTO_IPIP_ 4
#define IPPROTO_IPV6_ 41
#define IPPROTO_FRAGMENT_ 44
#define IPV4_MF 0x2000
#define IPV4_FRAG_OFFSET_MASK 0x1fff
#define IPV6_FRAG_OFFSET_MASK 0xfff8
#define ECN_MASK 3
#define ECN_CE 3
#define UDP_HLEN 8
#define TCP_CHECK_OFF 16
#define UDP_CHECK_OFF 6
#define TCP_HLEN_MIN 20

// Capacities; the loader checks against the same numbers (decap/maps.rs).
#define VIPS_MAX 4096
#define PORTS_MAX 16384

// Counter indices. Keep in step with `Counter` in decap/counters.rs.
enum counter {
	C_PASS_NOT_IP = 0,          // ARP, LLDP, anything not IPv4/IPv6
	C_PASS_MALFORMED = 1,       // short or malformed outer headers
	C_PASS_PLAIN = 2,           // not encapsulated (its port may have been translated)
	C_PASS_OUTER_FRAGMENT = 3,  // an encapsulated packet's outer fragment: for the kernel
	C_PASS_NOT_VIP = 4,         // encapsulated, the inner destination is no configured VIP
	C_PASS_INNER_MALFORMED = 5, // encapsulated, the inner header short or of the wrong version
	C_DECAP_IPIP = 6,           // decapsulated IPIP (4in4, 6in6, 4in6, 6in4)
	C_DECAP_GUE = 7,            // decapsulated GUE
	C_IN_TRANSLATED = 8,        // destination port rewritten (decapsulated or plain)
	C_ERROR = 9,                // the kernel refused to move the head: dropped
	C_OUT_TRANSLATED = 10,      // egress: source port rewritten back
	C_OUT_ERROR = 11,           // egress: a helper failed, sent unchanged
	C_MAX = 12,
};

struct addr_key {
	__u32 ip[4];
};

struct port_key {
	__u32 ip[4];
	__u16 port; // network order
	__u8 proto;
	__u8 pad;
};

struct port_value {
	__u16 port; // network order
	__u16 pad;
};

struct settings {
	__u16 gue_port; // network order
	__u16 pad;
	__u32 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VIPS_MAX);
	__type(key, struct addr_key);
	__type(value, __u32);
} vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTS_MAX);
	__type(key, struct port_key);
	__type(value, struct port_value);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTS_MAX);
	__type(key, struct port_key);
	__type(value, struct port_value);
} rports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings);
} settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

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

static __always_inline void v4_mapped(__u32 *k, __u32 addr)
{
	k[0] = 0;
	k[1] = 0;
	k[2] = host_to_be32(0x0000ffff);
	k[3] = addr;
}

static __always_inline void v6_copy(__u32 *k, const struct in6_addr *a)
{
	k[0] = a->in6_u.u6_addr32[0];
	k[1] = a->in6_u.u6_addr32[1];
	k[2] = a->in6_u.u6_addr32[2];
	k[3] = a->in6_u.u6_addr32[3];
}

// RFC 1624, eqn. 3: the checksum after one 16-bit word changed from `old` to `new`. One's
// complement sums do not depend on byte order, so all three stay as they are in the packet.
static __always_inline __u16 csum_replace2(__u16 check, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~check;
	sum += (__u16)~old;
	sum += new;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

// Where the L4 header of the IP packet at `l3` starts and its protocol; 0 when it has none
// to translate (not TCP/UDP, a later fragment, an IPv6 extension header other than one
// fragment header, or truncated). The caller checked that `l3` holds the IP header.
static __always_inline __u32 l4_of(void *l3, void *data_end, int v6, __u8 *proto,
				   struct port_key *key, int dst)
{
	if (!v6) {
		struct iphdr *ip = l3;
		if (host_to_be16(ip->frag_off) & IPV4_FRAG_OFFSET_MASK)
			return 0;
		*proto = ip->protocol;
		v4_mapped(key->ip, dst ? ip->daddr : ip->saddr);
		return ip->ihl * 4;
	}
	struct ipv6hdr *ip6 = l3;
	__u32 off = sizeof(*ip6);
	__u8 nh = ip6->nexthdr;
	if (nh == IPPROTO_FRAGMENT_) {
		__u8 *fh = (__u8 *)(ip6 + 1);
		if ((void *)(fh + 8) > data_end)
			return 0;
		if (host_to_be16(*(__u16 *)(fh + 2)) & IPV6_FRAG_OFFSET_MASK)
			return 0;
		nh = fh[0];
		off += 8;
	}
	*proto = nh;
	v6_copy(key->ip, dst ? &ip6->daddr : &ip6->saddr);
	return off;
}

// Ingress: rewrites the destination port of the TCP/UDP packet at `l3` when `ports` maps
// its {destination, port, protocol}. Returns whether it did.
static __always_inline int translate_in(void *l3, void *data_end, int v6)
{
	struct port_key key = {};
	__u8 proto = 0;
	__u32 off = l4_of(l3, data_end, v6, &proto, &key, 1);
	if (!off || (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		return 0;
	__u8 *l4 = (__u8 *)l3 + off;
	// One bound per protocol: the verifier keeps a constant range per branch.
	__u16 *check;
	if (proto == IPPROTO_TCP) {
		if ((void *)(l4 + TCP_HLEN_MIN) > data_end)
			return 0;
		check = (__u16 *)(l4 + TCP_CHECK_OFF);
	} else {
		if ((void *)(l4 + UDP_HLEN) > data_end)
			return 0;
		check = (__u16 *)(l4 + UDP_CHECK_OFF);
	}
	key.port = *(__u16 *)(l4 + 2);
	key.proto = proto;
	struct port_value *to = bpf_map_lookup_elem(&ports, &key);
	if (!to)
		return 0;
	__u16 old = key.port;
	__u16 new = to->port;
	// An IPv4 UDP datagram without a checksum keeps none; a computed 0 is sent as 0xffff.
	if (proto == IPPROTO_TCP) {
		*check = csum_replace2(*check, old, new);
	} else if (*check != 0) {
		__u16 c = csum_replace2(*check, old, new);
		*check = c ? c : 0xffff;
	}
	*(__u16 *)(l4 + 2) = new;
	count(C_IN_TRANSLATED);
	return 1;
}

// Sets CE on an ECN-capable inner packet at `l3` (RFC 6040's normal mode).
static __always_inline void ecn_decapsulate(void *l3, void *data_end, int v6)
{
	if (!v6) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > data_end)
			return;
		__u8 tos = ip->tos;
		if ((tos & ECN_MASK) == 0 || (tos & ECN_MASK) == ECN_CE)
			return;
		// tos is the low byte of the first 16-bit word in memory.
		__u16 *word = (__u16 *)ip;
		__u16 old = *word;
		ip->tos = tos | ECN_CE;
		ip->check = csum_replace2(ip->check, old, *word);
		return;
	}
	__u8 *b = l3;
	if ((void *)(b + 2) > data_end)
		return;
	__u8 ecn = (b[1] >> 4) & ECN_MASK;
	if (ecn != 0 && ecn != ECN_CE)
		b[1] |= ECN_CE << 4;
}

// What the outer headers say.
struct outer {
	__u32 len;     // outer IP (+ UDP) header bytes to remove
	__u8 version;  // the inner IP version IPIP promises (4 or 6), 0 for GUE (the nibble says)
	__u8 counter;  // C_DECAP_IPIP or C_DECAP_GUE
	__u8 ce;       // the outer ECN field is CE
};

// Decapsulates the packet whose outer headers `o` describes, L2 header `l2` bytes, and
// translates the inner packet's port. Passes it untouched when the inner packet is not for
// a configured VIP.
static __always_inline int decap(struct xdp_md *ctx, __u32 l2, struct outer *o)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	if (l2 != ETH_HLEN && l2 != ETH_HLEN + 4)
		return pass(C_PASS_MALFORMED);
	if (o->len > 60 + 40 + UDP_HLEN)
		return pass(C_PASS_MALFORMED);
	__u8 *inner = (__u8 *)data + l2 + o->len;
	if ((void *)(inner + 1) > data_end)
		return pass(C_PASS_INNER_MALFORMED);
	__u8 version = inner[0] >> 4;
	if (o->version && version != o->version)
		return pass(C_PASS_INNER_MALFORMED);
	struct addr_key dst;
	__u16 ethertype;
	if (version == 4) {
		struct iphdr *ip = (struct iphdr *)inner;
		if ((void *)(ip + 1) > data_end || ip->ihl < 5)
			return pass(C_PASS_INNER_MALFORMED);
		v4_mapped(dst.ip, ip->daddr);
		ethertype = host_to_be16(ETH_P_IP);
	} else if (version == 6) {
		struct ipv6hdr *ip6 = (struct ipv6hdr *)inner;
		if ((void *)(ip6 + 1) > data_end)
			return pass(C_PASS_INNER_MALFORMED);
		v6_copy(dst.ip, &ip6->daddr);
		ethertype = host_to_be16(ETH_P_IPV6);
	} else {
		return pass(C_PASS_INNER_MALFORMED);
	}
	if (!bpf_map_lookup_elem(&vips, &dst))
		return pass(C_PASS_NOT_VIP);

	// Keep the L2 header (and its VLAN tag) to write it back in front of the inner packet.
	// The frame holds more than 18 bytes: the inner header was found after the outer one.
	__u16 hdr[(ETH_HLEN + 4) / 2];
	if ((void *)((__u8 *)data + ETH_HLEN + 4) > data_end)
		return pass(C_PASS_MALFORMED);
	__builtin_memcpy(hdr, data, ETH_HLEN + 4);
	if (l2 == ETH_HLEN)
		hdr[ETH_HLEN / 2 - 1] = ethertype;
	else
		hdr[ETH_HLEN / 2 + 1] = ethertype;

	if (bpf_xdp_adjust_head(ctx, (int)o->len)) {
		count(C_ERROR);
		return XDP_DROP;
	}
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	// The inner IP header (20 bytes or more) follows the L2 header: cannot fail, but the
	// verifier needs the bound.
	if ((void *)((__u8 *)data + ETH_HLEN + 4) > data_end) {
		count(C_ERROR);
		return XDP_DROP;
	}
	if (l2 == ETH_HLEN)
		__builtin_memcpy(data, hdr, ETH_HLEN);
	else
		__builtin_memcpy(data, hdr, ETH_HLEN + 4);
	count(o->counter);

	void *l3 = (__u8 *)data + l2;
	int v6 = version == 6;
	if (o->ce)
		ecn_decapsulate(l3, data_end, v6);
	if (!v6 && l3 + sizeof(struct iphdr) > data_end)
		return XDP_PASS;
	if (v6 && l3 + sizeof(struct ipv6hdr) > data_end)
		return XDP_PASS;
	translate_in(l3, data_end, v6);
	return XDP_PASS;
}

static __always_inline __u16 gue_port(void)
{
	__u32 zero = 0;
	struct settings *s = bpf_map_lookup_elem(&settings, &zero);
	return s ? s->gue_port : 0;
}

// A packet that is not encapsulated: only its port may need translating.
static __always_inline int plain(void *l3, void *data_end, int v6)
{
	translate_in(l3, data_end, v6);
	return pass(C_PASS_PLAIN);
}

static __always_inline int ingress_v4(struct xdp_md *ctx, __u32 l2)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = (struct iphdr *)((__u8 *)data + l2);
	if ((void *)(ip + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	__u32 ihl = ip->ihl;
	if (ihl < 5)
		return pass(C_PASS_MALFORMED);
	struct outer o = {.len = ihl * 4, .ce = (ip->tos & ECN_MASK) == ECN_CE};
	if (ip->protocol == IPPROTO_IPIP_ || ip->protocol == IPPROTO_IPV6_) {
		o.version = ip->protocol == IPPROTO_IPIP_ ? 4 : 6;
		o.counter = C_DECAP_IPIP;
	} else if (ip->protocol == IPPROTO_UDP) {
		__u8 *udp = (__u8 *)ip + o.len;
		if ((void *)(udp + UDP_HLEN) > data_end)
			return pass(C_PASS_MALFORMED);
		__u16 port = gue_port();
		if (port == 0 || *(__u16 *)(udp + 2) != port ||
		    (host_to_be16(ip->frag_off) & IPV4_FRAG_OFFSET_MASK))
			return plain(ip, data_end, 0);
		o.len += UDP_HLEN;
		o.counter = C_DECAP_GUE;
	} else {
		return plain(ip, data_end, 0);
	}
	if (host_to_be16(ip->frag_off) & (IPV4_MF | IPV4_FRAG_OFFSET_MASK))
		return pass(C_PASS_OUTER_FRAGMENT);
	return decap(ctx, l2, &o);
}

static __always_inline int ingress_v6(struct xdp_md *ctx, __u32 l2)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = (struct ipv6hdr *)((__u8 *)data + l2);
	if ((void *)(ip6 + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	__u8 *b = (__u8 *)ip6;
	struct outer o = {.len = sizeof(*ip6), .ce = ((b[1] >> 4) & ECN_MASK) == ECN_CE};
	__u8 nh = ip6->nexthdr;
	if (nh == IPPROTO_IPIP_ || nh == IPPROTO_IPV6_) {
		o.version = nh == IPPROTO_IPIP_ ? 4 : 6;
		o.counter = C_DECAP_IPIP;
	} else if (nh == IPPROTO_UDP) {
		__u8 *udp = (__u8 *)(ip6 + 1);
		if ((void *)(udp + UDP_HLEN) > data_end)
			return pass(C_PASS_MALFORMED);
		__u16 port = gue_port();
		if (port == 0 || *(__u16 *)(udp + 2) != port)
			return plain(ip6, data_end, 1);
		o.len += UDP_HLEN;
		o.counter = C_DECAP_GUE;
	} else if (nh == IPPROTO_FRAGMENT_) {
		// An outer fragment of a tunnel packet is the kernel's to reassemble; a fragment of
		// a plain packet may still need its port translated.
		__u8 *fh = (__u8 *)(ip6 + 1);
		if ((void *)(fh + 8) > data_end)
			return pass(C_PASS_MALFORMED);
		if (fh[0] == IPPROTO_IPIP_ || fh[0] == IPPROTO_IPV6_)
			return pass(C_PASS_OUTER_FRAGMENT);
		return plain(ip6, data_end, 1);
	} else {
		return plain(ip6, data_end, 1);
	}
	return decap(ctx, l2, &o);
}

SEC("xdp")
int xvs_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	__u16 proto = eth->h_proto;
	__u32 l2 = ETH_HLEN;
	if (proto == host_to_be16(ETH_P_8021Q_) || proto == host_to_be16(ETH_P_8021AD_)) {
		if ((void *)((__u8 *)data + ETH_HLEN + 4) > data_end)
			return pass(C_PASS_MALFORMED);
		proto = *(__u16 *)((__u8 *)data + ETH_HLEN + 2);
		l2 += 4;
	}
	if (proto == host_to_be16(ETH_P_IP))
		return ingress_v4(ctx, l2);
	if (proto == host_to_be16(ETH_P_IPV6))
		return ingress_v6(ctx, l2);
	return pass(C_PASS_NOT_IP);
}

// Egress: the L3 offset and family of `skb`'s packet; -1 when it is not IP.
static __always_inline int egress_l3(void *data, void *data_end, __u32 *l2)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return -1;
	__u16 proto = eth->h_proto;
	*l2 = ETH_HLEN;
	if (proto == host_to_be16(ETH_P_8021Q_) || proto == host_to_be16(ETH_P_8021AD_)) {
		if ((void *)((__u8 *)data + ETH_HLEN + 4) > data_end)
			return -1;
		proto = *(__u16 *)((__u8 *)data + ETH_HLEN + 2);
		*l2 += 4;
	}
	if (proto == host_to_be16(ETH_P_IP))
		return 0;
	if (proto == host_to_be16(ETH_P_IPV6))
		return 1;
	return -1;
}

// The headers an egress rewrite reads: L2 with a tag, IPv6 with a fragment header, TCP.
#define EGRESS_HEADERS_MAX (ETH_HLEN + 4 + 40 + 8 + TCP_HLEN_MIN)

SEC("classifier")
int xvs_decap_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	// The headers are normally linear; pull them in when a driver left them in fragments
	// (only then: pulling makes a cloned skb's head private, a copy).
	__u32 want = skb->len < EGRESS_HEADERS_MAX ? skb->len : EGRESS_HEADERS_MAX;
	if (data + want > data_end) {
		bpf_skb_pull_data(skb, want);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	__u32 l2 = 0;
	int v6 = egress_l3(data, data_end, &l2);
	if (v6 < 0 || l2 > ETH_HLEN + 4)
		return TC_ACT_OK;
	void *l3 = (__u8 *)data + l2;
	if (l3 + (v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr)) > data_end)
		return TC_ACT_OK;
	if (!v6 && ((struct iphdr *)l3)->ihl < 5)
		return TC_ACT_OK;

	struct port_key key = {};
	__u8 proto = 0;
	__u32 off = l4_of(l3, data_end, v6, &proto, &key, 0);
	if (!off || off > 60 || (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		return TC_ACT_OK;
	__u8 *l4 = (__u8 *)l3 + off;
	if (proto == IPPROTO_TCP && (void *)(l4 + TCP_HLEN_MIN) > data_end)
		return TC_ACT_OK;
	if ((void *)(l4 + UDP_HLEN) > data_end)
		return TC_ACT_OK;
	key.port = *(__u16 *)l4;
	key.proto = proto;
	struct port_value *to = bpf_map_lookup_elem(&rports, &key);
	if (!to)
		return TC_ACT_OK;
	__u16 old = key.port;
	__u16 new = to->port;
	__u32 l4_off = l2 + off;
	__u32 check_off = l4_off + (proto == IPPROTO_TCP ? TCP_CHECK_OFF : UDP_CHECK_OFF);
	__u64 flags = sizeof(__u16) | (proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0);
	if (bpf_l4_csum_replace(skb, check_off, old, new, flags) < 0 ||
	    bpf_skb_store_bytes(skb, l4_off, &new, sizeof(new), 0) < 0) {
		count(C_OUT_ERROR);
		return TC_ACT_OK;
	}
	count(C_OUT_TRANSLATED);
	return TC_ACT_OK;
}

char _license[] SEC("license") = "Apache-2.0";
