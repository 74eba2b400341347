//! Bearer tokens on the master's HTTP ports. With a cluster secret, the
//! admin API and status page take the admin role's token (as a bearer
//! token, or as the password of Basic credentials, which a browser asks
//! for) and metadata
//! writes any role's token (`kvpool secret token` prints a key's token);
//! `/metrics`, `/health` and metadata reads stay open for probes and
//! scrapers. Without a secret nothing changes: those ports then serve
//! loopback only, as the RPC port does.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use kvpool_net::auth::{Credentials, Role};

/// Which role a request needs, by method and path; `None` is open.
pub(crate) type Needs = fn(&Method, &str) -> Option<Role>;

/// The admin port: everything but `/metrics` and `/health` is the admin's.
pub(crate) fn admin_needs(_: &Method, path: &str) -> Option<Role> {
    (!matches!(path, "/metrics" | "/health")).then_some(Role::Admin)
}

/// The metadata service: reads are open, writes take any role.
pub(crate) fn metadata_needs(method: &Method, path: &str) -> Option<Role> {
    let read = matches!(*method, Method::GET | Method::HEAD) || path == "/health";
    (!read).then_some(Role::Client)
}

struct Guard {
    /// Each role's token, as the master derives them from its key.
    tokens: Vec<(Role, String)>,
    needs: Needs,
}

impl Guard {
    fn role_of(&self, token: &str) -> Option<Role> {
        // Every token is compared in full, so the time taken does not say
        // how much of a guess was right.
        self.tokens
            .iter()
            .filter(|(_, t)| same(t.as_bytes(), token.as_bytes()))
            .map(|(r, _)| *r)
            .max()
    }
}

/// The token of an `Authorization` header: a bearer token, or the password
/// of Basic credentials (what a browser sends for the status page; the user
/// name is ignored).
fn token_of(value: &str) -> Option<String> {
    use base64::Engine as _;
    if let Some(t) = value.strip_prefix("Bearer ") {
        return Some(t.to_string());
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(value.strip_prefix("Basic ")?.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    Some(text.split_once(':')?.1.to_string())
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `router` behind bearer tokens of `keyring`'s roles as `needs` says;
/// unchanged without a key.
pub(crate) fn protect(router: Router, keyring: Option<&Credentials>, needs: Needs) -> Router {
    let Some(keyring) = keyring else {
        return router;
    };
    let tokens = Role::ALL
        .into_iter()
        .filter_map(|r| keyring.derive(r).map(|k| (r, k.http_token())))
        .collect();
    let guard = Arc::new(Guard { tokens, needs });
    router.layer(axum::middleware::from_fn_with_state(guard, check))
}

async fn check(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if let Some(needs) = (g.needs)(req.method(), req.uri().path()) {
        let proved = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(token_of)
            .and_then(|t| g.role_of(t.trim()));
        match proved {
            Some(role) if role >= needs => {}
            Some(role) => {
                let msg = format!("this takes the {needs} token; yours is {role}'s\n");
                return (StatusCode::FORBIDDEN, msg).into_response();
            }
            None => {
                let mut r = (
                    StatusCode::UNAUTHORIZED,
                    "a bearer token is required (`kvpool secret token`)\n",
                )
                    .into_response();
                // A browser asks for Basic credentials: the token as the password.
                for challenge in ["Bearer", "Basic realm=\"kvpool\", charset=\"UTF-8\""] {
                    r.headers_mut()
                        .append(header::WWW_AUTHENTICATE, challenge.parse().expect("valid"));
                }
                return r;
            }
        }
    }
    next.run(req).await
}
