"""TRex STL profile: perf-lab's packet scenarios through a load balancer's VIP, on real NICs.

Compiled by TRex's own profile compiler in perf-lab/tests/trex_profiles.rs (the streams, rates,
field-engine programs and flow stats checked; packets expanded from the field engine replayed
through `xvs pcap` with xvs.toml, beside this file). Not run against a TRex server here: see
README.md beside this file for the topology, the commands and which numbers to read.

    start -f perf_lab.py --port 0 -m 1mpps -t --scenario one-service --size 64
    start -f perf_lab.py --port 0 -m 10gbps -t --kind mix --size imix --flows 100000
    start -f perf_lab.py --port 0 -m 1mpps -t scenario=syn-flood,size=64   (old style)

Tunables (`-t --help` lists them): --scenario, --flows, --services, --kind, --size,
--latency-pps, --no-flow-stats, --vip, --service-port, --src-mac, --dst-mac.

- The measured streams carry flow statistics (STLFlowStats: per-stream tx/rx counts; none with
  --no-flow-stats), never latency statistics: TRex's multiplier (`-m`) does not apply to latency streams, so every
  measured stream scales with `-m`. Latency comes from one separate UDP stream per port at
  --latency-pps (not scaled by `-m`), from the TRex port's own address 198.18.0.2.
- Flows are exact: one STLVmTupleGen per stream (source address inner, source port outer, as
  perf-lab's generator numbers flows: flow f = 198.18.0.(16 + f mod 224), port 1024 + f / 224)
  with limit_flows = the flows asked. With --services > 1, source port row r goes to service
  r (the tuple's port written into the destination port too, offset): flows / services
  sources per service, every flow its own source address and port as perf-lab's.
- Every stream fixes its IPv4 and L4 checksums after the rewrite (STLVmFixChecksumHw, as
  TRex's syn_attack_fix_cs_hw.py: the NIC's checksum offload, or TRex's software fallback).
- Sizes are Ethernet frame sizes including the 4-byte FCS (RFC 2544, TRex's convention: a
  64-byte frame is a 60-byte packet). imix = 7:4:1 of 64/594/1518-byte frames (TRex's imix.py).
- Each port gets its own flow-stats ids (pg_id = port * 64 + n) and its own source ports
  (port p's start after port p-1's), so the profile runs on several ports at once.
- Kinds: udp; syn (every packet a SYN of its flow); ack (PSH|ACK with data; each ACK stream
  is started by a single burst of one SYN per flow, since xvs drops a non-SYN TCP packet
  without a flow); mix (by flow: half udp, a quarter ack, a quarter syn, as perf-lab's).
- MACs: the TRex port's (trex_cfg.yaml: src_mac, dest_mac) unless --src-mac/--dst-mac.
"""

import argparse
import os

from trex_stl_lib.api import (
    STLStream, STLPktBuilder, STLTXCont, STLTXSingleBurst, STLVM,
    STLFlowStats, STLFlowLatencyStats, CTRexVmInsFixHwCs,
    Ether, IP, UDP, TCP, Raw,
)

# The perf-lab addressing (perf-lab/src/rig.rs, and xvs.toml / trex_cfg.yaml beside this file).
VIP = "198.18.100.1"
SERVICE_PORT = 1000          # service ports SERVICE_PORT.., UDP and TCP
SRC_FIRST = "198.18.0.16"    # client addresses 198.18.0.16-239
SRC_COUNT = 224
SPORT_FIRST = 1024           # client ports 1024..
LATENCY_SRC = "198.18.0.2"   # the TRex port's own address: the latency flow
LATENCY_SPORT = 32768        # + port id
PG_STRIDE = 64               # pg_id = port * PG_STRIDE + n; n = 0 is the latency stream

# scenario: (services, flows, kind), as perf-lab's (perf-lab/src/bench.rs)
SCENARIOS = {
    "one-service": (1, 1000, "udp"),
    "change-under-load": (1, 1000, "udp"),
    "flows-1m": (1, 1000000, "udp"),
    "syn-flood": (1, 1000000, "syn"),
    "services-10k": (10000, 10000, "udp"),
}
KINDS = ("udp", "syn", "ack", "mix")
# (frame size with FCS, relative rate)
IMIX = [(64, 7), (594, 4), (1518, 1)]
FCS = 4


def _ip_add(ip, n):
    a = [int(x) for x in ip.split(".")]
    v = (a[0] << 24 | a[1] << 16 | a[2] << 8 | a[3]) + n
    return "%d.%d.%d.%d" % (v >> 24 & 255, v >> 16 & 255, v >> 8 & 255, v & 255)


