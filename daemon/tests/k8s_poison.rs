//! Issue #27's acceptance test for poisoned Kubernetes objects, on the real path: a fake API
//! server, the Kubernetes source (kube-rs watchers, translation) and the daemon's controller
//! building and publishing snapshots as the driver runs it (models in, ticks, publishes
//! acknowledged). Before #27 a Service whose two ports shared a name, or whose
//! `xvs.io/weights` the wrr builder refused, failed every later build: a Service created
//! after it was never programmed, while nothing was pending for `/healthz`.

#[path = "../../slowpath/tests/fake_api/mod.rs"]
mod fake_api;

use std::io::Write;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use daemon::admin::{refused_stats, refused_views};
use daemon::controller::{Action, Controller, Event, Sample, Status};
use fake_api::{FakeApi, Kind, kubeconfig};
use fastpath::passive::SynWatch;
use fastpath::settings::flow_table_config;
use fastpath::snapshot::L2Table;
use flowtable::FlowTable;
use serde_json::{Value, json};
use slowpath::admin::metrics::{ProbeCounts, render};
use slowpath::admin::{ServiceView, StatsView};
use slowpath::k8s::{self, K8sModel, SourceHandle};
use tracing_subscriber::fmt::MakeWriter;

const WAIT: Duration = Duration::from_secs(20);

/// Everything logged, in the text format (the global subscriber of this test binary).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> MakeWriter<'w> for Logs {
    type Writer = Logs;
    fn make_writer(&'w self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn installed() -> Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let log = config::Log {
                level: "warn".into(),
                format: config::LogFormat::Text,
            };
            let sub = daemon::logging::subscriber(&log, None, logs.clone(), false).unwrap();
            tracing::subscriber::set_global_default(sub).unwrap();
            logs
        })
        .clone()
    }

    fn lines_with(&self, words: &[&str]) -> usize {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .count()
    }
}

fn node_obj() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "uid": "n-1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.10"}]}})
}

fn svc(name: &str, vip: &str, created: &str, ports: Value, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "ns", "name": name, "uid": format!("uid-{name}"),
            "creationTimestamp": created, "annotations": annotations},
        "spec": {"type": "ClusterIP", "clusterIP": vip, "clusterIPs": [vip],
            "ipFamilies": ["IPv4"], "ports": ports}})
}

fn http() -> Value {
    json!([{"name": "http", "port": 80, "protocol": "TCP"}])
}

fn slice(svc: &str, ips: &[&str]) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "ns", "name": format!("{svc}-1"),
            "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints})
}

/// The source and the controller of one node, driven as the driver drives them.
struct Node {
    fake: FakeApi,
    ctl: Controller,
    flows: Arc<FlowTable>,
    models: Receiver<K8sModel>,
    status: Status,
    _source: SourceHandle,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start(fake: FakeApi) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let path = kubeconfig(dir.path(), fake.addr);
        let text = format!(
            "[node]\nname = \"node-a\"\n[dataplane]\nmode = \"nat\"\n[flowtable]\ncapacity = 4096\n\
             [kubernetes]\nkubeconfig = \"{}\"\nmin_sync_period = \"100ms\"\n",
            path.display()
        );
        let cfg = config::parse(&text, "t.toml").unwrap();
        let now = Instant::now();
        let flows = Arc::new(FlowTable::new(flow_table_config(&cfg), now).unwrap());
        let syn = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
        let ctl = Controller::new(
            cfg.clone(),
            Arc::clone(&flows),
            syn,
            L2Table::default(),
            now,
        );
        let (tx, models) = std::sync::mpsc::channel();
        let source = k8s::spawn(&cfg, move |m| {
            let _ = tx.send(m);
        })
        .unwrap();
        Node {
            fake,
            ctl,
            flows,
            models,
            status: Status::default(),
            _source: source,
            _dir: dir,
        }
    }

    /// Runs the controller until `done` holds: models in, a tick, publishes acknowledged.
    fn run_until(&mut self, what: &str, done: impl Fn(&Node) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(m) = self.models.recv_timeout(Duration::from_millis(20)) {
                self.ctl.handle(Instant::now(), Event::Model(Box::new(m)));
            }
            let sample = Sample {
                tx_frames: 0,
                workers_running: true,
            };
            self.ctl.tick(Instant::now(), sample);
            while let Some(a) = self.ctl.poll_action() {
                match a {
                    Action::Publish { snapshot, .. } => self.ctl.handle(
                        Instant::now(),
                        Event::Published {
                            generation: snapshot.generation,
                            steer_error: None,
                        },
                    ),
                    Action::Status(s) => self.status = s,
                    _ => {}
                }
            }
            if done(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {WAIT:?}; services {:?}, refused {:#?}",
                self.services(),
                self.status.refused
            );
        }
    }

    /// `/v1/services`' service names.
    fn services(&self) -> Vec<String> {
        let Some(snap) = self.ctl.snapshot() else {
            return Vec::new();
        };
        ServiceView::from_snapshot(snap, &*self.flows)
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    fn serves(&self, name: &str) -> bool {
        self.services().iter().any(|s| s == name)
    }

    /// `/v1/services`' refusals: (object, kind).
    fn refused(&self) -> Vec<(String, String)> {
        refused_views(&self.status)
            .into_iter()
            .map(|r| (r.object, r.kind))
            .collect()
    }

    fn metrics(&self) -> String {
        let stats = StatsView {
            refused: refused_stats(&self.status),
            ..StatsView::default()
        };
        render(&stats, &[], &ProbeCounts::default())
    }
}

