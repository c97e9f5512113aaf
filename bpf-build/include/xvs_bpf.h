// The prelude of xvs's BPF programs (fastpath's steering and decap programs, perf-lab's
// reflector), on the include path of every program `bpf_build::compile` builds: what
// libbpf's bpf_helpers.h would give (section and map-definition macros), the one helper all
// of them call, and byte order. Only UAPI headers, so the build needs no libbpf-dev.

#ifndef XVS_BPF_H
#define XVS_BPF_H

#include <linux/bpf.h>
#include <linux/types.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#undef __always_inline
#define __always_inline inline __attribute__((always_inline))

static void *(*bpf_map_lookup_elem)(void *map, const void *key) __attribute__((unused)) =
	(void *)BPF_FUNC_map_lookup_elem;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define be16_to_host(x) __builtin_bswap16(x)
#define host_to_be16(x) __builtin_bswap16(x)
#define host_to_be32(x) __builtin_bswap32(x)
#else
#define be16_to_host(x) (x)
#define host_to_be16(x) (x)
#define host_to_be32(x) (x)
#endif

#endif
