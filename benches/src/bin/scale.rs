//! Kubernetes scale benchmark: prints `key=value` lines.
//!
//! Generates `--services` Services (ClusterIP with one TCP port; every 10th a NodePort, every
//! 20th a LoadBalancer with an ingress IP) and one EndpointSlice each with `--endpoints` ready
//! endpoints (pod IPs in 10.128.0.0/9; nothing is sent), as k8s-openapi objects shaped like
//! an API server's (labels, targetRefs, zones, nodeNames). Then, in process, through the code
//! the daemon runs (the Kubernetes source's [`IncrementalModel`] → `SnapshotBuilder::build` →
//! `ArcSwap::store`):
//!
//! - `first_snapshot_ms`: from every object listed (what the source holds at `InitDone`) to the
//!   first snapshot published: the model takes the lists, translates every Service, the
//!   source's copy of the model for its callback is made, the snapshot built and stored.
//! - `translate_ms` (lists taken, every Service translated and merged), `handoff_ms` (the
//!   model copy), `build_ms` (`SnapshotBuilder::build`): the parts of it.
//! - `rss_mb`: VmRSS after the first snapshot (objects, model, snapshot, builder state);
//!   `peak_rss_mb`: VmHWM at the end.
//! - `change_publish_ms_p50` / `_max`: one EndpointSlice change (an endpoint added, removed
//!   or made not ready, in turn, on random Services) applied to the model until the new
//!   snapshot is stored, including the model copy the source hands to its callback.
//!   `min_sync_period` is not included (it is a wait, not work). Over `--changes` changes.
//! - `change_translate_ms_p50`, `change_handoff_ms_p50`, `change_build_ms_p50` / `_max`:
//!   the parts of those: the model update (the slice applied, its Service translated, the
//!   sorted spec list patched), the model copy, `SnapshotBuilder::build`.
//! - `service_churn_publish_ms_p50` / `_max`: a new Service (with its slice) or the removal
//!   of one, in turn: the case that shifts every later spec's position.
//!
//! Targets (issue 8): first snapshot ≤ 2000 ms, a one-Service change ≤ 5 ms, memory ≤ 300 MB.
//!
//! Run with `cargo run --release -p benches --bin scale -- --services 10000 --endpoints 10`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use clap::Parser;
use config::{Config, Dur, Kubernetes, SchedulerKind};
use fastpath::snapshot::{L2Table, Snapshot, SnapshotBuilder};
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, ObjectReference, Service, ServicePort,
    ServiceSpec as K8sServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use slowpath::k8s::{IncrementalModel, K8sModel, LABEL_SERVICE_NAME, NodeInfo};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Kubernetes scale benchmark (key=value output)")]
struct Args {
    /// Services to generate.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Ready endpoints per Service (one EndpointSlice each).
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    /// EndpointSlice changes to time.
    #[arg(long, default_value_t = 50)]
    changes: usize,
    /// Service additions/removals to time.
    #[arg(long, default_value_t = 20)]
    churn: usize,
}

const NODES: usize = 50;

