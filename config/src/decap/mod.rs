//! The configuration of `xvs decap`, the backend side of direct server return: a small TOML
//! file of its own (`config/examples/decap.toml` documents every key) or the same settings
//! as command-line flags, validated alike.
//!
//! Contract: [`parse_decap`] and [`decap_from_args`] return a [`DecapConfig`] that passed
//! every check below, or every problem at once, each naming the key (`vips[2]`, with its
//! line and column) or the flag (`--vip 198.18.100.1:80=80`). Unknown keys are errors.
//!
//! A VIP entry is `ADDR` (decapsulate what is sent to ADDR) or `ADDR:PORT=TARGET[/PROTO]`
//! (also deliver TCP, or UDP with `/udp`, to ADDR:PORT at port TARGET, and send the replies
//! from TARGET back from PORT); IPv6 addresses take brackets: `[2001:db8::1]:80=8080/tcp`.
//! Refused: addresses no service may have (`special_address`), port 0, a translation to
//! the same port, SCTP (its CRC32c checksum cannot be updated incrementally), one
//! VIP:PORT/PROTO translated twice, and two ports translated to one VIP:TARGET/PROTO (the
//! replies' source port would be ambiguous).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;
use vocab::{Protocol, XdpMode};

use crate::span::{self, KeyPath};
use crate::{DEFAULT_GUE_PORT, Error, special_address};

/// Most VIPs `xvs decap` takes (its `vips` map holds this many).
pub const DECAP_VIPS_MAX: usize = 4096;
/// Most port translations `xvs decap` takes (its `ports` map holds this many).
pub const DECAP_PORTS_MAX: usize = 16384;
/// Most interfaces `xvs decap` attaches to.
pub const DECAP_INTERFACES_MAX: usize = 64;
/// Where `xvs decap` pins its programs when no `bpf_pin_root` is given.
pub const DEFAULT_DECAP_PIN_ROOT: &str = "/sys/fs/bpf/xvs-decap";

/// A validated `xvs decap` configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecapConfig {
    /// Interfaces to attach to: where encapsulated packets arrive and replies leave.
    pub interfaces: Vec<String>,
    /// Every VIP to decapsulate (those of the translations included), each once, in the
    /// order first given.
    pub vips: Vec<IpAddr>,
    /// Port translations.
    pub ports: Vec<PortTranslation>,
    /// The GUE UDP port.
    pub gue_port: u16,
    /// How to attach XDP.
    pub xdp_mode: XdpMode,
    /// Whether `xvs decap` puts the VIPs on `lo` (and takes them off on `--detach`).
    pub vips_on_lo: bool,
    /// The bpffs directory of the pins.
    pub bpf_pin_root: PathBuf,
}

/// One port translation of a VIP entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortTranslation {
    /// The VIP.
    pub vip: IpAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The service port clients connect to.
    pub port: u16,
    /// The port the backend listens on.
    pub target: u16,
}

/// A parsed VIP entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VipEntry {
    /// `ADDR`: decapsulate only.
    Vip(IpAddr),
    /// `ADDR:PORT=TARGET[/PROTO]`.
    Translate(PortTranslation),
}

impl VipEntry {
    /// Parses one entry (see the module doc); the error is a sentence.
    pub fn parse(s: &str) -> Result<VipEntry, String> {
        let usage = "expected ADDR or ADDR:PORT=TARGET[/tcp|/udp] (IPv6 in brackets: \
                     [2001:db8::1]:80=8080/tcp)";
        let s = s.trim();
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(VipEntry::Vip(ip));
        }
        let (addr, rest) = if let Some(r) = s.strip_prefix('[') {
            let (a, rest) = r
                .split_once(']')
                .ok_or(format!("no `]` after the IPv6 address: {usage}"))?;
            let a: std::net::Ipv6Addr = a
                .parse()
                .map_err(|_| format!("`{a}` is not an IPv6 address: {usage}"))?;
            (IpAddr::V6(a), rest)
        } else {
            let a = s.split(':').next().unwrap_or(s);
            let ip: std::net::Ipv4Addr = a
                .parse()
                .map_err(|_| format!("`{a}` is not an IP address: {usage}"))?;
            (IpAddr::V4(ip), &s[a.len()..])
        };
        let rest = rest
            .strip_prefix(':')
            .ok_or(format!("no `:PORT` after the address: {usage}"))?;
        let (ports, proto) = match rest.split_once('/') {
            Some((p, proto)) => (p, proto),
            None => (rest, "tcp"),
        };
        let protocol = match proto {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => {
                return Err(
                    "SCTP ports cannot be translated (its CRC32c checksum cannot be \
                            updated incrementally); give the VIP alone"
                        .to_owned(),
                );
            }
            other => return Err(format!("unknown protocol `{other}`: tcp or udp")),
        };
        let (port, target) = ports.split_once('=').ok_or(format!(
            "no `=TARGET` port: a VIP:PORT alone translates nothing, give the VIP alone; {usage}"
        ))?;
        let port = parse_port(port)?;
        let target = parse_port(target)?;
        if port == target {
            return Err(format!(
                "port {port} is translated to itself: give the VIP alone"
            ));
        }
        Ok(VipEntry::Translate(PortTranslation {
            vip: addr,
            protocol,
            port,
            target,
        }))
    }

    fn vip(&self) -> IpAddr {
        match self {
            VipEntry::Vip(ip) => *ip,
            VipEntry::Translate(t) => t.vip,
        }
    }
}

fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("`{s}` is not a port (1 to 65535)")),
        Ok(p) => Ok(p),
    }
}

fn default_gue_port() -> u16 {
    DEFAULT_GUE_PORT
}

fn default_pin_root() -> PathBuf {
    PathBuf::from(DEFAULT_DECAP_PIN_ROOT)
}

/// The file as written (before validation).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecapFile {
    interfaces: Vec<String>,
    vips: Vec<String>,
    #[serde(default = "default_gue_port")]
    gue_port: u16,
    #[serde(default)]
    xdp_mode: XdpMode,
    #[serde(default)]
    vips_on_lo: bool,
    #[serde(default = "default_pin_root")]
    bpf_pin_root: PathBuf,
}

/// The settings as given on the command line (`xvs decap --interface ... --vip ...`).
#[derive(Clone, Debug, Default)]
pub struct DecapArgs {
    /// `--interface`, repeated.
    pub interfaces: Vec<String>,
    /// `--vip`, repeated.
    pub vips: Vec<String>,
    /// `--gue-port`.
    pub gue_port: Option<u16>,
    /// `--xdp-mode`.
    pub xdp_mode: Option<XdpMode>,
    /// `--vips-on-lo`.
    pub vips_on_lo: bool,
    /// `--pin-root`.
    pub bpf_pin_root: Option<PathBuf>,
}

/// Which setting a problem is about, and which entry of a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Interfaces(Option<usize>),
    Vips(Option<usize>),
    GuePort,
    PinRoot,
}

/// Parses and validates a decap config file; `file` names it in error messages.
pub fn parse_decap(text: &str, file: &str) -> Result<DecapConfig, Error> {
    let invalid = |problems| Error::Invalid {
        file: file.to_owned(),
        problems,
    };
    let doc = toml::de::DeTable::parse(text).map_err(|e| invalid(vec![span::syntax(text, &e)]))?;
    let de = toml::de::Deserializer::from(doc.clone());
    let raw: DecapFile = serde_path_to_error::deserialize(de)
        .map_err(|e| invalid(vec![span::schema(text, &doc, &e)]))?;
    let key = |f: Field| -> KeyPath {
        let (name, i) = match f {
            Field::Interfaces(i) => ("interfaces", i),
            Field::Vips(i) => ("vips", i),
            Field::GuePort => ("gue_port", None),
            Field::PinRoot => ("bpf_pin_root", None),
        };
        let k = KeyPath::of(&[name]);
        match i {
            Some(i) => k.index(i),
            None => k,
        }
    };
    validate(raw).map_err(|problems| {
        invalid(
            problems
                .into_iter()
                .map(|(f, message)| span::locate(text, &doc, &key(f), message))
                .collect(),
        )
    })
}

/// Validates the command line's settings; each problem names its flag (and value).
pub fn decap_from_args(args: DecapArgs) -> Result<DecapConfig, Vec<String>> {
    let raw = DecapFile {
        interfaces: args.interfaces,
        vips: args.vips,
        gue_port: args.gue_port.unwrap_or(DEFAULT_GUE_PORT),
        xdp_mode: args.xdp_mode.unwrap_or_default(),
        vips_on_lo: args.vips_on_lo,
        bpf_pin_root: args.bpf_pin_root.unwrap_or_else(default_pin_root),
    };
    let named = |f: Field, raw: &DecapFile| match f {
        Field::Interfaces(Some(i)) => format!("--interface {}", raw.interfaces[i]),
        Field::Interfaces(None) => "--interface".to_owned(),
        Field::Vips(Some(i)) => format!("--vip {}", raw.vips[i]),
        Field::Vips(None) => "--vip".to_owned(),
        Field::GuePort => "--gue-port".to_owned(),
        Field::PinRoot => "--pin-root".to_owned(),
    };
    validate(raw.clone()).map_err(|problems| {
        problems
            .into_iter()
            .map(|(f, message)| format!("{}: {message}", named(f, &raw)))
            .collect()
    })
}

