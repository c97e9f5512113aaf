//! `[health]` and a service's own `health`, and `[admin] metrics_listen`: defaults, values,
//! refusals with their key, line and column.

use super::*;

const SERVICE: &str = r#"
[dataplane]
mode = "nat"

[[services]]
name = "web"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.1.1:8080" }]
"#;

/// The single problem of an invalid text.
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

fn with_service_health(keys: &str) -> String {
    format!("{SERVICE}health = {{ {keys} }}\n")
}

#[test]
fn a_service_takes_its_own_health_keys_and_the_rest_from_health() {
    let c = parse(SERVICE, "t.toml").unwrap();
    assert_eq!(c.services[0].health, ServiceHealth::default());
    assert!(c.health.http_status.is_empty(), "any 2xx or 3xx by default");
    let text = with_service_health(
        r#"probe = "https", port = 8443, http_path = "/ready", http_status = [200, 204], rise = 1, fall = 5"#,
    ) + "\n[health]\nprobe = \"tcp\"\nhttp_status = [200]\n";
    let c = parse(&text, "t.toml").unwrap();
    let h = &c.services[0].health;
    assert_eq!(h.probe, Some(ProbeKind::Https));
    assert_eq!(h.port, Some(8443));
    assert_eq!(h.http_path.as_deref(), Some("/ready"));
    assert_eq!(h.http_status.as_deref(), Some(&[200, 204][..]));
    assert_eq!((h.rise, h.fall), (Some(1), Some(5)));
    assert_eq!(c.health.http_status, vec![200]);
    // The table form is the same key.
    let c = parse(
        &(SERVICE.to_owned() + "[services.health]\nprobe = \"none\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.services[0].health.probe, Some(ProbeKind::None));
    for k in ProbeKind::ALL {
        assert_eq!(ProbeKind::from_name(k.name()), Some(k));
    }
    assert_eq!(ProbeKind::from_name("HTTPS"), None);
}

#[test]
fn bad_health_values_are_refused_naming_the_key() {
    for (keys, key, says) in [
        ("port = 0", "services[0].health.port", "port 0"),
        (
            r#"http_path = "ready""#,
            "services[0].health.http_path",
            "must start with '/'",
        ),
        (
            r#"http_path = "/a b""#,
            "services[0].health.http_path",
            "only visible ASCII",
        ),
        (
            "http_status = [200, 600]",
            "services[0].health.http_status",
            "600 is not an HTTP status",
        ),
        (
            "http_status = []",
            "services[0].health.http_status",
            "an empty list takes no status",
        ),
        ("rise = 0", "services[0].health.rise", "at least 1"),
        ("fall = 0", "services[0].health.fall", "at least 1"),
    ] {
        let p = problem(&with_service_health(keys));
        assert_eq!(p.key, key, "{keys}: {}", p.message);
        assert!(p.message.contains(says), "{keys}: {}", p.message);
        assert_eq!(p.line, 11, "{keys}: the service's health line");
    }
    let p = problem(&with_service_health(r#"probe = "grpc""#));
    assert!(p.message.contains("grpc"), "{}", p.message);
    let p = problem(&with_service_health("interval = \"1s\""));
    assert!(
        p.message.contains("interval"),
        "[health]'s alone: {}",
        p.message
    );
    for (keys, key, says) in [
        (
            "http_status = [99]",
            "health.http_status",
            "99 is not an HTTP status",
        ),
        (
            "http_path = \"/x\\r\\nX-Evil: 1\"",
            "health.http_path",
            "only visible ASCII",
        ),
    ] {
        let p = problem(&format!("{SERVICE}\n[health]\n{keys}\n"));
        assert_eq!(p.key, key, "{keys}: {}", p.message);
        assert!(p.message.contains(says), "{keys}: {}", p.message);
    }
}

#[test]
fn the_metrics_listener_needs_an_address_of_its_own() {
    let with = |admin: &str| SERVICE.to_owned() + "\n[admin]\n" + admin;
    let c = parse(SERVICE, "t.toml").unwrap();
    assert_eq!(c.admin.metrics_listen, None, "off by default");
    let c = parse(
        &with("listen = \"127.0.0.1:10268\"\nmetrics_listen = \"0.0.0.0:10269\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.admin.metrics_listen.unwrap().to_string(), "0.0.0.0:10269");
    for (admin, names) in [
        // Equal to listen: it would serve listen's endpoints.
        (
            "listen = \"127.0.0.1:10269\"\nmetrics_listen = \"127.0.0.1:10269\"\n",
            "admin.listen",
        ),
        // The wildcard over listen's address and port.
        (
            "listen = \"127.0.0.1:10269\"\nmetrics_listen = \"0.0.0.0:10269\"\n",
            "admin.listen",
        ),
        // The healthz listener's (default 0.0.0.0:10256).
        (
            "metrics_listen = \"198.18.0.10:10256\"\n",
            "admin.healthz_listen",
        ),
    ] {
        let p = problem(&with(admin));
        assert_eq!(p.key, "admin.metrics_listen", "{}", p.message);
        assert!(
            p.message.contains(&format!("overlaps {names}")),
            "{}",
            p.message
        );
    }
    // Another family, or another port, is fine.
    parse(
        &with("listen = \"127.0.0.1:10269\"\nmetrics_listen = \"[::]:10269\"\n"),
        "t.toml",
    )
    .unwrap();
}
