#!/usr/bin/env python3
"""A minimal Kubernetes API server for xvs's end-to-end test: lists of one Service, its
EndpointSlice and one Node (with resourceVersion), and watches that stay open with periodic
bookmarks. Usage: fake-kube-api.py PORT"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse, parse_qs

RV = "7"
META = lambda name, ns=None, **kw: dict(
    name=name, uid="uid-" + name, resourceVersion=RV,
    creationTimestamp="2026-01-01T00:00:00Z", **({"namespace": ns} if ns else {}), **kw)

SERVICE = {
    "apiVersion": "v1", "kind": "Service", "metadata": META("web", "default"),
    "spec": {"type": "ClusterIP", "clusterIP": "198.18.100.1", "clusterIPs": ["198.18.100.1"],
             "ipFamilies": ["IPv4"], "sessionAffinity": "None",
             "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "web"}]},
}
SLICE = {
    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
    "metadata": META("web-x1", "default", labels={"kubernetes.io/service-name": "web"}),
    "addressType": "IPv4",
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    "endpoints": [
        {"addresses": ["198.18.1.%d" % i],
         "conditions": {"ready": True, "serving": True, "terminating": False}}
        for i in (1, 2, 3)
    ],
}
NODE = {
    "apiVersion": "v1", "kind": "Node", "metadata": META("xvs-lab", labels={}),
    "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.1"}]},
}
LISTS = {
    "/api/v1/services": ("ServiceList", "v1", [SERVICE]),
    "/apis/discovery.k8s.io/v1/endpointslices": ("EndpointSliceList", "discovery.k8s.io/v1", [SLICE]),
    "/api/v1/nodes": ("NodeList", "v1", [NODE]),
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        entry = LISTS.get(url.path)
        if entry is None:
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        kind, api, items = entry
        if q.get("watch", ["false"])[0] in ("true", "1"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            bookmark = {"type": "BOOKMARK", "object": {
                "kind": kind[:-4], "apiVersion": api, "metadata": {"resourceVersion": RV}}}
            try:
                for _ in range(600):
                    line = (json.dumps(bookmark) + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    time.sleep(1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        body = json.dumps({"kind": kind, "apiVersion": api,
                           "metadata": {"resourceVersion": RV}, "items": items}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True


Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