fn validate(raw: DecapFile) -> Result<DecapConfig, Vec<(Field, String)>> {
    let mut problems = Vec::new();
    check_interfaces(&raw.interfaces, &mut problems);
    let (vips, ports) = check_vips(&raw.vips, &mut problems);
    if raw.gue_port == 0 {
        problems.push((Field::GuePort, "0 is not a port (1 to 65535)".to_owned()));
    }
    if !raw.bpf_pin_root.is_absolute() {
        problems.push((
            Field::PinRoot,
            format!("`{}` is not an absolute path", raw.bpf_pin_root.display()),
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(DecapConfig {
        interfaces: raw.interfaces,
        vips,
        ports,
        gue_port: raw.gue_port,
        xdp_mode: raw.xdp_mode,
        vips_on_lo: raw.vips_on_lo,
        bpf_pin_root: raw.bpf_pin_root,
    })
}

fn check_interfaces(interfaces: &[String], problems: &mut Vec<(Field, String)>) {
    if interfaces.is_empty() {
        problems.push((
            Field::Interfaces(None),
            "give at least one interface".to_owned(),
        ));
    }
    if interfaces.len() > DECAP_INTERFACES_MAX {
        problems.push((
            Field::Interfaces(None),
            format!(
                "{} interfaces, at most {DECAP_INTERFACES_MAX}",
                interfaces.len()
            ),
        ));
    }
    for (i, name) in interfaces.iter().enumerate() {
        // The kernel's dev_valid_name.
        let bad = name.is_empty()
            || name.len() > 15
            || name == "."
            || name == ".."
            || name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
        if bad {
            problems.push((
                Field::Interfaces(Some(i)),
                format!("`{name}` is not an interface name (1 to 15 bytes, no `/`, `:` or spaces)"),
            ));
        } else if interfaces[..i].contains(name) {
            problems.push((
                Field::Interfaces(Some(i)),
                format!("{name} is listed twice"),
            ));
        }
    }
}

/// The VIPs (each once, in order) and translations of valid entries.
fn check_vips(
    entries: &[String],
    problems: &mut Vec<(Field, String)>,
) -> (Vec<IpAddr>, Vec<PortTranslation>) {
    if entries.is_empty() {
        problems.push((Field::Vips(None), "give at least one VIP".to_owned()));
    }
    let mut vips: Vec<IpAddr> = Vec::new();
    let mut ports: Vec<PortTranslation> = Vec::new();
    let mut by_port: HashMap<(IpAddr, Protocol, u16), u16> = HashMap::new();
    let mut by_target: HashMap<(IpAddr, Protocol, u16), u16> = HashMap::new();
    let mut plain: Vec<IpAddr> = Vec::new();
    for (i, s) in entries.iter().enumerate() {
        let mut refuse = |m: String| problems.push((Field::Vips(Some(i)), m));
        let entry = match VipEntry::parse(s) {
            Ok(e) => e,
            Err(m) => {
                refuse(m);
                continue;
            }
        };
        let vip = entry.vip();
        if let Some(why) = special_address(vip) {
            refuse(format!("{vip} is {why}, not a VIP"));
            continue;
        }
        if let VipEntry::Translate(t) = entry {
            let proto = t.protocol.name();
            if let Some(other) = by_port.get(&(vip, t.protocol, t.port)) {
                refuse(if *other == t.target {
                    format!("{vip} port {}/{proto} to {other} is listed twice", t.port)
                } else {
                    format!(
                        "{vip} port {}/{proto} is already translated to {other}, not to {}",
                        t.port, t.target
                    )
                });
                continue;
            }
            if let Some(other) = by_target.get(&(vip, t.protocol, t.target)) {
                refuse(format!(
                    "port {other}/{proto} of {vip} is already translated to {}: replies from \
                     it could not tell which port to answer from",
                    t.target
                ));
                continue;
            }
            by_port.insert((vip, t.protocol, t.port), t.target);
            by_target.insert((vip, t.protocol, t.target), t.port);
            ports.push(t);
        } else if plain.contains(&vip) {
            refuse(format!("{vip} is listed twice"));
            continue;
        } else {
            plain.push(vip);
        }
        if !vips.contains(&vip) {
            vips.push(vip);
        }
    }
    check_counts(vips.len(), ports.len(), problems);
    (vips, ports)
}

/// The maps' bounds: at most [`DECAP_VIPS_MAX`] VIPs and [`DECAP_PORTS_MAX`] translations.
fn check_counts(vips: usize, ports: usize, problems: &mut Vec<(Field, String)>) {
    if vips > DECAP_VIPS_MAX {
        problems.push((
            Field::Vips(None),
            format!("{vips} VIPs, at most {DECAP_VIPS_MAX}"),
        ));
    }
    if ports > DECAP_PORTS_MAX {
        problems.push((
            Field::Vips(None),
            format!("{ports} port translations, at most {DECAP_PORTS_MAX}"),
        ));
    }
}

#[cfg(test)]
mod tests;