fn main() {
    let args = Args::parse();
    let cfg = config(&args);
    let node = NodeInfo {
        name: "node-0".to_owned(),
        zone: Some("zone-a".to_owned()),
        addresses: vec![IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10))],
        own: Vec::new(),
    };
    let services: Vec<Arc<Service>> = (0..args.services).map(|i| Arc::new(service(i))).collect();
    let slices: Vec<Arc<EndpointSlice>> = (0..args.services)
        .map(|i| Arc::new(slice(i, args.endpoints)))
        .collect();

    // The first snapshot.
    let mut model = IncrementalModel::new(&cfg, node);
    let mut builder = SnapshotBuilder::from_config(&cfg);
    let l2 = L2Table::default();
    let current = ArcSwap::from_pointee(builder.build(&[], &l2).expect("empty snapshot"));
    let t0 = Instant::now();
    model.replace_services(services.iter().cloned());
    model.replace_slices(slices.iter().cloned());
    let p = publish(&mut model, &mut builder, &l2, &current);
    let first = t0.elapsed();
    let (published, translate, handoff, build) = (
        p.model,
        t0.elapsed() - p.handoff - p.build,
        p.handoff,
        p.build,
    );
    let rss = status_mb("VmRSS:");
    let specs = published.specs.len();
    let backends: usize = published.specs.iter().map(|s| s.backends.len()).sum();
    assert_eq!(current.load().services.len(), specs);
    drop(published);

    // EndpointSlice changes.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut slices = slices;
    let mut change = Vec::with_capacity(args.changes);
    let mut change_build = Vec::with_capacity(args.changes);
    let mut change_translate = Vec::with_capacity(args.changes);
    let mut change_handoff = Vec::with_capacity(args.changes);
    for k in 0..args.changes {
        let i = rng.below(slices.len());
        let mut s = (*slices[i]).clone();
        edit(&mut s, k, i, &mut rng);
        let s = Arc::new(s);
        slices[i] = s.clone();
        let t = Instant::now();
        model.apply_slice(s);
        let p = publish(&mut model, &mut builder, &l2, &current);
        change.push(t.elapsed());
        change_build.push(p.build);
        change_translate.push(p.translate);
        change_handoff.push(p.handoff);
        assert_eq!(model.last_translated(), 1);
    }

    // Services coming and going (every later spec moves by one place).
    let mut churn = Vec::with_capacity(args.churn);
    let mut removed = std::collections::HashSet::new();
    for k in 0..args.churn {
        let t;
        if k % 2 == 0 {
            let i = args.services + k;
            let (svc, sl) = (Arc::new(service(i)), Arc::new(slice(i, args.endpoints)));
            t = Instant::now();
            model.apply_service(svc);
            model.apply_slice(sl);
        } else {
            let mut i = rng.below(args.services);
            while !removed.insert(i) {
                i = rng.below(args.services);
            }
            let s = &services[i];
            let (ns, name) = (
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            );
            t = Instant::now();
            model.delete_service(&ns, &name);
            model.delete_slice(&ns, &format!("{name}-x7k2p"));
        }
        publish(&mut model, &mut builder, &l2, &current);
        churn.push(t.elapsed());
    }

    let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
    println!("services={}", args.services);
    println!("endpoints_per_service={}", args.endpoints);
    println!("specs={specs}");
    println!("backends={backends}");
    println!("first_snapshot_ms={}", ms(first));
    println!("translate_ms={}", ms(translate));
    println!("handoff_ms={}", ms(handoff));
    println!("build_ms={}", ms(build));
    println!("rss_mb={rss:.1}");
    if !change.is_empty() {
        println!("change_publish_ms_p50={}", ms(median(&mut change)));
        println!("change_publish_ms_max={}", ms(max(&change)));
        println!(
            "change_translate_ms_p50={}",
            ms(median(&mut change_translate))
        );
        println!("change_handoff_ms_p50={}", ms(median(&mut change_handoff)));
        println!("change_build_ms_p50={}", ms(median(&mut change_build)));
        println!("change_build_ms_max={}", ms(max(&change_build)));
    }
    if !churn.is_empty() {
        println!("service_churn_publish_ms_p50={}", ms(median(&mut churn)));
        println!("service_churn_publish_ms_max={}", ms(max(&churn)));
    }
    println!("peak_rss_mb={:.1}", status_mb("VmHWM:"));
}

/// What the daemon does with a model: the source brings it up to date (`translate`) and
/// copies it for its callback (`handoff`), the builder builds a snapshot (`build`), and it
/// is stored for the workers.
struct Published {
    model: K8sModel,
    translate: Duration,
    handoff: Duration,
    build: Duration,
}

fn publish(
    model: &mut IncrementalModel,
    builder: &mut SnapshotBuilder,
    l2: &L2Table,
    current: &ArcSwap<Snapshot>,
) -> Published {
    let t = Instant::now();
    let up_to_date = model.model();
    let translate = t.elapsed();
    let t = Instant::now();
    let m: K8sModel = up_to_date.clone();
    let handoff = t.elapsed();
    let t = Instant::now();
    let snap = builder.build(&m.specs, l2).expect("snapshot");
    let build = t.elapsed();
    current.store(Arc::new(snap));
    Published {
        model: m,
        translate,
        handoff,
        build,
    }
}

fn config(args: &Args) -> Config {
    let mut cfg = Config {
        kubernetes: Some(Kubernetes {
            kubeconfig: None,
            service_proxy_name: None,
            min_sync_period: Dur(Duration::from_secs(1)),
            sync_period: Dur(Duration::from_secs(30)),
            default_scheduler: SchedulerKind::Rr,
            external_ip_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
        }),
        ..Config::default()
    };
    // Every backend needs an id; leave room for churn.
    let need = (args.services + args.churn) * (args.endpoints + 1) * 2;
    cfg.flowtable.backends_max = cfg
        .flowtable
        .backends_max
        .max(u32::try_from(need).unwrap_or(u32::MAX));
    cfg
}

fn ns(i: usize) -> String {
    format!("team-{:03}", i % 200)
}

