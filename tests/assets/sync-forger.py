#!/usr/bin/env python3
"""The third process of tests/sync_forgery_e2e.rs: it sees the wire between two xvs nodes
(AF_PACKET sockets on the bridge ports of the lab's wire namespace, scripts/sync-lab),
captures their flow-sync datagrams and sends them again.

  sync-forger.py capture IFACE SRC DST OUT SECONDS [reflect]
      appends to OUT every IPv4/UDP frame IFACE receives from SRC to DST port 7946, for
      SECONDS (at most 1000 frames; each stored as a u32 length and the frame); prints
      "ready" once it listens, then "captured N kinds K:N,...". With "reflect", each frame
      is also sent back to its sender at once, out of IFACE (see "reflect" below): a
      reflector on the path, whose copies arrive while the originals are the newest datagrams
      of their sender.
  sync-forger.py send IFACE IN MODE
      sends every frame of IN out of IFACE; MODE "as-is" (to its receiver again) or
      "reflect" (back to its sender, as if its receiver had sent it: MAC and IP addresses
      and UDP ports swapped); prints "sent N kinds K:N,...".

K is the flow-sync kind (the datagram's sixth byte: 1 flows, 2 ends, 3 dump request, 4 dump
end, 5 hello). Checksums are recomputed (IPv4 header and UDP) before a frame leaves.
"""
import socket
import struct
import sys
import time

ETH_P_ALL = 3
SYNC_PORT = 7946
MAX_FRAMES = 1000


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def parse(f):
    """(ihl offset of UDP, src, dst, dport) of an IPv4/UDP frame, else None."""
    if len(f) < 14 + 20 + 8 or f[12:14] != b"\x08\x00" or f[14] >> 4 != 4:
        return None
    ihl = (f[14] & 0xF) * 4
    if f[23] != 17 or len(f) < 14 + ihl + 8:
        return None
    udp = 14 + ihl
    dport = struct.unpack("!H", f[udp + 2 : udp + 4])[0]
    return udp, socket.inet_ntoa(f[26:30]), socket.inet_ntoa(f[30:34]), dport


def kind(f):
    udp = parse(f)[0]
    payload = f[udp + 8 :]
    return payload[5] if len(payload) > 5 else -1


def summary(frames):
    kinds = {}
    for f in frames:
        k = kind(f)
        kinds[k] = kinds.get(k, 0) + 1
    return "kinds " + ",".join("%d:%d" % (k, n) for k, n in sorted(kinds.items()))


def fix_checksums(f):
    f = bytearray(f)
    ihl = (f[14] & 0xF) * 4
    total = struct.unpack("!H", f[16:18])[0]
    f = f[: 14 + total]
    f[24:26] = b"\0\0"
    f[24:26] = struct.pack("!H", csum(bytes(f[14 : 14 + ihl])))
    udp = 14 + ihl
    ulen = struct.unpack("!H", f[udp + 4 : udp + 6])[0]
    f[udp + 6 : udp + 8] = b"\0\0"
    pseudo = bytes(f[26:34]) + struct.pack("!BBH", 0, 17, ulen)
    c = csum(pseudo + bytes(f[udp : udp + ulen])) or 0xFFFF
    f[udp + 6 : udp + 8] = struct.pack("!H", c)
    return bytes(f)


def reflect(f):
    f = bytearray(f)
    f[0:6], f[6:12] = f[6:12], f[0:6]
    f[26:30], f[30:34] = f[30:34], f[26:30]
    udp = 14 + (f[14] & 0xF) * 4
    f[udp : udp + 2], f[udp + 2 : udp + 4] = f[udp + 2 : udp + 4], f[udp : udp + 2]
    return bytes(f)


def capture(iface, src, dst, out, seconds, mirror):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.settimeout(0.1)
    print("ready", flush=True)
    frames = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(frames) < MAX_FRAMES:
        try:
            f, addr = s.recvfrom(65535)
        except socket.timeout:
            continue
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        p = parse(f)
        if p and p[1] == src and p[2] == dst and p[3] == SYNC_PORT:
            frames.append(f)
            if mirror:
                s.send(fix_checksums(reflect(f)))
    with open(out, "ab") as o:
        for f in frames:
            o.write(struct.pack("<I", len(f)) + f)
    print("captured %d %s" % (len(frames), summary(frames)), flush=True)


def send(iface, path, mode):
    frames = []
    with open(path, "rb") as i:
        data = i.read()
    at = 0
    while at + 4 <= len(data) and len(frames) < MAX_FRAMES:
        (n,) = struct.unpack("<I", data[at : at + 4])
        frames.append(data[at + 4 : at + 4 + n])
        at += 4 + n
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    for f in frames:
        if mode == "reflect":
            f = reflect(f)
        elif mode != "as-is":
            sys.exit("mode: as-is | reflect")
        s.send(fix_checksums(f))
        # Paced a little: the receiver's socket buffer is not what is tested.
        time.sleep(0.001)
    print("sent %d %s" % (len(frames), summary(frames)), flush=True)


def main():
    a = sys.argv[1:]
    if len(a) in (6, 7) and a[0] == "capture":
        if len(a) == 7 and a[6] != "reflect":
            sys.exit(__doc__)
        capture(a[1], a[2], a[3], a[4], float(a[5]), len(a) == 7)
    elif len(a) == 4 and a[0] == "send":
        send(a[1], a[2], a[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
