//! What every request passes before and after its handler.
//!
//! * The Host header must be an IP address, `localhost`, or a name given
//!   with `--allow-host` (a reverse proxy's): a page of another site whose
//!   name was made to resolve to this address (DNS rebinding) would
//!   otherwise read the dashboard as same-origin, tokens included.
//! * With `--login`, a request must carry the login cookie (`login`).
//! * Forms carry a token drawn at start; a page of another site cannot
//!   read it, so it cannot post an action in the operator's browser.
//! * Answers forbid framing, inline scripts and caching, and say how long
//!   the server took (`Server-Timing`, read by `bin/bench`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::{HeaderName, HeaderValue, CACHE_CONTROL, HOST};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::login::Login;
use super::reply::UiError;

/// Who is answered: what the middleware checks.
pub struct Access {
    /// The `--allow-host` names, lower case.
    pub hosts: Vec<String>,
    /// With `--login`, this run's secret.
    pub login: Option<Login>,
}

/// The headers every answer carries.
const HEADERS: &[(&str, &str)] = &[
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

/// The middleware: checks the host against the local names and the
/// `--allow-host` names, then the login, and adds the headers.
pub async fn check(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let host = request
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !allowed(host, &access.hosts) {
        return UiError::Forbidden(format!(
            "this dashboard answers to IP addresses, localhost and the names given with \
             --allow-host, not to {host:?}"
        ))
        .into_response();
    }
    let refused = access.login.as_ref().and_then(|l| l.check(&request));
    let mut response = match refused {
        Some(answer) => answer,
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    for (name, value) in HEADERS {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let took = format!("app;dur={:.1}", started.elapsed().as_secs_f64() * 1000.0);
    if let Ok(value) = HeaderValue::from_str(&took) {
        headers.insert(HeaderName::from_static("server-timing"), value);
    }
    response
}

/// The name of a Host header without its port; `None` if malformed.
fn name_of(host: &str) -> Option<&str> {
    match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(address, _)| address),
        None => Some(host.rsplit_once(':').map_or(host, |(name, _)| name)),
    }
}

/// True for `localhost`, IP literals and the names in `hosts`, with or
/// without a port.
fn allowed(host: &str, hosts: &[String]) -> bool {
    name_of(host).is_some_and(|name| {
        name.eq_ignore_ascii_case("localhost")
            || name.parse::<IpAddr>().is_ok()
            || hosts.iter().any(|h| name.eq_ignore_ascii_case(h))
    })
}

/// A `--allow-host` value: a DNS name (letters, digits, `-` and `.`, at
/// most 253 characters), in lower case.
pub fn host_name(value: &str) -> Result<String, String> {
    let labels_ok = value.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if value.is_empty() || value.len() > 253 || !labels_ok {
        return Err(format!(
            "{value:?} is not a host name (letters, digits, '-' and '.'; no port, no wildcard)"
        ));
    }
    Ok(value.to_ascii_lowercase())
}

/// A fresh token: 128 bits from the kernel, as hex.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `a == b` in a time that does not depend on where they differ.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_name(host: &str) -> bool {
        allowed(host, &[])
    }

    #[test]
    fn allowed_hosts_are_named_exactly() {
        let hosts = ["dash.internal".to_owned()];
        for ok in ["dash.internal", "DASH.internal:443", "127.0.0.1"] {
            assert!(allowed(ok, &hosts), "{ok}");
        }
        for bad in ["dash.internal.evil", "evil.dash.internal", "dash", ""] {
            assert!(!allowed(bad, &hosts), "{bad}");
        }
        assert_eq!(host_name("Dash.Internal").as_deref(), Ok("dash.internal"));
        for bad in ["", "*.internal", "a b", "dash:80", "a..b", "[::1]"] {
            assert!(host_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_addresses_and_localhost_are_local_names() {
        for ok in [
            "127.0.0.1:8420",
            "localhost:1",
            "LOCALHOST",
            "[::1]:8420",
            "10.0.0.7",
        ] {
            assert!(local_name(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example:8420",
            "127.0.0.1.evil.example",
            "[::1",
            "localhost.evil",
        ] {
            assert!(!local_name(bad), "{bad}");
        }
    }

    #[test]
    fn tokens_are_fresh_and_compared_whole() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert!(same_token(&a, &a.clone()));
        assert!(!same_token(&a, &b));
        assert!(!same_token(&a, &a[..31]));
        assert!(!same_token("", &a));
    }
}
