// SPDX-License-Identifier: Apache-2.0
//
// perf-lab saturation reflector (XDP, attached to the switch's uplink `up0`, the peer of the
// load balancer's backend-side veth: every frame the LB forwards to any backend arrives here).
//
// Every IPv4 UDP/TCP frame that carries a perf-lab payload is turned back into a new client
// packet towards the VIP and sent out the way it came (XDP_TX): MACs swapped (so it goes back
// to the load balancer's backend-side interface), source = the original client address and
// port, destination = VIP and the service port (both read from the payload the generator
// wrote, since full-NAT has replaced them), TTL reset to 64 so the kernel baselines' TTL
// decrement never expires a circulating packet, checksums fixed incrementally (RFC 1624).
// A burst injected once therefore circulates: client -> LB -> backend -> LB -> ...
//
// Payload (right after the L4 header, big-endian), written by perf-lab's generator:
//   0  seq u32 | 4 send time ns u64 | 12 client ip | 16 client port | 18 service port
//
// Maps: `cfg` (array, [0] = VIP in network byte order, [1] = drain: non-zero stops the loop),
// `counters` (per-CPU u64: 0 reflected, 1 passed: not IPv4 UDP/TCP or too short, 2 drained:
// perf-lab packets dropped while draining, i.e. what was still circulating), `per_backend` (per-CPU u64 indexed
// by the last byte of the destination MAC the LB chose: backend I is 02:00:00:00:01:I).
//
// `xdp_pass` is a second program: attached to a veth peer it only enables the NAPI that
// XDP_TX into that peer needs.

#include "xvs_bpf.h"
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>


#define PAYLOAD_LEN 20
#define C_REFLECTED 0
#define C_PASSED 1
#define C_DRAINED 2

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
} cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 3);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 256);
} per_backend SEC(".maps");

static __always_inline void count_in(void *map, __u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(map, &idx);
	if (c)
		*c += 1;
}

static __always_inline void count(__u32 idx)
{
	count_in(&counters, idx);
}

// RFC 1624: HC' = ~(~HC + ~m + m'), on 16-bit words in network order.
static __always_inline __u16 csum_replace2(__u16 sum, __u16 old, __u16 new)
{
	__u32 c = (__u16)~sum;
	c += (__u16)~old;
	c += new;
	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return ~c;
}

static __always_inline __u16 csum_replace4(__u16 sum, __u32 old, __u32 new)
{
	sum = csum_replace2(sum, old & 0xffff, new & 0xffff);
	return csum_replace2(sum, old >> 16, new >> 16);
}

SEC("xdp")
int reflect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != host_to_be16(ETH_P_IP))
		goto pass;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl != 5)
		goto pass;
	__u32 l4len;
	if (ip->protocol == IPPROTO_UDP)
		l4len = 8;
	else if (ip->protocol == IPPROTO_TCP)
		l4len = 20;
	else
		goto pass;
	__u8 *l4 = (void *)(ip + 1);
	if ((void *)(l4 + 20) > data_end)
		goto pass;
	if (ip->protocol == IPPROTO_TCP && (l4[12] >> 4) != 5)
		goto pass;
	__u8 *pl = l4 + l4len;
	if ((void *)(pl + PAYLOAD_LEN) > data_end)
		goto pass;
	__u32 key = 0;
	__u32 *vip = bpf_map_lookup_elem(&cfg, &key);
	if (!vip)
		goto pass;
	key = 1;
	__u32 *drain = bpf_map_lookup_elem(&cfg, &key);
	if (drain && *drain) {
		count(C_DRAINED);
		return XDP_DROP;
	}

	__u32 client, new_dst = *vip;
	__u16 cport, sport;
	__builtin_memcpy(&client, pl + 12, 4);
	__builtin_memcpy(&cport, pl + 16, 2);
	__builtin_memcpy(&sport, pl + 18, 2);

	// Backend I's MAC is 02:00:00:00:01:I (L2-only forwarders keep the VIP as destination).
	__u32 backend = eth->h_dest[5];

	// MACs: back where the frame came from.
	__u8 tmp[ETH_ALEN];
	__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);

	// L4 checksum first (its pseudo-header uses the old addresses).
	__u16 *ports = (__u16 *)l4;
	__u16 *l4sum = (__u16 *)(l4 + (ip->protocol == IPPROTO_UDP ? 6 : 16));
	if ((void *)(l4sum + 1) > data_end)
		goto pass;
	__u16 s = *l4sum;
	int udp_nocsum = ip->protocol == IPPROTO_UDP && s == 0;
	if (!udp_nocsum) {
		s = csum_replace4(s, ip->saddr, client);
		s = csum_replace4(s, ip->daddr, new_dst);
		s = csum_replace2(s, ports[0], cport);
		s = csum_replace2(s, ports[1], sport);
		if (ip->protocol == IPPROTO_UDP && s == 0)
			s = 0xffff;
		*l4sum = s;
	}
	ports[0] = cport;
	ports[1] = sport;

	// IPv4: addresses and TTL (TTL shares a 16-bit word with the protocol).
	__u16 h = ip->check;
	h = csum_replace4(h, ip->saddr, client);
	h = csum_replace4(h, ip->daddr, new_dst);
	__u16 old_ttl_proto = *(__u16 *)&ip->ttl;
	ip->ttl = 64;
	h = csum_replace2(h, old_ttl_proto, *(__u16 *)&ip->ttl);
	ip->check = h;
	ip->saddr = client;
	ip->daddr = new_dst;

	count(C_REFLECTED);
	count_in(&per_backend, backend);
	return XDP_TX;
pass:
	count(C_PASSED);
	return XDP_PASS;
}

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
