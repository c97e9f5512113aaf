//! The keys of rejects and Service CIDRs: `[dataplane] reject_rate`, `reject_burst`,
//! `[kubernetes] service_cidrs`.

use super::*;

const K8S: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]

[node]
addresses = ["198.18.10.1"]

[kubernetes]
"#;

fn problem(text: &str) -> Problem {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => {
            let p = e.problems();
            assert_eq!(p.len(), 1, "expected one problem, got: {e}");
            p[0].clone()
        }
    }
}

#[test]
fn reject_rate_and_burst_default_to_the_kernels_and_burst_0_is_refused() {
    let c = parse(K8S, "t.toml").unwrap();
    assert_eq!(
        (c.dataplane.reject_rate, c.dataplane.reject_burst),
        (1000, 50)
    );
    let text = K8S.replace(
        "[dataplane]\n",
        "[dataplane]\nreject_rate = 0\nreject_burst = 7\n",
    );
    let c = parse(&text, "t.toml").unwrap();
    assert_eq!((c.dataplane.reject_rate, c.dataplane.reject_burst), (0, 7));
    let p = problem(&K8S.replace("[dataplane]\n", "[dataplane]\nreject_burst = 0\n"));
    assert_eq!(p.key, "dataplane.reject_burst", "{}", p.message);
    // A restart-only key, as every [dataplane] key.
    let a = parse(K8S, "t.toml").unwrap();
    let b = parse(&text, "t.toml").unwrap();
    assert_eq!(
        a.dataplane.differences(&b.dataplane),
        ["dataplane.reject_rate", "dataplane.reject_burst"]
    );
}

#[test]
fn service_cidrs_parse_and_may_not_hold_the_nodes_addresses() {
    let c = parse(
        &format!("{K8S}service_cidrs = [\"198.18.96.0/20\", \"2001:2:0:96::/112\"]\n"),
        "t.toml",
    )
    .unwrap();
    let k = c.kubernetes.unwrap();
    assert_eq!(k.service_cidrs.len(), 2);
    assert!(k.service_cidrs[0].contains("198.18.100.1".parse().unwrap()));
    for (cidr, holds) in [
        ("198.18.10.0/24", "198.18.10.1"),
        ("198.18.0.0/16", "198.18."),
    ] {
        let p = problem(&format!("{K8S}service_cidrs = [\"{cidr}\"]\n"));
        assert_eq!(p.key, "kubernetes.service_cidrs[0]", "{}", p.message);
        assert!(p.message.contains(holds), "{}", p.message);
    }
    let p = problem(&format!("{K8S}service_cidrs = [\"198.18.96.1/20\"]\n"));
    assert!(p.message.contains("past the prefix"), "{}", p.message);
    let many: Vec<String> = (0..=SERVICE_CIDRS_MAX)
        .map(|i| format!("\"10.{i}.0.0/16\""))
        .collect();
    let p = problem(&format!("{K8S}service_cidrs = [{}]\n", many.join(", ")));
    assert_eq!(p.key, "kubernetes.service_cidrs", "{}", p.message);
}
