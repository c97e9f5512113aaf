#!/usr/bin/env python3
"""A stand-in for an xvs node in DSR mode, for tests of the backend side: every frame the
client sends to a listed VIP on IN_IFACE is sent on OUT_IFACE to that VIP's backend the way
xvs delivers it in DSR mode, inner packet unchanged (TTL, addresses, ports):
  ipip  IPv4-in-IPv4 (protocol 4) or IPv6-in-IPv6 (next header 41), outer source OUTER_SRC
        of the backend's family;
  gue   UDP to GUE_PORT carrying the inner packet directly (GUE variant 1, Katran's layout),
        source port from the flow's hash;
  l2    only the destination MAC changes (IPVS DR).
Replies do not come back through it (the backends route them straight to the client).

Usage: dsr-relay.py IN_IFACE OUT_IFACE OUTER_SRC4 OUTER_SRC6 GUE_PORT SECONDS \
                    VIP=ENCAP,BACKEND_IP,BACKEND_MAC ...
Runs at most SECONDS (or until SIGTERM), then prints `relayed VIP N` per VIP and
`relayed_total N`. Only the standard library (AF_PACKET sockets)."""
import ipaddress
import select
import signal
import socket
import struct
import sys
import time
import zlib

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def ipv4(proto, src, dst, payload):
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, proto, 0, src, dst)
    c = (~csum(hdr)) & 0xFFFF
    return hdr[:10] + struct.pack("!H", c) + hdr[12:] + payload


def ipv6(nh, src, dst, payload):
    return struct.pack("!IHBB16s16s", 0x60000000, len(payload), nh, 64, src, dst) + payload


def udp(src, dst, sport, dport, payload):
    length = 8 + len(payload)
    seg = struct.pack("!HHHH", sport, dport, length, 0) + payload
    if len(src) == 4:
        # A zero IPv4 UDP checksum means none, as tunnels send it.
        return seg
    pseudo = src + dst + struct.pack("!IxxxB", length, 17)
    c = (~csum(pseudo + seg)) & 0xFFFF or 0xFFFF
    return seg[:6] + struct.pack("!H", c) + seg[8:]


def parse_routes(args):
    routes = {}
    for a in args:
        vip, rest = a.split("=", 1)
        encap, ip, mac = rest.split(",")
        if encap not in ("ipip", "gue", "l2"):
            sys.exit("unknown encap " + encap)
        routes[ipaddress.ip_address(vip).packed] = (
            vip, encap, ipaddress.ip_address(ip).packed, bytes.fromhex(mac.replace(":", "")))
    return routes


def inner_dst(l3, ethertype):
    if ethertype == 0x0800 and len(l3) >= 20:
        return l3[16:20]
    if ethertype == 0x86DD and len(l3) >= 40:
        return l3[24:40]
    return None


def trim(l3, ethertype):
    if ethertype == 0x0800 and len(l3) >= 20:
        return l3[:struct.unpack("!H", l3[2:4])[0]]
    if ethertype == 0x86DD and len(l3) >= 40:
        return l3[:40 + struct.unpack("!H", l3[4:6])[0]]
    return l3


def encapsulate(l3, encap, src, dst, gue_port):
    v4 = len(dst) == 4
    inner_v4 = l3[0] >> 4 == 4
    if encap == "l2":
        return l3, 0x0800 if inner_v4 else 0x86DD
    if encap == "ipip":
        proto = 4 if inner_v4 else 41
        payload = l3
    else:
        proto = 17
        # The flow's hash: addresses and (for TCP/UDP) ports of the inner packet.
        hdr = 20 if inner_v4 else 40
        key = l3[12:20] if inner_v4 else l3[8:40]
        sport = 0x8000 | (zlib.crc32(key + l3[hdr:hdr + 4]) & 0x7FFF)
        payload = udp(src, dst, sport, gue_port, l3)
    if v4:
        return ipv4(proto, src, dst, payload), 0x0800
    return ipv6(proto, src, dst, payload), 0x86DD


def main():
    in_if, out_if, src4, src6, gue_port, seconds = sys.argv[1:7]
    src4 = ipaddress.ip_address(src4).packed
    src6 = ipaddress.ip_address(src6).packed
    gue_port, deadline = int(gue_port), time.monotonic() + float(seconds)
    routes = parse_routes(sys.argv[7:])
    counts = {r[0]: 0 for r in routes.values()}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    rx.bind((in_if, ETH_P_ALL))
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind((out_if, 0))
    with open("/sys/class/net/%s/address" % out_if) as f:
        out_mac = bytes.fromhex(f.read().strip().replace(":", ""))
    print("ready", flush=True)
    while not stop and time.monotonic() < deadline:
        try:
            readable, _, _ = select.select([rx], [], [], 0.2)
        except InterruptedError:
            continue
        if not readable:
            continue
        frame, addr = rx.recvfrom(65535)
        if addr[2] == PACKET_OUTGOING or len(frame) < 14:
            continue
        (ethertype,) = struct.unpack("!H", frame[12:14])
        # Without the Ethernet padding of short frames.
        l3 = trim(frame[14:], ethertype)
        route = routes.get(inner_dst(l3, ethertype))
        if route is None:
            continue
        vip, encap, backend, mac = route
        src = src4 if len(backend) == 4 else src6
        packet, outer_type = encapsulate(l3, encap, src, backend, gue_port)
        tx.send(mac + out_mac + struct.pack("!H", outer_type) + packet)
        counts[vip] += 1
    for vip, n in counts.items():
        print("relayed %s %d" % (vip, n))
    print("relayed_total %d" % sum(counts.values()), flush=True)


main()
