//! `ARCHITECTURE.md` stays true to the code: every repository path it names exists, every
//! workspace crate is in its crate table, and the table's arrows (each crate's workspace
//! dependencies) are the ones the `Cargo.toml` files declare.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn doc() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md at the root")
}

/// Every `backticked` span of `text`, outside fenced code blocks.
fn code_spans(text: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            spans.push(inside.to_owned());
        }
    }
    spans
}

const FILE_ENDINGS: [&str; 5] = [".rs", ".md", ".toml", ".c", ".sh"];

/// The repository path a code span names, if it looks like one: relative, no spaces, a `/`,
/// and either a file ending of the repository's or a first component that is a top-level
/// entry of the repository (so `fastpath/src/steer/` is checked, `/healthz` and
/// `xvs.io/scheduler` are not).
fn repo_path(span: &str, top: &BTreeSet<String>) -> Option<String> {
    if span.contains(char::is_whitespace) || !span.contains('/') || span.starts_with('/') {
        return None;
    }
    if span.starts_with("..") || span.contains("://") {
        // Outside the repository, or a URL: not allowed to look like a repo path either.
        return Some(span.to_owned());
    }
    let first = span.split('/').next().unwrap_or_default();
    let looks_like_file = FILE_ENDINGS.iter().any(|e| span.ends_with(e));
    (looks_like_file || top.contains(first)).then(|| span.to_owned())
}

fn top_level() -> BTreeSet<String> {
    std::fs::read_dir(root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && !n.starts_with('.'))
        .collect()
}

#[test]
fn every_path_it_names_exists() {
    let top = top_level();
    let paths: Vec<String> = code_spans(&doc())
        .iter()
        .filter_map(|s| repo_path(s, &top))
        .collect();
    assert!(
        paths.len() >= 40,
        "expected ARCHITECTURE.md to name the code by path; found {} paths",
        paths.len()
    );
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            let p = Path::new(p.trim_end_matches('/'));
            p.is_absolute()
                || p.components().any(|c| c == std::path::Component::ParentDir)
                || !root().join(p).exists()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist in the repository: {missing:?}"
    );
}

#[test]
fn the_path_filter_tells_paths_from_other_spans() {
    let top: BTreeSet<String> = ["fastpath", "README.md"].map(String::from).into();
    assert_eq!(
        repo_path("fastpath/src/steer/", &top).as_deref(),
        Some("fastpath/src/steer/")
    );
    assert_eq!(
        repo_path("nowhere/lib.rs", &top).as_deref(),
        Some("nowhere/lib.rs")
    );
    assert_eq!(
        repo_path("../shared/DESIGN.md", &top).as_deref(),
        Some("../shared/DESIGN.md")
    );
    assert_eq!(repo_path("/healthz", &top), None);
    assert_eq!(repo_path("xvs.io/scheduler", &top), None);
    assert_eq!(repo_path("Pipeline::process", &top), None);
    assert_eq!(repo_path("a / b", &top), None);
    assert_eq!(
        code_spans("a `x/y.rs` b `c`\n```\n`z/w.rs`\n```\n"),
        ["x/y.rs", "c"]
    );
}

/// The workspace crates `manifest` depends on (normal dependencies), by directory.
fn workspace_deps(manifest: &Path, members: &BTreeSet<String>) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let value: toml::Table = toml::from_str(&text).unwrap();
    value
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().filter(|k| members.contains(*k)).cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_crate_table_matches_the_manifests() {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let members: BTreeSet<String> = manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    let doc = doc();
    // Rows of the crate table: "| `dir/` | dep, dep | what |"; the root package is `src/`.
    let mut rows = std::collections::BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[0].is_empty() {
            continue;
        }
        let Some(dir) = cells[1]
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix("/`"))
        else {
            continue;
        };
        if dir != "src" && !members.contains(dir) {
            continue;
        }
        let deps: BTreeSet<String> = cells[2]
            .split(',')
            .map(|d| d.trim().trim_matches('`').to_owned())
            .filter(|d| !d.is_empty() && d != "none")
            .collect();
        rows.insert(dir.to_owned(), deps);
    }
    for m in &members {
        let want = workspace_deps(&root().join(m).join("Cargo.toml"), &members);
        let got = rows
            .get(m)
            .unwrap_or_else(|| panic!("ARCHITECTURE.md's crate table has no row for `{m}/`"));
        assert_eq!(
            got, &want,
            "ARCHITECTURE.md: the workspace dependencies of `{m}/`"
        );
    }
    let want = workspace_deps(&root().join("Cargo.toml"), &members);
    let got = rows
        .get("src")
        .expect("ARCHITECTURE.md's crate table has no row for `src/` (the xvs binary)");
    assert_eq!(got, &want, "ARCHITECTURE.md: the dependencies of `src/`");
}

#[test]
fn the_readme_points_to_it() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains("ARCHITECTURE.md"),
        "README.md should point to ARCHITECTURE.md"
    );
    let top = top_level();
    let outside: Vec<String> = code_spans(&readme)
        .into_iter()
        .filter(|s| s.starts_with("../"))
        .collect();
    assert!(
        outside.is_empty() && repo_path("../shared/DESIGN.md", &top).is_some(),
        "README.md points outside the repository: {outside:?}"
    );
}

/// The product crates whose functions `clippy::too_many_lines` checks (at clippy.toml's
/// 70 lines; each enables it in its root for non-test builds).
const LINTED_CRATES: [&str; 10] = [
    "vocab",
    "config",
    "shm",
    "lb-algos",
    "flowtable",
    "fastpath",
    "pcap",
    "slowpath",
    "daemon",
    "src",
];

/// Exceptions to the 70-line limit in product code: this number may only go down (issue
/// #31's target was 10).
const LONG_FUNCTIONS_MAX: usize = 1;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir)
        .expect("a source directory")
        .flatten()
    {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn long_functions_in_product_code_are_few_and_say_why() {
    let root = root();
    let mut exceptions = Vec::new();
    for krate in LINTED_CRATES {
        let src = if krate == "src" {
            root.join("src")
        } else {
            root.join(krate).join("src")
        };
        let lib = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .find(|p| p.exists())
            .expect("a crate root");
        let text = std::fs::read_to_string(&lib).expect("the crate root");
        assert!(
            text.contains("#![cfg_attr(not(test), warn(clippy::too_many_lines))]"),
            "{} does not enable clippy::too_many_lines",
            lib.display()
        );
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("a source file");
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let l = line.trim_start();
                if l.starts_with("//")
                    || !l.contains("clippy::too_many_lines")
                    || l.contains("warn(")
                {
                    continue;
                }
                // The attribute with its reason: on this line or the next few.
                let attr = lines[i.saturating_sub(1)..(i + 3).min(lines.len())].join(" ");
                assert!(
                    attr.contains("expect(") && attr.contains("reason = \""),
                    "{}:{}: an exception to the 70-line limit is an #[expect(.., reason = \"..\")]",
                    f.display(),
                    i + 1
                );
                exceptions.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(
        exceptions.len() <= LONG_FUNCTIONS_MAX,
        "{} exceptions to the 70-line limit (at most {LONG_FUNCTIONS_MAX}): {exceptions:#?}",
        exceptions.len()
    );
}
