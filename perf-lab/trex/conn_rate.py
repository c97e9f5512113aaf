"""TRex ASTF profile: TCP connections per second through a load balancer's VIP.

Each connection is a short HTTP-like exchange over real TCP (TRex's own stack on both sides):
the client (TRex port 0, addresses 198.18.0.16-239) connects to VIP:service-port, sends a
request of --req-size bytes, reads a response of --resp-size bytes and closes; the server
(TRex port 1) takes the connection the load balancer forwarded to a backend 198.18.1.1-3 on
--backend-port, reads the request and answers. New connections start at --cps per second
(TRex's -m multiplies it). Compiled by TRex's own profile compiler in
perf-lab/tests/trex_profiles.rs; not run against a TRex server here: see README.md beside this
file for the topology (xvs.toml, trex_cfg.yaml), the commands and which numbers to read.

    start -f conn_rate.py -m 10 -t --cps 1000 --req-size 100 --resp-size 1000
"""

import argparse
import os

from trex.astf.api import (
    ASTFProfile, ASTFTemplate, ASTFTCPClientTemplate, ASTFTCPServerTemplate, ASTFProgram,
    ASTFIPGen, ASTFIPGenDist, ASTFIPGenGlobal, ASTFAssociationRule,
)

# The perf-lab addressing (perf-lab/src/rig.rs, and xvs.toml / trex_cfg.yaml beside this file).
VIP = "198.18.100.1"
SERVICE_PORT = 1000
CLIENTS = ("198.18.0.16", "198.18.0.239")
BACKENDS = ("198.18.1.1", "198.18.1.3")
BACKEND_PORT = 9000


def http_request(size, vip):
    """A GET of exactly `size` bytes (the path fills it up)."""
    def req(path):
        return "GET /%s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, vip)
    pad = size - len(req(""))
    if pad < 0:
        raise ValueError("--req-size %d: at least %d bytes" % (size, len(req(""))))
    return req("x" * pad).encode()


def http_response(size):
    """A 200 response of exactly `size` bytes (headers and a body of '*')."""
    def head(n):
        return "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n
    body = size - len(head(0))
    # the length field itself grows with the body's digits
    while body > 0 and len(head(body)) + body > size:
        body -= 1
    if body < 0 or len(head(body)) + body != size:
        raise ValueError("--resp-size %d: at least %d bytes" % (size, len(head(0))))
    return (head(body) + "*" * body).encode()


class ConnRate(object):

    def get_profile(self, tunables=None, **kwargs):
        parser = argparse.ArgumentParser(
            prog=os.path.basename(__file__),
            description="TCP connections per second through the VIP (see README.md)",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        parser.add_argument("--cps", type=float, default=1000.0,
                            help="new connections per second (TRex's -m multiplies it)")
        parser.add_argument("--req-size", type=int, default=100,
                            help="request bytes (client to server)")
        parser.add_argument("--resp-size", type=int, default=1000,
                            help="response bytes (server to client)")
        parser.add_argument("--vip", default=VIP, help="service address")
        parser.add_argument("--service-port", type=int, default=SERVICE_PORT,
                            help="service (VIP) port the clients connect to")
        parser.add_argument("--backend-port", type=int, default=BACKEND_PORT,
                            help="port the load balancer forwards to (the servers listen)")
        args = parser.parse_args(tunables or [])
        if args.cps < 0.5:
            parser.error("--cps: TRex's minimum is 0.5")

        req = http_request(args.req_size, args.vip)
        resp = http_response(args.resp_size)

        client = ASTFProgram()
        client.send(req)
        client.recv(len(resp))  # then the program ends: the client closes

        server = ASTFProgram()
        server.recv(len(req))
        server.send(resp)

        # Clients connect to the VIP only; the servers are the backends the LB picks.
        ip_gen = ASTFIPGen(glob=ASTFIPGenGlobal(ip_offset="1.0.0.0"),
                           dist_client=ASTFIPGenDist(ip_range=list(CLIENTS), distribution="seq"),
                           dist_server=ASTFIPGenDist(ip_range=[args.vip, args.vip],
                                                     distribution="seq"))
        template = ASTFTemplate(
            client_template=ASTFTCPClientTemplate(program=client, ip_gen=ip_gen,
                                                  port=args.service_port, cps=args.cps),
            server_template=ASTFTCPServerTemplate(
                program=server,
                assoc=ASTFAssociationRule(port=args.backend_port, ip_start=BACKENDS[0],
                                          ip_end=BACKENDS[1])),
            tg_name="conn-rate")
        return ASTFProfile(default_ip_gen=ip_gen, templates=template)


def register():
    return ConnRate()
