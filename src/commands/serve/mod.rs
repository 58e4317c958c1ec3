//! `backfill serve`: a read-only status page of the manifest, its JSON documents and Prometheus
//! metrics over HTTP (axum, on a tokio runtime of its own).
//!
//! - Read-only: every request reads through a pooled read-only manifest handle
//!   ([`crate::manifest::Reader`]: SQLite opened read-only, PostgreSQL sessions whose
//!   transactions are read-only). Nothing is written, not even a new manifest.
//! - A manifest that cannot be read gives a page (503) that says so; the next request tries
//!   again with a new connection, so the page recovers when the manifest comes back.
//! - Loopback by default. Another address needs a token, which every request then carries
//!   (`Authorization: Bearer`, or `?token=` once in a browser, kept in a cookie).
//! - Every value on a page is escaped by the templates (minijinja's HTML auto-escaping);
//!   manifest locations are shown without their password.

mod metrics;
mod pages;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::exit::{self, Error};
use crate::manifest::{self, Reads};
use crate::project::Project;
use crate::session::Global;

/// What every request shares.
pub(super) struct App {
    /// The manifest to read (a URL stands here without its password).
    manifest: PathBuf,
    project: Option<Project>,
    token: Option<String>,
    pages: pages::Pages,
}

/// A failed read: why, for the page that says so.
#[derive(Debug)]
pub(super) struct Unreadable(String);

impl App {
    /// Runs `f` on a read-only manifest handle, on a blocking thread: `Ok(None)` when there is
    /// no manifest yet (nothing recorded).
    async fn read<T, F>(self: &Arc<Self>, f: F) -> Result<Option<T>, Unreadable>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Reads, Option<&Project>) -> manifest::Result<T> + Send + 'static,
    {
        let app = Arc::clone(self);
        let joined = tokio::task::spawn_blocking(move || {
            let reader = match manifest::Reader::take(&app.manifest) {
                Ok(r) => r,
                Err(manifest::Error::Missing { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            match f(&*reader, app.project.as_ref()) {
                Ok(v) => Ok(Some(v)),
                Err(e) => {
                    // A connection that failed is not kept, nor are the idle ones, which are
                    // likely broken too: the next request opens a new one.
                    reader.discard();
                    manifest::close_readers();
                    Err(e)
                }
            }
        })
        .await;
        match joined {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Unreadable(e.at(&self.manifest).to_string())),
            Err(e) => Err(Unreadable(format!("the read failed: {e}"))),
        }
    }
}

/// The address to listen on, from `--listen`.
fn address(listen: &str) -> Result<SocketAddr, Error> {
    let bad = || {
        Error::Usage(format!(
            "--listen {listen}: not an address to listen on; give HOST:PORT, such as 127.0.0.1:8460 or [::1]:8460"
        ))
    };
    listen
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

pub fn run(g: &Global, listen: &str, token: Option<String>) -> Result<u8, Error> {
    let addr = address(listen)?;
    let token = token.filter(|t| !t.is_empty());
    if let Some(t) = &token
        && (t.len() < 8 || t.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(Error::Usage(
            "--token (or BACKFILL_SERVE_TOKEN): give at least 8 characters without spaces".into(),
        ));
    }
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(Error::Usage(format!(
            "--listen {listen}: another address than loopback lets every host that reaches it read the manifest; give --token (or BACKFILL_SERVE_TOKEN) as well, which every request must then carry"
        )));
    }
    let project = g.project().ok();
    let path = g.manifest_path(project.as_ref())?;
    // A page waits for a PostgreSQL manifest that went away as briefly as a read may (a
    // backfill's owner waits its lease timeout), then says so; the next request tries again.
    crate::manifest::postgres::set_patience(std::time::Duration::ZERO);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        Error::Usage(format!(
            "--listen {listen}: cannot listen there: {e}; give another port, such as --listen 127.0.0.1:0 for any free one"
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("cannot listen", e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io("cannot listen", e))?;
    let app = Arc::new(App {
        manifest: path.clone(),
        project,
        token,
        pages: pages::Pages::new(),
    });
    let router = routes(Arc::clone(&app));
    if !g.quiet {
        crate::report::out::note(&format!(
            "serving the manifest {} at http://{bound}/ (read-only; Ctrl-C stops)",
            path.display()
        ));
    }
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        axum::serve(listener, router)
            .with_graceful_shutdown(stopped())
            .await
    });
    drop(runtime);
    crate::manifest::close_readers();
    served.map_err(|e| Error::io("the server failed", e))?;
    Ok(exit::OK)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

fn routes(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(pages::backfills))
        .route("/backfills/{id}", get(pages::backfill))
        .route("/backfills/{id}/intervals/{start}", get(pages::interval))
        .route("/dags/{dag}", get(pages::dag))
        .route("/pools", get(pages::pools))
        .route("/api/backfills", get(api_backfills))
        .route("/api/backfills/{id}", get(api_backfill))
        .route("/metrics", get(metrics::metrics))
        .route("/assets/style.css", get(style))
        .route("/assets/app.js", get(script))
        .fallback(pages::not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// Headers every answer carries: nothing is cached by a proxy, no page may be framed, and a
/// page runs only its own script and style.
fn harden(response: &mut Response) {
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
}

/// The cookie a browser keeps the token in.
const COOKIE: &str = "backfill_token";

/// Lets a request through when no token is set or it carries the token; 401 otherwise. A
/// right `?token=` sets the cookie, so that links need not carry it.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(token) = app.token.as_deref() else {
        let mut r = next.run(request).await;
        harden(&mut r);
        return r;
    };
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = cookie(headers, COOKIE);
    let query = request.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "token")
            .map(|(_, v)| v.to_string())
    });
    let given = |v: Option<&str>| v.is_some_and(|v| same(v.as_bytes(), token.as_bytes()));
    let by_query = given(query.as_deref());
    let mut r = if given(bearer) || given(cookie.as_deref()) || by_query {
        next.run(request).await
    } else {
        let mut r = app.pages.message(
            StatusCode::UNAUTHORIZED,
            "This server needs its token",
            "Send it as `Authorization: Bearer TOKEN`, or open this page once with ?token=TOKEN at the end of its address: the browser then keeps it.",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"backfill\""),
        );
        r
    };
    if by_query
        && let Ok(v) = HeaderValue::from_str(&format!(
            "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        ))
    {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    harden(&mut r);
    r
}

/// A cookie's value.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Compares secrets in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `?dag=` and `?active=` of `/api/backfills`, as `list` takes them.
#[derive(serde::Deserialize)]
struct ListQuery {
    dag: Option<String>,
    #[serde(default)]
    active: bool,
}

/// A JSON answer: the document's bytes as the command writes them.
fn json(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
    )
        .into_response()
}

/// A JSON error document.
fn json_error(status: StatusCode, why: &str) -> Response {
    json(
        status,
        serde_json::to_vec(&serde_json::json!({ "error": why })).unwrap_or_default(),
    )
}

/// Writes a view as its command does with `--output json`.
fn document(
    write: impl FnOnce(&mut crate::report::out::Sink<'_>) -> Result<(), Error>,
) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    {
        let mut sink = crate::report::out::Sink::new(
            &mut buf,
            std::io::sink(),
            true,
            crate::report::out::Fit::default(),
        );
        write(&mut sink).map_err(|e| e.to_string())?;
    }
    Ok(buf)
}

/// `/api/backfills`: the document of `list --output json`.
async fn api_backfills(State(app): State<Arc<App>>, Query(q): Query<ListQuery>) -> Response {
    let dag = q.dag.clone();
    let read = app
        .read(move |conn, project| super::read::backfills(conn, project, dag.as_deref(), q.active))
        .await;
    let rows = match read {
        Ok(rows) => rows.unwrap_or_default(),
        Err(Unreadable(why)) => return json_error(StatusCode::SERVICE_UNAVAILABLE, &why),
    };
    let project = app.project.as_ref();
    let labels =
        |dag: &str| crate::report::Labeler::of(project.and_then(|p| p.dag(dag).ok()).as_ref());
    match document(|sink| crate::report::list::write(sink, &rows, &labels, "")) {
        Ok(body) => json(StatusCode::OK, body),
        Err(why) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &why),
    }
}