/// Service `i`: ClusterIP 10.96.0.0/12; every 10th a NodePort, every 20th (offset 5) a
/// LoadBalancer with an ingress IP in 198.19.0.0/16.
fn service(i: usize) -> Service {
    let ip = |base: u32, n: usize| Ipv4Addr::from(base + n as u32 + 1).to_string();
    let cluster_ip = ip(0x0a60_0000, i);
    let kind = match i % 20 {
        0 | 10 => "NodePort",
        5 => "LoadBalancer",
        _ => "ClusterIP",
    };
    let node_port = (kind != "ClusterIP").then_some(30000 + (i / 5 % 2768) as i32);
    let mut labels = BTreeMap::new();
    labels.insert("app.kubernetes.io/name".to_owned(), format!("app-{i}"));
    labels.insert("app.kubernetes.io/part-of".to_owned(), ns(i));
    let mut selector = BTreeMap::new();
    selector.insert("app.kubernetes.io/name".to_owned(), format!("app-{i}"));
    Service {
        metadata: ObjectMeta {
            namespace: Some(ns(i)),
            name: Some(format!("svc-{i}")),
            uid: Some(format!("6b1c0f4e-0000-4000-8000-{i:012}")),
            resource_version: Some((1000 + i).to_string()),
            creation_timestamp: Some(Time(
                Timestamp::from_second(1_700_000_000 + i as i64).expect("timestamp"),
            )),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(K8sServiceSpec {
            type_: Some(kind.to_owned()),
            cluster_ip: Some(cluster_ip.clone()),
            cluster_ips: Some(vec![cluster_ip]),
            ip_families: Some(vec!["IPv4".to_owned()]),
            ip_family_policy: Some("SingleStack".to_owned()),
            internal_traffic_policy: Some("Cluster".to_owned()),
            external_traffic_policy: (kind != "ClusterIP").then(|| "Cluster".to_owned()),
            session_affinity: Some("None".to_owned()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port: 80,
                protocol: Some("TCP".to_owned()),
                target_port: Some(IntOrString::Int(8080)),
                node_port,
                ..ServicePort::default()
            }]),
            ..K8sServiceSpec::default()
        }),
        status: (kind == "LoadBalancer").then(|| ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(ip(0xc613_0000, i)),
                    ip_mode: Some("VIP".to_owned()),
                    ..LoadBalancerIngress::default()
                }]),
            }),
            ..ServiceStatus::default()
        }),
    }
}

/// Pod address `j` of Service `i` (10.128.0.0/9).
fn pod_ip(i: usize, j: usize) -> String {
    Ipv4Addr::from(0x0a80_0000 + (i * 64 + j) as u32).to_string()
}

fn endpoint(i: usize, j: usize, ready: bool) -> Endpoint {
    let node = (i + j) % NODES;
    Endpoint {
        addresses: vec![pod_ip(i, j)],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(ready),
            terminating: Some(false),
        }),
        node_name: Some(format!("node-{node}")),
        zone: Some(format!("zone-{}", (b'a' + (node % 3) as u8) as char)),
        hints: Some(EndpointHints {
            for_zones: Some(vec![ForZone {
                name: format!("zone-{}", (b'a' + (node % 3) as u8) as char),
            }]),
            ..EndpointHints::default()
        }),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".to_owned()),
            namespace: Some(ns(i)),
            name: Some(format!("app-{i}-7d9f8c6b5-{j:05}")),
            uid: Some(format!("0f3a9c2e-0000-4000-8000-{:012}", i * 64 + j)),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

fn slice(i: usize, endpoints: usize) -> EndpointSlice {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_SERVICE_NAME.to_owned(), format!("svc-{i}"));
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".to_owned(),
        "endpointslice-controller.k8s.io".to_owned(),
    );
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some(ns(i)),
            name: Some(format!("svc-{i}-x7k2p")),
            uid: Some(format!("9d2e7b1a-0000-4000-8000-{i:012}")),
            resource_version: Some((500_000 + i).to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".to_owned(),
        endpoints: Some((0..endpoints).map(|j| endpoint(i, j, true)).collect()),
        ports: Some(vec![EndpointPort {
            name: Some("http".to_owned()),
            port: Some(8080),
            protocol: Some("TCP".to_owned()),
            ..EndpointPort::default()
        }]),
    }
}

/// Change `k` to slice `s` of Service `i`: an endpoint added, removed, or made not ready.
fn edit(s: &mut EndpointSlice, k: usize, i: usize, rng: &mut Rng) {
    let bump = |s: &mut EndpointSlice| {
        let rv: u64 = s
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        s.metadata.resource_version = Some((rv + 1_000_000).to_string());
    };
    bump(s);
    let eps = s.endpoints.get_or_insert_with(Vec::new);
    match k % 3 {
        0 if eps.len() < 60 => {
            let j = eps.len() + 1;
            eps.push(endpoint(i, j, true));
        }
        1 if eps.len() > 1 => {
            let j = rng.below(eps.len());
            eps.remove(j);
        }
        _ => {
            let j = rng.below(eps.len());
            if let Some(c) = eps.get_mut(j).and_then(|e| e.conditions.as_mut()) {
                let ready = !c.ready.unwrap_or(true);
                c.ready = Some(ready);
                c.serving = Some(ready);
            }
        }
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn max(v: &[Duration]) -> Duration {
    v.iter().copied().max().unwrap_or_default()
}

/// A `/proc/self/status` field in MB (kB / 1024).
fn status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// xorshift64*: deterministic choices, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}
