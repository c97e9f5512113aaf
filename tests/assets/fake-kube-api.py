#!/usr/bin/env python3
"""A small Kubernetes API server for xvs's end-to-end tests. Usage: fake-kube-api.py PORT

Objects: the Service default/web (198.18.100.1: TCP "http" 80 -> targetPort "web", UDP
"echo" 9000), its EndpointSlice web-x1 (198.18.1.1-3, "http" 8080/TCP and "echo" 9000/UDP)
and the Node xvs-lab.

- Lists answer the current objects and the current resourceVersion (one counter for every
  object, as etcd's revision).
- Watches (`?watch=true&resourceVersion=R`) stream every change after R of their resource
  as `ADDED`/`MODIFIED`/`DELETED` JSON lines (each object with its new resourceVersion),
  then further changes as they happen, and a `BOOKMARK` every second, until
  `timeoutSeconds` (default 290) has passed. Without R (or with "0") they start with an
  `ADDED` for every current object.
- Controls, driven by the tests: `POST /__control/ACTION` with a JSON body; the answer is
  `{"resourceVersion": "N"}`, the version of the change made before answering.
  - `move` `{"ip", "from", "to", "delay"}`: removes the endpoint `ip` from slice `from` now
    (`MODIFIED`), and `delay` seconds later adds it to slice `to` (`ADDED` when `to` is
    new, with the ports of `from`; else `MODIFIED`): what the EndpointSlice controller
    does when it rebalances endpoints, removal first.
  - `remove` `{"ip"}`: removes the endpoint `ip` from every slice holding it, for good.
  - `add` `{"ip", "slice"}`: adds a ready endpoint `ip` to `slice` (created if missing).
  - `replace` `{"from", "to", "delay"}`: deletes slice `from` now (`DELETED`), and `delay`
    seconds later adds slice `to` with its endpoints and ports (`ADDED`).
  `GET /__control/state` answers the resourceVersion and the slices.
- Like the EndpointSlice controller, every slice it adds or changes carries the annotation
  `endpoints.kubernetes.io/last-change-trigger-time`: the time of the change (RFC 3339, UTC).
  The initial slice carries an old one (2026-01-01T00:00:00Z), from before any client
  started.
"""
import copy
import datetime
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse, parse_qs

SERVICES = "/api/v1/services"
SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
NODES = "/api/v1/nodes"
KINDS = {
    SERVICES: ("Service", "v1"),
    SLICES: ("EndpointSlice", "discovery.k8s.io/v1"),
    NODES: ("Node", "v1"),
}
FIRST_RV = 7
TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"


def meta(name, ns=None, **kw):
    return dict(name=name, uid="uid-" + name, resourceVersion=str(FIRST_RV),
                creationTimestamp="2026-01-01T00:00:00Z",
                **({"namespace": ns} if ns else {}), **kw)


def endpoint(ip):
    return {"addresses": [ip],
            "conditions": {"ready": True, "serving": True, "terminating": False}}


SLICE_PORTS = [{"name": "http", "port": 8080, "protocol": "TCP"},
               {"name": "echo", "port": 9000, "protocol": "UDP"}]


def new_slice(name, ips, ports=SLICE_PORTS):
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": meta(name, "default", labels={"kubernetes.io/service-name": "web"},
                         annotations={TRIGGER_TIME: "2026-01-01T00:00:00Z"}),
        "addressType": "IPv4",
        "ports": copy.deepcopy(ports),
        "endpoints": [endpoint(ip) for ip in ips],
    }


