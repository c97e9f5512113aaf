//! Black-box refusals of `xvs decap`: a bad config, from a file or from flags, exits 2 with one
//! line per problem naming the field and the value, before anything is attached or pinned
//! (the pin root given here would be created by an attach: it must stay absent). The
//! missing interface, which needs a network namespace, is in `tests/decap_e2e.rs`.

use std::path::Path;
use std::process::{Command, Output};

fn xvs_decap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xvs"))
        .arg("decap")
        .args(args)
        .output()
        .expect("run xvs")
}

/// The problem lines of a refusal (after the heading line), checking the exit code.
fn refused(o: &Output) -> Vec<String> {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty(), "nothing was done, nothing printed");
    let mut lines = err.lines();
    let head = lines.next().unwrap_or_default();
    assert!(head.starts_with("xvs decap: invalid"), "{err}");
    lines.map(str::to_owned).collect()
}

/// Each bad `--vip` or `--interface`: the one line names the flag and its value.
#[test]
fn bad_flags_are_refused_naming_flag_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let pins = dir.path().join("pins");
    let pins = pins.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["--vip", "198.18.100.300"],
            "--vip 198.18.100.300: `198.18.100.300` is not an IP address",
        ),
        (
            &["--vip", "198.18.100.1:0=8080"],
            "--vip 198.18.100.1:0=8080: `0` is not a port",
        ),
        (
            &["--vip", "198.18.100.1:80=0"],
            "--vip 198.18.100.1:80=0: `0` is not a port",
        ),
        (
            &[
                "--vip",
                "198.18.100.1:80=8080",
                "--vip",
                "198.18.100.1:80=9090",
            ],
            "--vip 198.18.100.1:80=9090: 198.18.100.1 port 80/tcp is already translated to 8080, not to 9090",
        ),
        (
            &[
                "--vip",
                "[2001:2::1]:53=5353/udp",
                "--vip",
                "[2001:2::1]:53=5354/udp",
            ],
            "--vip [2001:2::1]:53=5354/udp: 2001:2::1 port 53/udp is already translated to 5353, not to 5354",
        ),
        (&["--vip", "127.0.0.1"], "--vip 127.0.0.1: 127.0.0.1 is"),
    ];
    for (vips, want) in cases {
        let mut args = vec!["--interface", "eth0", "--pin-root", pins];
        args.extend_from_slice(vips);
        let lines = refused(&xvs_decap(&args));
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        assert!(lines[0].starts_with(want), "{args:?}: {lines:?}");
    }
    let lines = refused(&xvs_decap(&[
        "--interface",
        "eth0/x",
        "--vip",
        "198.18.100.1",
        "--pin-root",
        pins,
    ]));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("--interface eth0/x: `eth0/x` is not an interface name"),
        "{lines:?}"
    );
    assert!(!Path::new(pins).exists(), "a refused config pinned nothing");
}

/// A file with every one of those mistakes: each on its own line, `file:line:col: key:`,
/// with the value, and nothing else refused.
#[test]
fn bad_file_is_refused_one_line_per_problem() {
    let dir = tempfile::tempdir().unwrap();
    let pins = dir.path().join("pins");
    let file = dir.path().join("decap.toml");
    std::fs::write(
        &file,
        format!(
            r#"interfaces = ["eth0"]
vips = [
  "198.18.100.1:80=8080",
  "198.18.100.1:80=9090",
  "198.18.100.1:0=80",
  "not-an-address",
  "198.18.100.2",
]
bpf_pin_root = "{}"
"#,
            pins.display()
        ),
    )
    .unwrap();
    let lines = refused(&xvs_decap(&["--config", file.to_str().unwrap()]));
    let f = file.display().to_string();
    let want = [
        format!(
            "{f}:4:3: vips[1]: 198.18.100.1 port 80/tcp is already translated to 8080, not to 9090"
        ),
        format!("{f}:5:3: vips[2]: `0` is not a port (1 to 65535)"),
        format!("{f}:6:3: vips[3]: `not-an-address` is not an IP address"),
    ];
    assert_eq!(lines.len(), want.len(), "{lines:?}");
    for (line, want) in lines.iter().zip(&want) {
        assert!(line.starts_with(want.as_str()), "{line}\nwant {want}");
    }
    assert!(!pins.exists(), "a refused config pinned nothing");
    // --detach and --status read the file too: the same refusal, nothing touched.
    let lines = refused(&xvs_decap(&[
        "--config",
        file.to_str().unwrap(),
        "--detach",
    ]));
    assert_eq!(lines.len(), want.len(), "{lines:?}");
}
