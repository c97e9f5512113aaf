//! Keeps the README and `docs/` true to the code, as `tests/architecture.rs` does for
//! ARCHITECTURE.md: the README stays a front door (the two commands first, at most 200
//! lines, every page linked), every link and anchor resolves, the configuration key list is
//! the loader's (derived from `xvs check`'s own "expected one of" answers, so a new key
//! fails here until it is listed, and in `config/examples/edge-node.toml`), every
//! `` `[table] key` `` the pages name exists, every command of `xvs --help` is in
//! docs/cli.md and every `` `xvs COMMAND` `` the pages name exists, and every metric family
//! of docs/metrics.md is one the code writes (the other direction, every exported family
//! documented, is `slowpath/tests/admin_metrics_parsers.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// README.md, ARCHITECTURE.md and every page of docs/, as (path, text).
fn pages() -> Vec<(String, String)> {
    let mut out = vec![
        ("README.md".to_owned(), read("README.md")),
        ("ARCHITECTURE.md".to_owned(), read("ARCHITECTURE.md")),
    ];
    let mut docs: Vec<_> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 7, "docs/ has too few pages: {docs:?}");
    for d in docs {
        let rel = format!("docs/{d}");
        let text = read(&rel);
        out.push((rel, text));
    }
    out
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The spans between backticks of `text` (outside code blocks).
fn code_spans(text: &str) -> Vec<String> {
    prose(text)
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to
/// dashes.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// Every markdown link target `](target)` of `text` (outside code blocks).
fn links(text: &str) -> Vec<String> {
    let p = prose(text);
    let mut out = Vec::new();
    let mut rest = p.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = read("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() <= 200,
        "README.md has {} lines; it should be at most 200 (the rest belongs in docs/)",
        lines.len()
    );
    // The two commands of a fresh machine come first: the demo, then the tests.
    assert_eq!(
        lines[0], "```sh",
        "README.md must open with the two commands"
    );
    assert!(lines[1].starts_with("scripts/demo "), "{}", lines[1]);
    assert!(lines[2].starts_with("scripts/test "), "{}", lines[2]);
    assert_eq!(lines[3], "```");
    assert!(root().join("scripts/demo").exists() && root().join("scripts/test").exists());
    for (page, _) in pages().iter().filter(|(p, _)| p.starts_with("docs/")) {
        assert!(
            readme.contains(&format!("]({page})")),
            "README.md does not link {page}"
        );
    }
    for heading in ["Requirements", "Quick start"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("## ") && l.contains(heading)),
            "README.md has no {heading} section"
        );
    }
}