#[test]
fn poisoned_services_block_only_themselves() {
    let logs = Logs::installed();
    let fake = FakeApi::start();
    fake.apply(node_obj());
    let dup = json!([{"name": "http", "port": 80, "protocol": "TCP"},
                     {"name": "http", "port": 81, "protocol": "TCP"}]);
    fake.apply(svc(
        "poison-dup",
        "198.18.100.2",
        "2024-01-01T00:00:00Z",
        dup,
        json!({}),
    ));
    let weights = json!({"xvs.io/scheduler": "wrr",
                         "xvs.io/weights": "10.0.0.1=1048576,10.0.0.2=1"});
    fake.apply(svc(
        "poison-wrr",
        "198.18.100.3",
        "2024-01-01T00:00:00Z",
        http(),
        weights,
    ));
    fake.apply(slice("poison-wrr", &["10.0.0.1", "10.0.0.2"]));
    // The canary, created after both.
    fake.apply(svc(
        "canary",
        "198.18.100.9",
        "2025-01-01T00:00:00Z",
        http(),
        json!({}),
    ));
    fake.apply(slice("canary", &["10.0.0.9"]));
    let mut node = Node::start(fake);
    node.run_until("the canary programmed, the poisons reported", |n| {
        n.serves("ns/canary:http") && n.status.refused.len() == 2
    });
    assert_eq!(node.services(), ["ns/canary:http"]);
    assert_eq!(
        node.refused(),
        [
            (
                "Service ns/poison-dup".to_owned(),
                "service_refused".to_owned()
            ),
            (
                "service ns/poison-wrr:http".to_owned(),
                "snapshot_build".to_owned()
            ),
        ]
    );
    let reasons: Vec<String> = refused_views(&node.status)
        .into_iter()
        .map(|r| r.reason)
        .collect();
    assert!(reasons[0].contains("both named \"http\""), "{}", reasons[0]);
    assert!(
        reasons[1].contains("wrr sequence of 1048577 entries exceeds 1048576"),
        "{}",
        reasons[1]
    );
    assert!(reasons[1].ends_with("not programmed"), "{}", reasons[1]);
    assert_eq!(node.status.pending_since, None, "nothing waits");
    let metrics = node.metrics();
    for line in [
        "xvs_refused{kind=\"service_refused\"} 1",
        "xvs_refused{kind=\"snapshot_build\"} 1",
        "xvs_refused_total{kind=\"service_refused\"} 1",
        "xvs_refused_total{kind=\"snapshot_build\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // Later changes of other Services are programmed too.
    node.fake.apply(svc(
        "canary-2",
        "198.18.100.10",
        "2025-01-02T00:00:00Z",
        http(),
        json!({}),
    ));
    node.fake.apply(slice("canary-2", &["10.0.0.10"]));
    node.run_until("a second canary", |n| n.serves("ns/canary-2:http"));
    assert_eq!(node.services(), ["ns/canary-2:http", "ns/canary:http"]);
    // Reported once per change: one log line each, counted once, whatever the syncs since.
    assert_eq!(
        logs.lines_with(&["Service ns/poison-dup", "service_refused"]),
        1
    );
    assert_eq!(
        logs.lines_with(&[
            "the snapshot builder refused a service",
            "ns/poison-wrr:http"
        ]),
        1
    );
    assert_eq!(node.status.refused_total["snapshot_build"], 1);
    assert_eq!(node.status.refused_total["service_refused"], 1);

    // Fixing one programs it; deleting the other clears its report.
    node.fake.apply(svc(
        "poison-dup",
        "198.18.100.2",
        "2024-01-01T00:00:00Z",
        http(),
        json!({}),
    ));
    node.run_until("the fixed one", |n| {
        n.serves("ns/poison-dup:http") && n.status.refused.len() == 1
    });
    node.fake.delete(Kind::Service, "ns", "poison-wrr");
    node.run_until("the deleted one's report cleared", |n| {
        n.status.refused.is_empty()
    });
    assert_eq!(
        node.services(),
        ["ns/canary-2:http", "ns/canary:http", "ns/poison-dup:http"]
    );
    assert!(
        node.metrics()
            .contains("xvs_refused{kind=\"snapshot_build\"} 0")
    );
    assert_eq!(node.status.refused_total["snapshot_build"], 1);
}
