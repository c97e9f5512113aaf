//! The rules of a health check's HTTP settings, shared by the config file (`[health]`,
//! `[[services]] health`) and the Kubernetes annotations (`xvs.io/health-check-*`), which are
//! untrusted input: a path goes into the request line a probe writes, so it must not be able
//! to end that line or add headers.

/// Longest `http_path`, in bytes (a probe's request stays small).
pub const HTTP_PATH_MAX: usize = 1024;
/// Most statuses one `http_status` list may hold.
pub const HTTP_STATUS_MAX: usize = 32;

/// Whether `path` can be the target of a probe's `GET`: it starts with `/`, is at most
/// [`HTTP_PATH_MAX`] bytes, and holds only visible ASCII (no space or control character that
/// would end the request line or start a header; anything else goes percent-encoded).
pub fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} must start with '/'"));
    }
    if path.len() > HTTP_PATH_MAX {
        return Err(format!(
            "{} bytes long, more than the {HTTP_PATH_MAX} a probe sends",
            path.len()
        ));
    }
    if let Some(c) = path.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "{path:?} holds {c:?}: only visible ASCII (percent-encode the rest)"
        ));
    }
    Ok(())
}

/// Whether `statuses` can be an `http_status` list: HTTP statuses (100..=599), at most
/// [`HTTP_STATUS_MAX`]. An empty list is fine here (`[health]`: any 2xx or 3xx).
pub fn check_statuses(statuses: &[u16]) -> Result<(), String> {
    if statuses.len() > HTTP_STATUS_MAX {
        return Err(format!(
            "{} statuses, more than {HTTP_STATUS_MAX}",
            statuses.len()
        ));
    }
    if let Some(s) = statuses.iter().find(|s| !(100..=599).contains(*s)) {
        return Err(format!("{s} is not an HTTP status (100..=599)"));
    }
    Ok(())
}

/// Parses a comma-separated status list (`"200"`, `"200, 204"`), checked as
/// [`check_statuses`] does; an empty list is refused.
pub fn parse_statuses(v: &str) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        if out.len() == HTTP_STATUS_MAX {
            return Err(format!("more than {HTTP_STATUS_MAX} statuses"));
        }
        match item.parse::<u16>() {
            Ok(s) => out.push(s),
            Err(_) => return Err(format!("{item:?} is not a status code")),
        }
    }
    check_statuses(&out)?;
    if out.is_empty() {
        return Err("no status".to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_break_the_request_line_are_refused() {
        for ok in ["/", "/ready", "/healthz?full=1", "/a%20b", "/~x/y.json"] {
            assert_eq!(check_path(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("ready", "must start with '/'"),
            ("", "must start with '/'"),
            ("/a b", "' '"),
            ("/ready\r\nX-Evil: 1", "'\\r'"),
            ("/x\n", "'\\n'"),
            ("/caf\u{e9}", "only visible ASCII"),
            ("/x\t", "'\\t'"),
        ] {
            let e = check_path(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let long = format!("/{}", "a".repeat(HTTP_PATH_MAX));
        assert!(check_path(&long).unwrap_err().contains("1025 bytes"));
        assert_eq!(check_path(&long[..HTTP_PATH_MAX]), Ok(()));
    }

    #[test]
    fn status_lists() {
        assert_eq!(parse_statuses("200"), Ok(vec![200]));
        assert_eq!(parse_statuses(" 200 , 204,301 "), Ok(vec![200, 204, 301]));
        for (bad, says) in [
            ("", "\"\" is not a status code"),
            ("200,", "\"\" is not a status code"),
            ("ok", "\"ok\" is not a status code"),
            ("200,99", "99 is not an HTTP status"),
            ("600", "600 is not an HTTP status"),
            ("70000", "not a status code"),
            ("-1", "not a status code"),
        ] {
            let e = parse_statuses(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let many = vec!["200"; HTTP_STATUS_MAX + 1].join(",");
        assert!(parse_statuses(&many).unwrap_err().contains("more than 32"));
        assert_eq!(check_statuses(&[]), Ok(()));
        assert!(check_statuses(&[200; HTTP_STATUS_MAX + 1]).is_err());
    }
}