#[test]
fn every_link_and_anchor_resolves() {
    let all: BTreeMap<String, String> = pages().into_iter().collect();
    let mut broken = Vec::new();
    for (page, text) in &all {
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        for target in links(text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                PathBuf::from(page)
            } else {
                normalize(&dir.join(path))
            };
            let key = file.to_string_lossy().into_owned();
            if !root().join(&file).exists() {
                broken.push(format!("{page}: ({target}): no file {key}"));
                continue;
            }
            if !anchor.is_empty() {
                let text = all.get(&key).cloned().unwrap_or_else(|| read(&key));
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{page}: ({target}): no heading #{anchor} in {key}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `docs/../README.md` as `README.md` (no file system access: the path may not exist).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What the loader accepts in each table, from `xvs check`'s answer to an unknown key
/// (``unknown key `zz...`: expected one of `a`, `b` `` / ``expected `a` or `b` ``).
fn loader_keys() -> BTreeMap<String, BTreeSet<String>> {
    const Z: &str = "zzzzzzzzzzzzzzzzzzzzzzzz";
    let probes: &[(&str, String)] = &[
        ("[node]", format!("[node]\n{Z} = 1\n")),
        ("[dataplane]", format!("[dataplane]\n{Z} = 1\n")),
        (
            "[dataplane] interfaces[]",
            format!("[dataplane]\ninterfaces = [{{ {Z} = 1 }}]\n"),
        ),
        ("[flowtable]", format!("[flowtable]\n{Z} = 1\n")),
        ("[timeouts]", format!("[timeouts]\n{Z} = 1\n")),
        ("[synproxy]", format!("[synproxy]\n{Z} = 1\n")),
        ("[sync]", format!("[sync]\n{Z} = 1\n")),
        (
            "[sync] peers[]",
            format!("[sync]\npeers = [{{ {Z} = 1 }}]\n"),
        ),
        ("[kubernetes]", format!("[kubernetes]\n{Z} = 1\n")),
        ("[admin]", format!("[admin]\n{Z} = 1\n")),
        ("[log]", format!("[log]\n{Z} = 1\n")),
        ("[health]", format!("[health]\n{Z} = 1\n")),
        ("[bgp]", format!("[bgp]\n{Z} = 1\n")),
        (
            "[bgp] neighbors[]",
            format!("[bgp]\nneighbors = [{{ {Z} = 1 }}]\n"),
        ),
        ("[[services]]", format!("[[services]]\n{Z} = 1\n")),
        (
            "[[services]] backends[]",
            format!("[[services]]\nbackends = [{{ {Z} = 1 }}]\n"),
        ),
        (
            "[[services]] health",
            format!("[[services]]\nhealth = {{ {Z} = 1 }}\n"),
        ),
        ("[[neighbours]]", format!("[[neighbours]]\n{Z} = 1\n")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut out = BTreeMap::new();
    for (table, text) in probes {
        let f = dir.path().join("k.toml");
        std::fs::write(&f, text).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_xvs"))
            .arg("check")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let marker = format!("unknown key `{Z}`: expected ");
        let list = err
            .split_once(&marker)
            .unwrap_or_else(|| panic!("{table}: no key list in {err}"))
            .1
            .lines()
            .next()
            .unwrap();
        let keys: BTreeSet<String> = list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        assert!(!keys.is_empty(), "{table}: {err}");
        out.insert((*table).to_owned(), keys);
    }
    // Every top-level table is probed above.
    let f = dir.path().join("k.toml");
    std::fs::write(&f, format!("{Z} = 1\n")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .arg("check")
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let top: BTreeSet<String> = err
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("no top-level list in {err}"))
        .1
        .lines()
        .next()
        .unwrap()
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let probed: BTreeSet<String> = out
        .keys()
        .filter(|t| !t.contains(' '))
        .map(|t| t.trim_matches(['[', ']']).to_owned())
        .collect();
    assert_eq!(probed, top, "a top-level table this test does not probe");
    out
}

/// The "Every key" table of docs/configuration.md.
fn documented_keys() -> BTreeMap<String, BTreeSet<String>> {
    let text = read("docs/configuration.md");
    let section = text
        .split_once("## Every key")
        .expect("docs/configuration.md has no \"## Every key\" section")
        .1;
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `[")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let table = cells[1].trim_matches('`').to_owned();
        let keys = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        out.insert(table, keys);
    }
    out
}

#[test]
fn the_key_list_is_the_loaders_and_the_example_documents_every_key() {
    let loader = loader_keys();
    assert_eq!(
        documented_keys(),
        loader,
        "docs/configuration.md's \"Every key\" table differs from what the loader accepts"
    );
    // edge-node.toml: each key, set or commented out, in its table's part of the file.
    let example = read("config/examples/edge-node.toml");
    let mut parts: BTreeMap<String, String> = BTreeMap::new();
    let mut current = String::new();
    for line in example.lines() {
        let bare = line.trim_start_matches('#').trim();
        if bare.starts_with('[') && bare.ends_with(']') && !bare.contains('=') {
            current = bare.to_owned();
        }
        let part = parts.entry(current.clone()).or_default();
        part.push_str(line);
        part.push('\n');
    }
    let mut missing = Vec::new();
    for (table, keys) in &loader {
        let top = table.split(' ').next().unwrap();
        let part = parts.get(top).map(String::as_str).unwrap_or("");
        for key in keys {
            let set = part.lines().any(|l| {
                let l = l.trim_start_matches('#').trim_start();
                l.starts_with(&format!("{key} ="))
                    || l.contains(&format!("{{ {key} ="))
                    || l.contains(&format!(", {key} ="))
            });
            if !set {
                missing.push(format!("{table} {key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "config/examples/edge-node.toml does not document: {missing:?}"
    );
}

#[test]
fn every_key_the_pages_name_exists() {
    let loader = loader_keys();
    let mut unknown = Vec::new();
    // ARCHITECTURE.md speaks of Cargo's tables too (`[lib] name`); the user's pages only
    // of xvs's.
    for (page, text) in pages().into_iter().filter(|(p, _)| p != "ARCHITECTURE.md") {
        for span in code_spans(&text) {
            // `[table] key`, `[table] key = value`, `[[services]] key`
            let Some(rest) = span.strip_prefix('[') else {
                continue;
            };
            let Some((table, after)) = rest.split_once("] ") else {
                continue;
            };
            let table = table.trim_start_matches('[').trim_end_matches(']');
            let key: String = after
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if key.is_empty() || !table.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                continue;
            }
            let known = loader
                .iter()
                .filter(|(t, _)| t.split(' ').next().unwrap().trim_matches(['[', ']']) == table)
                .any(|(_, keys)| keys.contains(&key));
            let table_known = loader
                .keys()
                .any(|t| t.split(' ').next().unwrap().trim_matches(['[', ']']) == table);
            if !table_known || !known {
                unknown.push(format!("{page}: `{span}`"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "keys the docs name that the loader does not know:\n{}",
        unknown.join("\n")
    );
}

/// The subcommands of `xvs --help`.
fn subcommands() -> BTreeSet<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let list = help
        .split_once("Commands:\n")
        .expect("xvs --help lists no commands")
        .1
        .split("\n\n")
        .next()
        .unwrap();
    let cmds: BTreeSet<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect();
    assert!(cmds.contains("run") && cmds.contains("check"), "{cmds:?}");
    cmds
}

#[test]
fn every_command_is_documented_and_every_documented_command_exists() {
    let cmds = subcommands();
    let cli = read("docs/cli.md");
    for c in &cmds {
        assert!(
            cli.contains(&format!("`xvs {c}")),
            "docs/cli.md does not document `xvs {c}`"
        );
    }
    let mut unknown = Vec::new();
    for (page, text) in pages() {
        for span in code_spans(&text) {
            let Some(rest) = span.strip_prefix("xvs ") else {
                continue;
            };
            let word = rest.split_whitespace().next().unwrap_or("");
            if word.starts_with('-') || word.is_empty() {
                continue;
            }
            if word.chars().all(|c| c.is_ascii_lowercase()) && !cmds.contains(word) {
                unknown.push(format!("{page}: `{span}`"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "commands the docs name that `xvs --help` does not list:\n{}",
        unknown.join("\n")
    );
}

/// Every string literal of the product sources that names a metric family (or a `# TYPE`
/// line written by hand), with the `{...}` of a `format!` as a wildcard.
fn metric_patterns() -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "tests" {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for marker in ["\"xvs_", "# TYPE xvs_"] {
                    let mut rest = text.as_str();
                    while let Some(i) = rest.find(marker) {
                        rest = &rest[i + marker.len() - 4..];
                        let lit: String = rest
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || "_{}".contains(*c))
                            .collect();
                        out.push(lit);
                    }
                }
            }
        }
    }
    out
}

/// `name` matches `pattern`, each `{...}` of which stands for one or more characters.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.find('{') {
        None => pattern == name,
        Some(i) => {
            let (head, tail) = (&pattern[..i], &pattern[i..]);
            let after = tail.find('}').map_or("", |j| &tail[j + 1..]);
            name.starts_with(head)
                && (head.len() + 1..=name.len()).any(|k| matches(after, &name[k..]))
        }
    }
}

#[test]
fn every_documented_metric_is_written_by_the_code() {
    let text = read("docs/metrics.md");
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split_once("` |"))
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("xvs_"))
        .collect();
    assert!(families.len() > 80, "{families:?}");
    let patterns = metric_patterns();
    let unknown: Vec<&&str> = families
        .iter()
        .filter(|f| {
            !patterns.iter().any(|p| {
                matches(p, f)
                    || f.strip_suffix("_total").is_some_and(|b| matches(p, b))
                    || p.strip_suffix("_total").is_some_and(|b| matches(b, f))
            })
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/metrics.md documents families no source writes: {unknown:?}"
    );
}

#[test]
fn the_matcher_and_slugs_work() {
    assert!(matches("xvs_service_{}_total", "xvs_service_bytes_total"));
    assert!(!matches("xvs_service_{}_total", "xvs_service__total"));
    assert!(!matches("xvs_a", "xvs_b"));
    assert_eq!(
        slug("Replaying captures (`xvs pcap`)"),
        "replaying-captures-xvs-pcap"
    );
    assert_eq!(slug("Bare metal: systemd"), "bare-metal-systemd");
    assert_eq!(
        links("see [a](b.md#c) and `[x](y)`\n```\n[z](w)\n```\n"),
        ["b.md#c", "y"]
    );
}
