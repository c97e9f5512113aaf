"""TRex STL profiles for the perf-lab scenarios (same packets as perf-lab's AF_XDP generator).

NOT RUN: this machine has no TRex and no physical NICs. Written against the TRex STLProfile
API (trex_stl_lib); see ../README.md for the two-NIC topology.

Usage (TRex console):
  start -f perf_lab.py -t scenario=one-service,size=64,flows=1000,vip=198.18.100.1 -m 1mpps
  start -f perf_lab.py -t scenario=syn-flood -m 2mpps
Scenarios: one-service, flows-1m, syn-flood, services-10k, change-under-load (one-service
traffic; change the LB's config during the run), imix via size=imix.

Every packet carries the perf-lab payload (20 bytes, big-endian): seq u32 | send time u64 |
client ip | client port | service port. TRex fills only the first field (a per-stream
counter); latency and loss come from TRex's own flow stats (STLFlowLatencyStats) instead.
"""

from trex_stl_lib.api import (
    STLProfile, STLStream, STLPktBuilder, STLTXCont, STLVM, STLFlowLatencyStats,
    Ether, IP, UDP, TCP, Raw,
)

SCENARIOS = {
    # services, flows, kind
    "one-service": (1, 1000, "udp"),
    "change-under-load": (1, 1000, "udp"),
    "flows-1m": (1, 1000000, "udp"),
    "syn-flood": (1, 1000000, "syn"),
    "services-10k": (10000, 10000, "udp"),
}
IMIX = [(64, 7), (576, 4), (1500, 1)]
BASE_PORT = 1000
SRC_FIRST, SRC_COUNT = "198.18.0.16", 224


class PerfLab(object):
    def _pkt(self, kind, size, vip):
        if kind == "udp":
            l4 = UDP(sport=1024, dport=BASE_PORT, chksum=0)
        elif kind == "syn":
            l4 = TCP(sport=1024, dport=BASE_PORT, flags="S", seq=0)
        else:
            l4 = TCP(sport=1024, dport=BASE_PORT, flags="PA", seq=0, ack=1)
        base = Ether() / IP(src=SRC_FIRST, dst=vip, ttl=64, flags="DF") / l4
        payload = b"\x00" * 20
        pad = max(0, size - 4 - len(base) - len(payload))  # size includes the 4-byte FCS
        return base / Raw(payload + b"\x00" * pad)

    def _vm(self, services, flows, kind):
        ports_per_src = max(1, (flows + SRC_COUNT - 1) // SRC_COUNT)
        vm = STLVM()
        vm.var(name="src", min_value=SRC_FIRST, max_value="198.18.0.239", size=4, op="inc")
        vm.write(fv_name="src", pkt_offset="IP.src")
        vm.var(name="sport", min_value=1024, max_value=1024 + ports_per_src - 1, size=2, op="inc")
        vm.write(fv_name="sport", pkt_offset="UDP.sport" if kind == "udp" else "TCP.sport")
        if services > 1:
            vm.var(name="dport", min_value=BASE_PORT, max_value=BASE_PORT + services - 1, size=2, op="inc")
            vm.write(fv_name="dport", pkt_offset="UDP.dport" if kind == "udp" else "TCP.dport")
        vm.var(name="seq", min_value=0, max_value=0xFFFFFFFF, size=4, op="inc")
        vm.write(fv_name="seq", pkt_offset="Raw.load")
        vm.fix_chksum()  # IPv4 and L4 checksums after every rewrite
        return vm

    def get_streams(self, tunables=None, port_id=0, **kwargs):
        t = dict(tunables or {})
        t.update(kwargs)
        scenario = t.get("scenario", "one-service")
        services, flows, kind = SCENARIOS[scenario]
        flows = int(t.get("flows", flows))
        kind = t.get("kind", kind)
        vip = t.get("vip", "198.18.100.1")
        size = t.get("size", "64")
        sizes = IMIX if str(size) == "imix" else [(int(size), 1)]
        streams = []
        for i, (sz, weight) in enumerate(sizes):
            streams.append(STLStream(
                packet=STLPktBuilder(pkt=self._pkt(kind, sz, vip), vm=self._vm(services, flows, kind)),
                mode=STLTXCont(pps=weight),
                flow_stats=STLFlowLatencyStats(pg_id=10 + i),
            ))
        return streams


def register():
    return PerfLab()
