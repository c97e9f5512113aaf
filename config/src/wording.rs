//! serde's words in the config's: `invalid value: integer `70000`, expected u16` becomes
//! `expected a port number (0-65535), found 70000`. A user reads keys, lists and tables, not
//! Rust types, fields and variants. Messages this module does not recognise pass unchanged.

/// `message` (the first line of serde's or toml's message) in the config's words. `key` is
/// the last key of the path (`port`), which some numbers are named after; `value` is the
/// value's text in the file, for messages that do not quote it (`invalid IP address
/// syntax`).
pub fn reword(message: &str, key: Option<&str>, value: Option<&str>) -> String {
    for prefix in ["invalid value: ", "invalid type: "] {
        if let Some((found, want)) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once(", expected "))
        {
            return format!(
                "expected {}, found {}",
                expected(want, key),
                found_as(found)
            );
        }
    }
    for (serde, ours) in [("unknown field `", "key"), ("unknown variant `", "value")] {
        if let Some(rest) = message.strip_prefix(serde) {
            // "`x`, expected one of ..." or "`x`: did you mean `y`?"
            let rest = rest.replacen("`, expected ", "`: expected ", 1);
            return format!("unknown {ours} `{rest}");
        }
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        return format!("missing key `{rest} (required here)");
    }
    let value = value.map_or_else(|| "this".to_owned(), str::to_owned);
    match message {
        "invalid IP address syntax" => {
            format!("{value} is not an IP address (e.g. \"198.18.0.1\" or \"2001:2::1\")")
        }
        "invalid IPv4 address syntax" => {
            format!("{value} is not an IPv4 address (e.g. \"198.18.0.1\")")
        }
        "invalid socket address syntax" => format!(
            "{value} is not an address with a port (e.g. \"198.18.1.1:8080\" or \"[2001:2::1]:8080\")"
        ),
        "wanted string or table" => "expected a string or a table".to_owned(),
        _ => message.to_owned(),
    }
}

/// What serde expected (`u16`, `a sequence`, `struct Interface`), as a user says it.
fn expected(want: &str, key: Option<&str>) -> String {
    let said = match (want, key) {
        ("u16", Some("port")) => "a port number (0-65535)",
        ("u32", Some("as" | "local_as")) => "an AS number (1-4294967295)",
        ("u8", _) => "a whole number from 0 to 255",
        ("u16", _) => "a whole number from 0 to 65535",
        ("u32", _) => "a whole number from 0 to 4294967295",
        ("u64" | "usize", _) => "a whole number (0 or more)",
        ("i8" | "i16" | "i32" | "i64" | "isize", _) => "a whole number",
        ("a boolean", _) => "true or false",
        ("a string", _) => "a string (in quotes)",
        ("a sequence", _) => "a list ([...])",
        ("a map", _) => "a table",
        ("IP address", _) => "an IP address (a string, e.g. \"198.18.0.1\")",
        ("IPv4 address", _) => "an IPv4 address (a string, e.g. \"198.18.0.1\")",
        ("socket address", _) => "an address with a port (a string, e.g. \"198.18.1.1:8080\")",
        (s, _) if s.starts_with("struct ") => "a table",
        _ => return want.to_owned(),
    };
    said.to_owned()
}

/// What serde found (`integer `70000``, `string "4"`, `sequence`), as a user says it.
fn found_as(found: &str) -> String {
    let quoted = |s: &str| s.trim_matches('`').to_owned();
    if let Some(n) = found.strip_prefix("integer ") {
        return quoted(n);
    }
    if let Some(f) = found.strip_prefix("floating point ") {
        return quoted(f);
    }
    if let Some(b) = found.strip_prefix("boolean ") {
        return quoted(b);
    }
    if let Some(s) = found.strip_prefix("string ") {
        return format!("the string {s}");
    }
    match found {
        "sequence" => "a list".to_owned(),
        "map" => "a table".to_owned(),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::reword;

    #[test]
    fn serde_words_become_the_configs() {
        let cases = [
            (
                "invalid value: integer `80000`, expected u16",
                Some("port"),
                "expected a port number (0-65535), found 80000",
            ),
            (
                "invalid value: integer `70000`, expected u16",
                Some("queues"),
                "expected a whole number from 0 to 65535, found 70000",
            ),
            (
                "invalid type: string \"4\", expected u16",
                Some("queues"),
                "expected a whole number from 0 to 65535, found the string \"4\"",
            ),
            (
                "invalid type: string \"eth0\", expected a sequence",
                Some("interfaces"),
                "expected a list ([...]), found the string \"eth0\"",
            ),
            (
                "invalid type: string \"yes\", expected a boolean",
                None,
                "expected true or false, found the string \"yes\"",
            ),
            (
                "invalid type: floating point `1.5`, expected u32",
                None,
                "expected a whole number from 0 to 4294967295, found 1.5",
            ),
            (
                "invalid value: integer `-5`, expected u32",
                Some("local_as"),
                "expected an AS number (1-4294967295), found -5",
            ),
            (
                "invalid type: integer `3`, expected struct Service",
                None,
                "expected a table, found 3",
            ),
            (
                "unknown field `quux`, expected `name` or `queues`",
                None,
                "unknown key `quux`: expected `name` or `queues`",
            ),
            (
                "unknown field `nam`: did you mean `name`?",
                None,
                "unknown key `nam`: did you mean `name`?",
            ),
            (
                "unknown variant `icmp`, expected one of `none`, `tcp`, `http`",
                None,
                "unknown value `icmp`: expected one of `none`, `tcp`, `http`",
            ),
            (
                "missing field `port`",
                None,
                "missing key `port` (required here)",
            ),
            (
                "expected a duration string such as \"900s\"",
                None,
                "expected a duration string such as \"900s\"",
            ),
        ];
        for (serde, key, want) in cases {
            assert_eq!(reword(serde, key, None), want, "{serde}");
        }
        assert_eq!(
            reword(
                "invalid IP address syntax",
                Some("vip"),
                Some("\"198.18.100.256\"")
            ),
            "\"198.18.100.256\" is not an IP address (e.g. \"198.18.0.1\" or \"2001:2::1\")"
        );
    }

    /// Through the loader: the key, the line and the value in the config's words.
    #[test]
    fn the_loader_speaks_the_configs_words() {
        let svc = |line: &str| {
            let text = format!(
                "[[services]]\nname = \"a\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\n{line}\n"
            )
            .replacen("port = 80\n", "", usize::from(line.starts_with("port")));
            let e = crate::parse(&text, "t.toml").unwrap_err();
            e.problems()[0].clone()
        };
        let p = svc("port = 80000");
        assert_eq!(p.key, "services[0].port");
        assert_eq!(p.message, "expected a port number (0-65535), found 80000");
        let p = svc("backends = [{ addr = \"198.18.1.1\" }]");
        assert_eq!(p.key, "services[0].backends[0].addr");
        assert_eq!(
            p.message,
            "\"198.18.1.1\" is not an address with a port (e.g. \"198.18.1.1:8080\" or \"[2001:2::1]:8080\")"
        );
        let e = crate::parse(
            "[dataplane]\ninterfaces = [{ name = \"eth0\", queues = 70000 }]\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:2:41: dataplane.interfaces[0].queues: expected a whole number from 0 to 65535, found 70000"
        );
    }
}
