//! Kubernetes objects from a file: what `kubectl get svc,endpointslices,nodes,servicecidrs
//! -A -o yaml` (or `-o json`) prints, for `xvs sim --objects`.
//!
//! Accepted: a JSON document, or a YAML stream of one or more documents (`---`); each
//! document is an object or a `List` (`items`, nested Lists too). Services (`v1`),
//! EndpointSlices (`discovery.k8s.io/v1`), Nodes (`v1`) and ServiceCIDRs
//! (`networking.k8s.io/v1`) are kept; other kinds are counted and skipped. An object of a
//! kept kind that does not parse is an error naming it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde_json::Value;

/// The objects of a dump.
#[derive(Debug, Default)]
pub struct Objects {
    /// The Services.
    pub services: Vec<Service>,
    /// The EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// The Nodes.
    pub nodes: Vec<Node>,
    /// The ServiceCIDRs.
    pub service_cidrs: Vec<ServiceCIDR>,
    /// Objects of other kinds, by `apiVersion/kind`, with their count.
    pub skipped: BTreeMap<String, usize>,
}

impl Objects {
    /// The Node named `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }
}

/// Why a dump could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Not JSON (it starts with `{` or `[`) that parses.
    #[error("not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Not YAML that parses.
    #[error("not valid YAML: {0}")]
    Yaml(#[from] serde_saphyr::Error),
    /// A document or list item that is not an object with `kind` and `apiVersion`.
    #[error("{at}: not a Kubernetes object (no kind/apiVersion)")]
    NotAnObject {
        /// Where: `document N`, `document N item M`.
        at: String,
    },
    /// An object of a kept kind that does not match its schema.
    #[error("{at}: {kind} {name}: {source}")]
    BadObject {
        /// Where in the file.
        at: String,
        /// Its kind.
        kind: &'static str,
        /// `namespace/name`.
        name: String,
        /// What did not match.
        source: serde_json::Error,
    },
    /// Nothing in the file.
    #[error("no Kubernetes objects in it")]
    Empty,
}

/// Reads a dump (see the module doc).
pub fn parse(text: &str) -> Result<Objects, DumpError> {
    let trimmed = text.trim_start();
    let docs: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        vec![serde_json::from_str(text)?]
    } else {
        serde_saphyr::from_multiple::<Value>(text)?
            .into_iter()
            .filter(|d| !d.is_null())
            .collect()
    };
    let mut out = Objects::default();
    let mut seen = 0usize;
    for (i, doc) in docs.into_iter().enumerate() {
        add(&mut out, doc, format!("document {}", i + 1), &mut seen)?;
    }
    if seen == 0 {
        return Err(DumpError::Empty);
    }
    Ok(out)
}

fn add(out: &mut Objects, v: Value, at: String, seen: &mut usize) -> Result<(), DumpError> {
    if let Value::Array(items) = v {
        // A bare JSON array of objects.
        for (j, item) in items.into_iter().enumerate() {
            add(out, item, format!("{at} item {}", j + 1), seen)?;
        }
        return Ok(());
    }
    let kind = v.get("kind").and_then(Value::as_str).map(str::to_owned);
    let api = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (Some(kind), Some(api)) = (kind, api) else {
        return Err(DumpError::NotAnObject { at });
    };
    if kind.ends_with("List") {
        if let Some(Value::Array(items)) = v.get("items") {
            for (j, item) in items.iter().enumerate() {
                add(out, item.clone(), format!("{at} item {}", j + 1), seen)?;
            }
        }
        return Ok(());
    }
    *seen += 1;
    let name = || {
        let m = v.get("metadata");
        let get = |k| m.and_then(|m| m.get(k)).and_then(Value::as_str);
        match get("namespace") {
            Some(ns) => format!("{ns}/{}", get("name").unwrap_or("?")),
            None => get("name").unwrap_or("?").to_owned(),
        }
    };
    macro_rules! keep {
        ($list:ident, $kind:literal) => {
            match serde_json::from_value(v.clone()) {
                Ok(o) => out.$list.push(o),
                Err(source) => {
                    return Err(DumpError::BadObject {
                        at,
                        kind: $kind,
                        name: name(),
                        source,
                    });
                }
            }
        };
    }
    match (api.as_str(), kind.as_str()) {
        ("v1", "Service") => keep!(services, "Service"),
        ("discovery.k8s.io/v1", "EndpointSlice") => keep!(slices, "EndpointSlice"),
        ("v1", "Node") => keep!(nodes, "Node"),
        ("networking.k8s.io/v1", "ServiceCIDR") => keep!(service_cidrs, "ServiceCIDR"),
        _ => *out.skipped.entry(format!("{api}/{kind}")).or_default() += 1,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML_LIST: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: ns}
  spec:
    clusterIP: 198.18.100.1
    ports: [{port: 80, protocol: TCP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-1
    namespace: ns
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  endpoints:
  - addresses: ["10.0.0.1"]
    nodeName: n1
  ports: [{port: 8080, protocol: TCP}]
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: x, namespace: ns}
metadata:
  resourceVersion: ""
"#;

    #[test]
    fn yaml_list_and_multi_document_stream() {
        let o = parse(YAML_LIST).unwrap();
        assert_eq!((o.services.len(), o.slices.len(), o.nodes.len()), (1, 1, 0));
        assert_eq!(o.skipped.get("v1/ConfigMap"), Some(&1));
        assert_eq!(
            o.slices[0].endpoints.as_ref().unwrap()[0]
                .node_name
                .as_deref(),
            Some("n1")
        );
        let stream = "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels: {topology.kubernetes.io/zone: zone-a}\n---\n"
            .to_owned()
            + YAML_LIST;
        let o = parse(&stream).unwrap();
        assert_eq!((o.services.len(), o.slices.len(), o.nodes.len()), (1, 1, 1));
        assert!(o.node("n1").is_some() && o.node("n2").is_none());
    }

    #[test]
    fn service_cidrs_are_kept() {
        let doc = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec:\n  cidrs: [198.18.96.0/20, \"2001:2:0:96::/112\"]\n";
        let o = parse(doc).unwrap();
        assert_eq!(o.service_cidrs.len(), 1);
        let cidrs = o.service_cidrs[0].spec.as_ref().unwrap().cidrs.clone();
        assert_eq!(cidrs.unwrap(), ["198.18.96.0/20", "2001:2:0:96::/112"]);
        assert!(o.skipped.is_empty(), "{:?}", o.skipped);
    }

    #[test]
    fn json_list() {
        let v: Value = serde_saphyr::from_str(YAML_LIST).unwrap();
        let o = parse(&serde_json::to_string_pretty(&v).unwrap()).unwrap();
        assert_eq!((o.services.len(), o.slices.len()), (1, 1));
        assert_eq!(o.services[0].metadata.name.as_deref(), Some("web"));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = parse("{\"kind\": ").unwrap_err().to_string();
        assert!(e.starts_with("not valid JSON"), "{e}");
        let e = parse("a: [1\n").unwrap_err().to_string();
        assert!(e.starts_with("not valid YAML"), "{e}");
        let e = parse("just: a map\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "document 1: not a Kubernetes object (no kind/apiVersion)"
        );
        let bad = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec:\n  ports: 7\n";
        let e = parse(bad).unwrap_err().to_string();
        assert!(e.starts_with("document 1: Service ns/web: "), "{e}");
        assert_eq!(
            parse("").unwrap_err().to_string(),
            "no Kubernetes objects in it"
        );
        let e = parse("apiVersion: v1\nkind: List\nitems: []\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "no Kubernetes objects in it");
    }
}