/// `/api/backfills/ID`: the document of `show ID --output json`.
async fn api_backfill(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return json_error(
            StatusCode::BAD_REQUEST,
            &format!("`{id}` is not a backfill id (a number)"),
        );
    };
    let manifest = app.manifest.clone();
    let read = app
        .read(move |conn, project| {
            let shown = super::read::shown(conn, project, id, true)?;
            Ok(shown.map(|s| {
                let kept = s
                    .dag
                    .as_ref()
                    .map(|d| super::read::kept_versions(d, &manifest));
                (s, kept)
            }))
        })
        .await;
    let (shown, kept) = match read {
        Ok(Some(Some(found))) => found,
        Ok(_) => {
            return json_error(
                StatusCode::NOT_FOUND,
                &format!("the manifest has no backfill {id}"),
            );
        }
        Err(Unreadable(why)) => return json_error(StatusCode::SERVICE_UNAVAILABLE, &why),
    };
    let labels = crate::report::Labeler::of(shown.dag.as_ref());
    match document(|sink| crate::report::show::write(sink, &shown.detail, kept.as_deref(), &labels))
    {
        Ok(body) => json(StatusCode::OK, body),
        Err(why) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &why),
    }
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/style.css"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/app.js"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same(b"s3cret-token", b"s3cret-token"));
        assert!(!same(b"s3cret-token", b"s3cret-tokeN"));
        assert!(!same(b"s3cret", b"s3cret-token"));
    }

    #[test]
    fn listen_addresses() {
        assert!(address("127.0.0.1:8460").unwrap().ip().is_loopback());
        assert!(address("[::1]:0").unwrap().ip().is_loopback());
        assert!(matches!(address("8460"), Err(Error::Usage(_))));
        assert!(matches!(address("nowhere:x"), Err(Error::Usage(_))));
    }
}
