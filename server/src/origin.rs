//! Which `Host` and `Origin` headers the server answers, so that a web page
//! the user happens to open cannot drive a local API.
//!
//! Two attacks are stopped here. DNS rebinding: a page on `evil.example`
//! re-points its name at 127.0.0.1 and then calls the server same-origin, so
//! its requests carry `Host: evil.example:PORT`; the [`HostPolicy`] refuses
//! hosts other than the bound address's names. Cross-site requests: a page
//! elsewhere posts to `http://127.0.0.1:PORT` and carries a foreign `Origin`;
//! unless `--cors` names that origin it is refused with a 403. Requests with no
//! `Origin` (curl, SDKs, same-origin GETs) pass: only browsers send one.
//!
//! Defaults (documented in `tern serve --help`): bound to a loopback address,
//! only `localhost`, `127.0.0.1`, `[::1]` and the bound host itself at the
//! bound port are accepted; bound to another address (a LAN address or a
//! name), that address at the bound port; bound to every interface (`0.0.0.0`,
//! `::`), any IP literal and `localhost` at the bound port, since the server
//! cannot know its own addresses and a rebinding page always sends a name,
//! never an IP. Names the server is reached under come from `--allowed-hosts`
//! (with or without a port); only an explicit `*` accepts any `Host`.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::openai::error::ApiError;
use crate::state::AppState;
use crate::Cors;

/// The `Host` values the server answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPolicy {
    /// Any host (`--allowed-hosts '*'`).
    Any,
    /// Only these `(host, port)` pairs; a `None` port matches any port.
    Only(Vec<(String, Option<u16>)>),
    /// Bound to every interface: any IP literal at `port`, or one of `listed`.
    IpLiteralsOr {
        /// The bound port.
        port: u16,
        /// `localhost` at the port and the `--allowed-hosts` entries.
        listed: Vec<(String, Option<u16>)>,
    },
}

impl HostPolicy {
    /// The policy for a server bound to `bind_host:port` with the
    /// `--allowed-hosts` entries `extra` (`HOST` or `HOST:PORT`, `*` for any).
    pub fn new(bind_host: &str, port: u16, extra: &[String]) -> Self {
        if extra.iter().any(|h| h.trim() == "*") {
            return Self::Any;
        }
        let mut allowed: Vec<(String, Option<u16>)> = extra
            .iter()
            .map(|h| split_host_port(h.trim()))
            .filter(|(h, _)| !h.is_empty())
            .collect();
        if is_unspecified(bind_host) {
            allowed.push(("localhost".into(), Some(port)));
            return Self::IpLiteralsOr {
                port,
                listed: allowed,
            };
        }
        if is_loopback(bind_host) {
            for name in ["localhost", "127.0.0.1", "[::1]"] {
                allowed.push((name.into(), Some(port)));
            }
        }
        allowed.push((bracket_v6(bind_host), Some(port)));
        Self::Only(allowed)
    }

    /// Whether a request with this `Host` header value is answered.
    pub fn allows(&self, host: &str) -> bool {
        let (name, port) = split_host_port(host);
        // A Host without a port names HTTP's default port.
        let port = port.unwrap_or(80);
        let listed = |list: &[(String, Option<u16>)]| {
            list.iter()
                .any(|(h, p)| h == &name && p.is_none_or(|p| p == port))
        };
        match self {
            Self::Any => true,
            Self::Only(list) => listed(list),
            Self::IpLiteralsOr {
                port: bound,
                listed: list,
            } => {
                let bare = name.trim_start_matches('[').trim_end_matches(']');
                (port == *bound && bare.parse::<IpAddr>().is_ok()) || listed(list)
            }
        }
    }
}

/// Middleware: refuses (403) a `Host` outside the policy, or an `Origin` that
/// is neither same-origin with the `Host` nor allowed by `--cors`.
pub async fn check_origin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Err(e) = verdict(req.headers(), state.host_policy(), state.cors()) {
        return e.into_response();
    }
    next.run(req).await
}

/// The check itself, on the headers alone.
fn verdict(headers: &HeaderMap, hosts: &HostPolicy, cors: &Cors) -> Result<(), ApiError> {
    let text = |name| headers.get(name).map(|v| v.to_str().unwrap_or(""));
    // HTTP/1.0 clients may omit Host; browsers never do.
    let host = text(HOST);
    if let Some(host) = host {
        if !hosts.allows(host) {
            return Err(ApiError::forbidden(
                "This server does not answer requests for this Host: start it with \
                 --allowed-hosts NAME for each name clients use (see --allowed-hosts)",
            ));
        }
    }
    let Some(origin) = text(ORIGIN) else {
        return Ok(());
    };
    // `https://` too: behind a TLS-terminating proxy the page's origin is
    // https while the Host it forwards is still ours.
    let same_origin = host.is_some_and(|h| {
        origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|authority| authority.eq_ignore_ascii_case(h))
    });
    let listed = match cors {
        Cors::Any => true,
        Cors::Off => false,
        Cors::Origins(list) => list.iter().any(|o| o == origin),
    };
    if same_origin || listed {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "Requests from this Origin are not allowed (see --cors)",
        ))
    }
}

