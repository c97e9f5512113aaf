//! From a key path or a byte offset to a line and column: every problem a user sees says
//! where in the file it is.

use std::fmt;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::{Problem, wording};

/// One step of a key path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// A path to a key, e.g. `services[1].backends[0].addr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyPath(pub Vec<Seg>);

impl KeyPath {
    /// The path with a table key appended.
    pub fn key(&self, k: &str) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.to_owned()));
        p
    }
    /// The path with an array index appended.
    pub fn index(&self, i: usize) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }
    /// A path of table keys, e.g. `KeyPath::of(&["dataplane", "batch_size"])`.
    pub fn of(keys: &[&str]) -> KeyPath {
        KeyPath(keys.iter().map(|k| Seg::Key((*k).to_owned())).collect())
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// 1-based (line, column) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The byte span of the value at `path`, or of its nearest ancestor present in the file
/// (a defaulted key is not in the file; its table is).
fn find_span(doc: &Spanned<DeTable<'_>>, path: &KeyPath) -> usize {
    let mut best = doc.span().start;
    let mut table: Option<&DeTable<'_>> = Some(doc.get_ref());
    let mut array: Option<&[Spanned<DeValue<'_>>]> = None;
    for seg in &path.0 {
        let next: Option<&Spanned<DeValue<'_>>> = match seg {
            Seg::Key(k) => table
                .and_then(|t| t.iter().find(|(key, _)| key.get_ref() == k))
                .map(|(key, v)| {
                    // Point at the key for tables (their span may start at the first entry).
                    best = key.span().start;
                    v
                }),
            Seg::Index(i) => array.and_then(|a| a.get(*i)),
        };
        let Some(v) = next else { break };
        if matches!(seg, Seg::Index(_)) || !matches!(v.get_ref(), DeValue::Table(_)) {
            best = v.span().start;
        }
        table = v.get_ref().as_table();
        array = v.get_ref().as_array().map(|a| a.as_ref());
    }
    best
}

/// A problem found by validation at `path`.
pub fn locate(text: &str, doc: &Spanned<DeTable<'_>>, path: &KeyPath, message: String) -> Problem {
    let (line, column) = line_col(text, find_span(doc, path));
    Problem {
        key: path.to_string(),
        line,
        column,
        message,
    }
}

/// A TOML syntax error. A duplicate key or table is named (the parser only says "duplicate
/// key"): the key path is read back from the text at the error's position.
pub fn syntax(text: &str, e: &toml::de::Error) -> Problem {
    let offset = e.span().map_or(0, |s| s.start);
    let (line, column) = line_col(text, offset);
    let message = first_line(e.message());
    if message.starts_with("duplicate key")
        && let Some((key, table)) = duplicate_at(text, offset)
    {
        let message = if table {
            format!("table [{key}] is defined twice: merge the two into one")
        } else {
            format!("{key} is set twice: keep one")
        };
        return Problem {
            key,
            line,
            column,
            message,
        };
    }
    Problem {
        key: String::new(),
        line,
        column,
        message,
    }
}

/// The dotted path of the key a duplicate-key error points at (`dataplane.batch_size`,
/// `services[1].name`), and whether it is a table header. A best effort over the text: the
/// key at `offset` under the last table header before it.
fn duplicate_at(text: &str, offset: usize) -> Option<(String, bool)> {
    let offset = text.floor_char_boundary(offset.min(text.len()));
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let header = text[line_start..offset].trim_start().starts_with('[');
    let key: String = text[offset..]
        .chars()
        .take_while(|ch| !matches!(ch, '=' | ']' | '\n' | '#'))
        .collect::<String>()
        .trim()
        .replace(['"', '\''], "");
    if key.is_empty() {
        return None;
    }
    if header {
        return Some((key, true));
    }
    // The table the key is in: the last header above it, with an index for `[[array]]`.
    let mut table: Option<String> = None;
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    for l in text[..line_start].lines() {
        let l = l.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim().to_owned();
            let n = counts.entry(name.clone()).or_insert(0);
            table = Some(format!("{name}[{n}]"));
            *n += 1;
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = Some(name.trim().to_owned());
        }
    }
    Some(match table {
        Some(t) => (format!("{t}.{key}"), false),
        None => (key, false),
    })
}

/// A schema error (unknown key, wrong type, bad value) from serde, with the path it was at.
pub fn schema(
    text: &str,
    doc: &Spanned<DeTable<'_>>,
    e: &serde_path_to_error::Error<toml::de::Error>,
) -> Problem {
    let mut path = KeyPath::default();
    for seg in e.path().iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => path.0.push(Seg::Index(*index)),
            serde_path_to_error::Segment::Map { key } => path.0.push(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let inner = e.inner();
    let message = did_you_mean(&first_line(inner.message()));
    let last_key = path.0.iter().rev().find_map(|s| match s {
        Seg::Key(k) => Some(k.as_str()),
        Seg::Index(_) => None,
    });
    let value = inner.span().and_then(|s| text.get(s)).map(str::trim);
    let reworded = wording::reword(&message, last_key, value);
    // serde reports a missing key at its table; name the key itself.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.split('`').next())
    {
        let at = find_span(doc, &path);
        path.0.push(Seg::Key(field.to_owned()));
        let (line, column) = line_col(text, at);
        return Problem {
            key: path.to_string(),
            line,
            column,
            message: reworded,
        };
    }
    let offset = inner
        .span()
        .map_or_else(|| find_span(doc, &path), |s| s.start);
    let (line, column) = line_col(text, offset);
    Problem {
        key: path.to_string(),
        line,
        column,
        message: reworded,
    }
}

/// serde's "unknown field `x`, expected one of `a`, `b`, ..." (or "unknown variant"), with
/// the closest expected name offered instead of the whole list when one is close (at most
/// a third of its letters wrong: a typo, not another word).
fn did_you_mean(message: &str) -> String {
    let Some(rest) = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))
    else {
        return message.to_owned();
    };
    let Some((given, expected)) = rest.split_once('`') else {
        return message.to_owned();
    };
    let what = if message.starts_with("unknown field") {
        "field"
    } else {
        "variant"
    };
    let best = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|cand| (edit_distance(given, cand), cand))
        .min();
    match best {
        Some((d, cand)) if d > 0 && d <= given.chars().count().max(3) / 3 => {
            format!("unknown {what} `{given}`: did you mean `{cand}`?")
        }
        _ => message.to_owned(),
    }
}

/// Levenshtein distance (small strings: config keys).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or("").trim().to_owned()
}