def _frame_size(text):
    if text == "imix":
        return text
    n = int(text)
    if not 64 <= n <= 1518:
        raise argparse.ArgumentTypeError("size %s: want 64..1518 (frame bytes with FCS) or imix" % text)
    return n


def parse_tunables(tunables):
    parser = argparse.ArgumentParser(
        prog=os.path.basename(__file__),
        description="perf-lab scenarios through a load balancer's VIP (see README.md)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="one-service",
                        help="perf-lab scenario: sets services, flows and kind")
    parser.add_argument("--flows", type=int, default=None,
                        help="flows per port (%(default)s: the scenario's)")
    parser.add_argument("--services", type=int, default=None,
                        help="services, on ports service-port.. (%(default)s: the scenario's)")
    parser.add_argument("--kind", choices=KINDS, default=None,
                        help="packets (%(default)s: the scenario's)")
    parser.add_argument("--size", type=_frame_size, default=64,
                        help="frame bytes with FCS, 64..1518, or imix (7:4:1 of 64/594/1518)")
    parser.add_argument("--latency-pps", type=int, default=1000,
                        help="rate of the latency stream per port, not scaled by -m (0: none)")
    parser.add_argument("--no-flow-stats", action="store_true",
                        help="measured streams without per-stream counters (NICs that cannot "
                             "count them; loss from the port counters then)")
    parser.add_argument("--vip", default=VIP, help="service address")
    parser.add_argument("--service-port", type=int, default=SERVICE_PORT,
                        help="first service port")
    parser.add_argument("--src-mac", default=None,
                        help="source MAC written in the packets (%(default)s: the TRex port's)")
    parser.add_argument("--dst-mac", default=None,
                        help="destination MAC written in the packets (%(default)s: the TRex "
                             "port's dest_mac or resolved gateway)")
    args = parser.parse_args(tunables)
    services, flows, kind = SCENARIOS[args.scenario]
    args.services = services if args.services is None else args.services
    args.flows = flows if args.flows is None else args.flows
    args.kind = kind if args.kind is None else args.kind
    if args.services < 1 or args.flows < 1 or args.latency_pps < 0:
        parser.error("services and flows must be at least 1, latency-pps at least 0")
    args.flows = max(args.flows, args.services)  # one flow per service at least, as perf-lab
    if args.service_port + args.services - 1 > 65535:
        parser.error("services %d from port %d pass 65535" % (args.services, args.service_port))
    return args


