#!/usr/bin/env python3
"""A lab backend: answers HTTP on :8080 with its name, echoes UDP on :9000 prefixed with its
name, on IPv4 and IPv6. GET /bytes/N returns N deterministic bytes (for download checks).
Usage: lab-backend.py NAME"""
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = sys.argv[1] if len(sys.argv) > 1 else socket.gethostname()


def pattern(n):
    block = bytes(range(256))
    return (block * (n // 256 + 1))[:n]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/bytes/"):
            try:
                body = pattern(min(int(self.path[7:]), 64 << 20))
            except ValueError:
                body = b""
        else:
            body = (NAME + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Backend", NAME)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True

    def server_bind(self):
        # One dual-stack socket serves IPv4 and IPv6.
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def udp_echo():
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 9000))
    while True:
        data, peer = s.recvfrom(65535)
        s.sendto(NAME.encode() + b" " + data, peer)


threading.Thread(target=udp_echo, daemon=True).start()
Server6(("::", 8080), Handler).serve_forever()
