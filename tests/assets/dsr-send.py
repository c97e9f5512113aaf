#!/usr/bin/env python3
"""Sends one UDP request the way an xvs node in DSR mode delivers it to a backend (IPIP, GUE or
plain, i.e. L2), from a client address the caller's namespace owns, and prints the reply the
backend sends straight back to the client.

Usage: dsr-send.py IFACE DST_MAC ENCAP OUTER_SRC OUTER_DST CLIENT CLIENT_PORT VIP PORT PAYLOAD
                   [GUE_PORT] [TIMEOUT_S]
ENCAP: ipip | gue | plain. Prints `REPLY <source address> <source port> <data>` or `TIMEOUT`.
Only the standard library: an AF_PACKET socket sends the hand-built frame, a UDP socket bound
to CLIENT:CLIENT_PORT takes the reply."""
import ipaddress
import socket
import struct
import sys


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def ipv4(proto, src, dst, payload):
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0x1234, 0x4000, 64, proto, 0,
                      src.packed, dst.packed)
    c = (~csum(hdr)) & 0xFFFF
    return hdr[:10] + struct.pack("!H", c) + hdr[12:] + payload


def ipv6(nh, src, dst, payload):
    return struct.pack("!IHBB16s16s", 0x60000000, len(payload), nh, 64, src.packed,
                       dst.packed) + payload


def udp(src, dst, sport, dport, payload, checksum=True):
    length = 8 + len(payload)
    seg = struct.pack("!HHHH", sport, dport, length, 0) + payload
    if not checksum:
        return seg
    if src.version == 4:
        pseudo = src.packed + dst.packed + struct.pack("!BBH", 0, 17, length)
    else:
        pseudo = src.packed + dst.packed + struct.pack("!IxxxB", length, 17)
    c = (~csum(pseudo + seg)) & 0xFFFF or 0xFFFF
    return seg[:6] + struct.pack("!H", c) + seg[8:]


def ip(proto, src, dst, payload):
    return (ipv4 if src.version == 4 else ipv6)(proto, src, dst, payload)


def main():
    (iface, dst_mac, encap, osrc, odst, client, cport, vip, port, payload) = sys.argv[1:11]
    gue_port = int(sys.argv[11]) if len(sys.argv) > 11 else 6080
    timeout = float(sys.argv[12]) if len(sys.argv) > 12 else 3.0
    osrc, odst = ipaddress.ip_address(osrc), ipaddress.ip_address(odst)
    client, vip = ipaddress.ip_address(client), ipaddress.ip_address(vip)
    cport, port = int(cport), int(port)

    fam = socket.AF_INET if client.version == 4 else socket.AF_INET6
    rx = socket.socket(fam, socket.SOCK_DGRAM)
    rx.bind((str(client), cport))
    rx.settimeout(timeout)

    inner = ip(17, client, vip, udp(client, vip, cport, port, payload.encode()))
    if encap == "plain":
        l3 = inner
    elif encap == "ipip":
        l3 = ip(4 if vip.version == 4 else 41, osrc, odst, inner)
    elif encap == "gue":
        l3 = ip(17, osrc, odst, udp(osrc, odst, 40123, gue_port, inner, checksum=False))
    else:
        sys.exit("unknown encap " + encap)
    ethertype = 0x0800 if l3[0] >> 4 == 4 else 0x86DD
    with open("/sys/class/net/%s/address" % iface) as f:
        src_mac = bytes.fromhex(f.read().strip().replace(":", ""))
    frame = bytes.fromhex(dst_mac.replace(":", "")) + src_mac + struct.pack("!H", ethertype) + l3

    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind((iface, 0))
    tx.send(frame)
    try:
        data, peer = rx.recvfrom(2048)
        print("REPLY %s %d %s" % (peer[0], peer[1], data.decode()))
    except socket.timeout:
        print("TIMEOUT")


main()