def flow_classes(kind, flows):
    """[(packet kind, flows)]: mix splits flows by flow number as perf-lab's generator does
    (f mod 4: 0, 1 udp, 2 ack, 3 syn)."""
    if kind != "mix":
        return [(kind, flows)]
    counts = [("udp", (flows + 3) // 4 + (flows + 2) // 4), ("ack", (flows + 1) // 4),
              ("syn", flows // 4)]
    return [(k, n) for k, n in counts if n > 0]


def sport_rows(flows, services):
    """Source ports a class of `flows` flows uses."""
    if services == 1:
        return (flows + SRC_COUNT - 1) // SRC_COUNT
    return services


class Tuples(object):
    """One class's flows: a tuple generator's ranges (see the module docstring). Every flow has
    its own source address and port, as perf-lab's: flows to different services from one
    source would share a reply tuple behind a DNAT."""

    def __init__(self, flows, services, sport, service_port):
        self.flows = flows
        self.sport, self.dport = sport, service_port
        # sources inner, source ports outer: flow f = (SRC_FIRST + f % srcs, sport + f / srcs)
        if services == 1:
            self.srcs = min(flows, SRC_COUNT)
            self.dport_add = None  # one service
        else:
            # source port row r goes to service r: flows / services sources per service
            if flows % services or flows // services > SRC_COUNT:
                raise ValueError(
                    "%d flows over %d services: want a multiple of the services, at most "
                    "%d per service (one per client address)" % (flows, services, SRC_COUNT))
            self.srcs = flows // services
            self.dport_add = service_port - sport
        self.ports = sport_rows(flows, services)

    def vm(self, l4):
        vm = STLVM()
        vm.tuple_var(name="flow", ip_min=SRC_FIRST, ip_max=_ip_add(SRC_FIRST, self.srcs - 1),
                     port_min=self.sport, port_max=self.sport + self.ports - 1,
                     limit_flows=self.flows)
        vm.write(fv_name="flow.ip", pkt_offset="IP.src")
        vm.write(fv_name="flow.port", pkt_offset="%s.sport" % l4)
        if self.dport_add is not None:
            vm.write(fv_name="flow.port", pkt_offset="%s.dport" % l4, add_val=self.dport_add)
        # IPv4 header and L4 checksums, after every rewrite (must be last)
        l4_type = CTRexVmInsFixHwCs.L4_TYPE_UDP if l4 == "UDP" else CTRexVmInsFixHwCs.L4_TYPE_TCP
        vm.fix_chksum_hw(l3_offset="IP", l4_offset=l4, l4_type=l4_type)
        return vm


class PerfLab(object):

    def _ether(self, a):
        e = Ether()
        if a.src_mac:
            e.src = a.src_mac
        if a.dst_mac:
            e.dst = a.dst_mac
        return e

    def _pkt(self, a, kind, frame, src, sport, dport, udp_chksum=None):
        """The base packet: `frame` bytes on the wire (FCS included), zero padded."""
        ip = IP(src=src, dst=a.vip, ttl=64, flags="DF", id=0)
        if kind == "udp":
            l4 = UDP(sport=sport, dport=dport)
            if udp_chksum is not None:
                l4.chksum = udp_chksum
        elif kind == "syn":
            l4 = TCP(sport=sport, dport=dport, flags="S", seq=0, window=65535)
        else:
            l4 = TCP(sport=sport, dport=dport, flags="PA", seq=1, ack=1, window=65535)
        pkt = self._ether(a) / ip / l4
        # Zero data up to the size, as perf-lab's generator pads (its SYNs carry data too).
        return pkt / Raw(b"\x00" * max(0, frame - FCS - len(pkt)))

    def get_streams(self, direction=0, port_id=0, tunables=None, **kwargs):
        a = parse_tunables(tunables or [])
        # TRex's console passes the port; its simulator (stl-sim -i N, trex-compile -i N)
        # passes only direction = N % 2. A real port 0 always has direction 0.
        port_id = port_id or direction
        sizes = IMIX if a.size == "imix" else [(a.size, 1)]
        classes = flow_classes(a.kind, a.flows)
        # Source ports: each class its own block, this port's blocks after lower ports'.
        rows = sum(sport_rows(n, a.services) for _kind, n in classes)
        sport = SPORT_FIRST + port_id * rows
        if sport + rows - 1 > 65535:
            raise ValueError("%d flows on port %d: source ports pass 65535" % (a.flows, port_id))
        tuples = []
        for _kind, n in classes:
            tuples.append(Tuples(n, a.services, sport, a.service_port))
            sport += sport_rows(n, a.services)

        streams = []
        pg = [port_id * PG_STRIDE]

        def stats():
            if a.no_flow_stats:
                return None
            pg[0] += 1
            if pg[0] >= (port_id + 1) * PG_STRIDE:
                raise ValueError("more than %d streams" % (PG_STRIDE - 1))
            return STLFlowStats(pg_id=pg[0])

        for (kind, n), t in zip(classes, tuples):
            l4 = "UDP" if kind == "udp" else "TCP"
            for frame, weight in sizes:
                # relative rate: this class's share of the flows times the size's share
                pps = float(n) / a.flows * weight
                name = "p%d-%s-%d" % (port_id, kind, frame)
                pkt = STLPktBuilder(pkt=self._pkt(a, kind, frame, SRC_FIRST, t.sport, t.dport),
                                    vm=t.vm(l4))
                if kind == "ack":
                    # one SYN per flow first (a single burst over the same tuples), then the ACKs
                    syn = STLPktBuilder(pkt=self._pkt(a, "syn", 64, SRC_FIRST, t.sport, t.dport),
                                        vm=t.vm("TCP"))
                    streams.append(STLStream(
                        name=name + "-syn", packet=syn,
                        mode=STLTXSingleBurst(pps=pps, total_pkts=n), next=name,
                        flow_stats=stats()))
                streams.append(STLStream(
                    name=name, packet=pkt, mode=STLTXCont(pps=pps),
                    self_start=(kind != "ack"),
                    flow_stats=stats()))
        if a.latency_pps > 0:
            lat = self._pkt(a, "udp", 64, LATENCY_SRC, LATENCY_SPORT + port_id, a.service_port,
                            udp_chksum=0)  # TRex writes its latency data into the payload
            streams.append(STLStream(
                name="p%d-latency" % port_id, packet=STLPktBuilder(pkt=lat),
                mode=STLTXCont(pps=a.latency_pps),
                flow_stats=STLFlowLatencyStats(pg_id=port_id * PG_STRIDE)))
        return streams


def register():
    return PerfLab()
