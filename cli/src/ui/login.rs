//! `--login`: the dashboard closed to the machine's other users.
//!
//! Loopback is open to every local process, whoever runs it, so without
//! this any user of the machine reads the pages (payloads and the form
//! token included) and can act with the token. With it, a request must
//! carry a cookie that only the link printed at start sets: its token is
//! 128 bits drawn at start and compared in constant time; the cookie is
//! HttpOnly (no script reads it) and SameSite=Strict (no other site's
//! page sends it), and named after the port, since browsers keep cookies
//! per host, not per port, and two dashboards would log each other out.

use axum::extract::Request;
use axum::http::header::{COOKIE, LOCATION, SET_COOKIE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::guard::{new_token, same_token};
use super::reply::UiError;

/// The secret of one run, and the cookie that carries it.
pub struct Login {
    secret: String,
    cookie: String,
}

impl Login {
    /// A fresh secret for the dashboard listening on `port`.
    pub fn new(port: u16) -> std::io::Result<Login> {
        Ok(Login {
            secret: new_token()?,
            cookie: format!("pg_lease_ui_{port}"),
        })
    }

    /// The link that logs a browser in, on the server at `base`
    /// (`http://host:port`).
    pub fn link(&self, base: &str) -> String {
        format!("{base}/login?token={}", self.secret)
    }

    /// The answer instead of the handler's: the cookie and a redirect for
    /// `/login` with this run's token, a 401 page for a request without
    /// the cookie; `None` lets the request through (it has the cookie, or
    /// asks for the stylesheet or script, which hold nothing).
    pub fn check(&self, request: &Request) -> Option<Response> {
        let path = request.uri().path();
        if path == "/login" {
            return Some(self.log_in(request.uri().query().unwrap_or("")));
        }
        if path.starts_with("/assets/") || self.has_cookie(request) {
            return None;
        }
        Some(
            UiError::Unauthorized(
                "This dashboard asks for a login (--login): open the link pg-lease ui printed \
                 when it started (…/login?token=…) in this browser. The link changes at every \
                 start."
                    .to_owned(),
            )
            .into_response(),
        )
    }

    /// `/login?token=…`: with this run's token, sets the cookie and sends
    /// the browser to the queues, so the token leaves the address bar.
    fn log_in(&self, query: &str) -> Response {
        let token = query
            .split('&')
            .find_map(|pair| pair.strip_prefix("token="))
            .unwrap_or("");
        if !same_token(token, &self.secret) {
            return UiError::Unauthorized(
                "this login link is not this server's: its token changes at every start, so \
                 use the link of the last start-up line"
                    .to_owned(),
            )
            .into_response();
        }
        let cookie = format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            self.cookie, self.secret
        );
        let mut response = StatusCode::SEE_OTHER.into_response();
        let headers = response.headers_mut();
        headers.insert(LOCATION, HeaderValue::from_static("/"));
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            headers.insert(SET_COOKIE, value);
        }
        response
    }

    /// Whether a `Cookie` header carries this run's cookie.
    fn has_cookie(&self, request: &Request) -> bool {
        request
            .headers()
            .get_all(COOKIE)
            .iter()
            .filter_map(|h| h.to_str().ok())
            .flat_map(|h| h.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .any(|(name, value)| name == self.cookie && same_token(value, &self.secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(uri: &str, cookie: Option<&str>) -> Request {
        let mut builder = Request::builder().uri(uri);
        if let Some(c) = cookie {
            builder = builder.header(COOKIE, c);
        }
        builder.body(Body::empty()).unwrap()
    }

    #[test]
    fn only_this_runs_cookie_lets_a_request_through() {
        let login = Login::new(8420).unwrap();
        let good = format!("other=1; pg_lease_ui_8420={}", login.secret);
        assert!(login.check(&request("/dead", Some(&good))).is_none());
        assert!(login.check(&request("/assets/app.css", None)).is_none());
        let forged = format!("pg_lease_ui_8420={}", "0".repeat(32));
        let other_port = format!("pg_lease_ui_8421={}", login.secret);
        for cookie in [None, Some(forged.as_str()), Some(other_port.as_str())] {
            let answer = login.check(&request("/dead", cookie)).unwrap();
            assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "{cookie:?}");
        }
    }

    #[test]
    fn the_link_sets_the_cookie_and_a_wrong_one_does_not() {
        let login = Login::new(8420).unwrap();
        let link = login.link("http://127.0.0.1:8420");
        let path = link.trim_start_matches("http://127.0.0.1:8420");
        let answer = login.check(&request(path, None)).unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER);
        let cookie = answer.headers()[SET_COOKIE].to_str().unwrap();
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        let wrong = login.check(&request("/login?token=00", None)).unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
        assert!(wrong.headers().get(SET_COOKIE).is_none());
    }
}