/// Splits `host[:port]` (IPv6 in brackets), lowercasing the name.
fn split_host_port(s: &str) -> (String, Option<u16>) {
    let s = s.to_ascii_lowercase();
    if s.starts_with('[') {
        return match s.split_once("]:") {
            Some((h, p)) => (format!("{h}]"), p.parse().ok()),
            None => (s, None),
        };
    }
    match s.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((h, p)) if !h.contains(':') => (h.to_string(), p.parse().ok()),
        _ => (bracket_v6(&s), None),
    }
}

/// `::1` -> `[::1]`, as it appears in a Host header.
fn bracket_v6(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    }
}

/// Whether `--host` is every interface (`0.0.0.0`, `::`).
pub fn is_unspecified(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified())
}

/// Whether `--host` names a loopback address.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn loopback_bind_accepts_local_names_at_its_port_only() {
        let p = HostPolicy::new("127.0.0.1", 8080, &[]);
        assert!(p.allows("localhost:8080"));
        assert!(p.allows("LOCALHOST:8080"));
        assert!(p.allows("127.0.0.1:8080"));
        assert!(p.allows("[::1]:8080"));
        assert!(!p.allows("localhost:9090"));
        assert!(!p.allows("localhost"));
        assert!(!p.allows("evil.example:8080"));
        let p = HostPolicy::new("127.0.0.1", 8080, &["tern.lan".into()]);
        assert!(p.allows("tern.lan:1234"));
        assert!(p.allows("localhost:8080"));
    }

    #[test]
    fn a_wildcard_bind_accepts_ip_literals_at_its_port_and_listed_names() {
        for bind in ["0.0.0.0", "::", "[::]"] {
            let p = HostPolicy::new(bind, 8080, &[]);
            assert!(p.allows("192.168.1.4:8080"), "{bind}");
            assert!(p.allows("[fe80::1]:8080"), "{bind}");
            assert!(p.allows("localhost:8080"), "{bind}");
            assert!(!p.allows("192.168.1.4:8081"), "{bind}");
            // A rebinding page sends its own name: refused.
            assert!(!p.allows("evil.example:8080"), "{bind}");
            assert!(!p.allows("tern.lan:8080"), "{bind}");
        }
        let p = HostPolicy::new("0.0.0.0", 80, &["api.example:80".into()]);
        assert!(p.allows("api.example"));
        assert!(p.allows("10.0.0.2"));
        assert!(!p.allows("api.example:81"));
        assert!(!p.allows("other.example"));
        for bind in ["127.0.0.1", "0.0.0.0", "192.168.1.4"] {
            let any = HostPolicy::new(bind, 80, &["*".into()]);
            assert_eq!(any, HostPolicy::Any);
            assert!(any.allows("evil.example"));
        }
    }

    #[test]
    fn an_address_bind_accepts_that_address_and_listed_names_only() {
        let p = HostPolicy::new("192.168.1.4", 8080, &[]);
        assert!(p.allows("192.168.1.4:8080"));
        assert!(!p.allows("192.168.1.5:8080"));
        assert!(!p.allows("192.168.1.4:9090"));
        assert!(!p.allows("evil.example:8080"));
        assert!(!p.allows("localhost:8080"));
        let p = HostPolicy::new("fe80::1", 8080, &["tern.lan".into()]);
        assert!(p.allows("[fe80::1]:8080"));
        assert!(p.allows("tern.lan:8080"));
        assert!(!p.allows("other.lan:8080"));
        let p = HostPolicy::new("tern.lan", 8080, &[]);
        assert!(p.allows("TERN.LAN:8080"));
        assert!(!p.allows("10.0.0.2:8080"));
    }

    #[test]
    fn foreign_origins_are_refused_unless_cors_names_them() {
        let hosts = HostPolicy::new("127.0.0.1", 8080, &[]);
        let ok = |pairs: &[(&'static str, &str)], cors: &Cors| {
            verdict(&headers(pairs), &hosts, cors).is_ok()
        };
        let local = ("host", "127.0.0.1:8080");
        assert!(ok(&[local], &Cors::Off));
        assert!(ok(
            &[local, ("origin", "http://127.0.0.1:8080")],
            &Cors::Off
        ));
        assert!(!ok(
            &[local, ("origin", "https://evil.example")],
            &Cors::Off
        ));
        assert!(!ok(&[local, ("origin", "null")], &Cors::Off));
        let listed = Cors::Origins(vec!["https://ui.example".into()]);
        assert!(ok(&[local, ("origin", "https://ui.example")], &listed));
        assert!(!ok(&[local, ("origin", "https://evil.example")], &listed));
        assert!(ok(&[local, ("origin", "https://evil.example")], &Cors::Any));
        // DNS rebinding: same-origin with a Host that is not ours.
        let rebound = [
            ("host", "evil.example:8080"),
            ("origin", "http://evil.example:8080"),
        ];
        assert!(!ok(&rebound, &Cors::Any));
    }

    #[test]
    fn loopback_names() {
        assert!(is_loopback("127.0.0.1"));
        assert!(is_loopback("localhost"));
        assert!(is_loopback("::1"));
        assert!(is_loopback("[::1]"));
        assert!(!is_loopback("0.0.0.0"));
        assert!(!is_loopback("192.168.1.4"));
        assert!(is_unspecified("0.0.0.0") && is_unspecified("::") && is_unspecified("[::]"));
        assert!(!is_unspecified("127.0.0.1") && !is_unspecified("tern.lan"));
    }
}