class Cluster:
    """The objects, by resource path and name, and every change since the start. All access
    under `cond` (a condition variable: watches wait on it for changes)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.rv = FIRST_RV
        self.objects = {
            SERVICES: {"web": {
                "apiVersion": "v1", "kind": "Service", "metadata": meta("web", "default"),
                "spec": {"type": "ClusterIP", "clusterIP": "198.18.100.1",
                         "clusterIPs": ["198.18.100.1"], "ipFamilies": ["IPv4"],
                         "sessionAffinity": "None",
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                                    "targetPort": "web"},
                                   {"name": "echo", "port": 9000, "protocol": "UDP",
                                    "targetPort": 9000}]},
            }},
            SLICES: {"web-x1": new_slice("web-x1", ["198.18.1.%d" % i for i in (1, 2, 3)])},
            NODES: {"xvs-lab": {
                "apiVersion": "v1", "kind": "Node", "metadata": meta("xvs-lab", labels={}),
                "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.1"}]},
            }},
        }
        # (resourceVersion, path, event type, the object as of that version)
        self.log = []

    def _record(self, path, kind, obj):
        """Stamps `obj` with the next resourceVersion and logs the event (lock held)."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if path == SLICES and kind != "DELETED":
            now = datetime.datetime.now(datetime.timezone.utc)
            obj["metadata"].setdefault("annotations", {})[TRIGGER_TIME] = (
                now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        self.log.append((self.rv, path, kind, copy.deepcopy(obj)))
        self.cond.notify_all()
        return self.rv

    def remove_ip(self, ip, only=None):
        """Removes `ip` from slice `only`, or from every slice; the last version made."""
        with self.cond:
            rv = self.rv
            for name, s in sorted(self.objects[SLICES].items()):
                if only is not None and name != only:
                    continue
                kept = [e for e in s["endpoints"] if ip not in e["addresses"]]
                if len(kept) != len(s["endpoints"]):
                    s["endpoints"] = kept
                    rv = self._record(SLICES, "MODIFIED", s)
            return rv

    def add_ip(self, ip, name, like=None):
        """Adds `ip` to slice `name`, creating it (with the ports of slice `like`)."""
        with self.cond:
            slices = self.objects[SLICES]
            s = slices.get(name)
            if s is None:
                ports = slices[like]["ports"] if like in slices else SLICE_PORTS
                s = slices[name] = new_slice(name, [ip], ports)
                return self._record(SLICES, "ADDED", s)
            if any(ip in e["addresses"] for e in s["endpoints"]):
                return self.rv
            s["endpoints"].append(endpoint(ip))
            return self._record(SLICES, "MODIFIED", s)

    def replace_slice(self, src, dst, delay):
        """Deletes slice `src`; `delay` seconds later adds `dst` with its endpoints."""
        with self.cond:
            old = self.objects[SLICES].pop(src)
            rv = self._record(SLICES, "DELETED", old)
        t = threading.Timer(delay, self.put_slice, (dst, old))
        t.daemon = True
        t.start()
        return rv

    def put_slice(self, name, like):
        """Adds slice `name` with the endpoints and ports of the object `like`."""
        with self.cond:
            s = new_slice(name, [], like["ports"])
            s["endpoints"] = copy.deepcopy(like["endpoints"])
            self.objects[SLICES][name] = s
            return self._record(SLICES, "ADDED", s)

    def listing(self, path):
        with self.cond:
            return str(self.rv), copy.deepcopy(list(self.objects[path].values()))

    def changes(self, path, since, wait_s):
        """The events of `path` after `since` (waiting up to `wait_s` for one) and the
        current version: every change of `path` up to it is in the answer."""
        def pending():
            return [(rv, kind, obj) for rv, p, kind, obj in self.log
                    if rv > since and p == path]

        with self.cond:
            events = pending()
            if not events:
                self.cond.wait(wait_s)
                events = pending()
            return events, self.rv


CLUSTER = Cluster()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def not_found(self):
        self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "NotFound", "code": 404})

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        if url.path == "/__control/state":
            with CLUSTER.cond:
                self.reply(200, {"resourceVersion": str(CLUSTER.rv),
                                 "slices": CLUSTER.objects[SLICES]})
            return
        if url.path not in KINDS:
            self.not_found()
            return
        kind, api = KINDS[url.path]
        if q.get("watch", ["false"])[0] in ("true", "1"):
            self.watch(url.path, kind, api, q)
            return
        rv, items = CLUSTER.listing(url.path)
        self.reply(200, {"kind": kind + "List", "apiVersion": api,
                         "metadata": {"resourceVersion": rv}, "items": items})

    def watch(self, path, kind, api, q):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        since = q.get("resourceVersion", ["0"])[0]
        deadline = time.monotonic() + int(q.get("timeoutSeconds", ["290"])[0])
        next_bookmark = time.monotonic() + 1

        def send(doc):
            line = (json.dumps(doc) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        try:
            if since in ("", "0"):
                since, items = CLUSTER.listing(path)
                for o in items:
                    send({"type": "ADDED", "object": o})
            since = int(since)
            while time.monotonic() < deadline:
                wait_s = max(0.0, min(next_bookmark, deadline) - time.monotonic())
                events, current = CLUSTER.changes(path, since, wait_s)
                for _, etype, obj in events:
                    send({"type": etype, "object": obj})
                since = current
                if time.monotonic() >= next_bookmark:
                    send({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": api,
                        "metadata": {"resourceVersion": str(current)}}})
                    next_bookmark = time.monotonic() + 1
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
            if url.path == "/__control/move":
                ip, dst, delay = req["ip"], req["to"], float(req.get("delay", 1.0))
                src = req["from"]
                rv = CLUSTER.remove_ip(ip, only=src)
                t = threading.Timer(delay, CLUSTER.add_ip, (ip, dst, src))
                t.daemon = True
                t.start()
            elif url.path == "/__control/remove":
                rv = CLUSTER.remove_ip(req["ip"])
            elif url.path == "/__control/replace":
                rv = CLUSTER.replace_slice(req["from"], req["to"], float(req.get("delay", 1.0)))
            elif url.path == "/__control/add":
                rv = CLUSTER.add_ip(req["ip"], req["slice"], "web-x1")
            else:
                self.not_found()
                return
        except (KeyError, TypeError, ValueError) as e:
            self.reply(400, {"error": repr(e)})
            return
        self.reply(200, {"resourceVersion": str(rv)})


class Server(ThreadingHTTPServer):
    daemon_threads = True


Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
