//! The status page of `backfill serve`: a read-only view of the manifest, its JSON documents
//! and Prometheus metrics over HTTP (axum, on a tokio runtime of its own). The command checks
//! its options and hands them here ([`Options`]).
//!
//! - The page says what `list` and `show` say: it reads backfills as they do ([`crate::reads`]),
//!   and judges owners, workers and leases by the manifest's lease rule
//!   ([`crate::manifest::leases::LeaseCtx`]) at the manifest's clock (the database's on
//!   PostgreSQL), never by the clock of the host serving it.
//! - Read-only: every request reads through a pooled read-only manifest handle
//!   ([`crate::manifest::Reader`]: SQLite opened read-only, PostgreSQL sessions whose
//!   transactions are read-only). Nothing is written, not even a new manifest.
//! - A manifest that cannot be read gives a page (503) that says so; the next request tries
//!   again with a new connection, so the page recovers when the manifest comes back.
//! - Loopback by default. Another address needs a token, which every request then carries
//!   (`Authorization: Bearer`, or `?token=` once in a browser, kept in a cookie). Without a
//!   token, a request must name this host as loopback (`Host`), so that a web page whose name
//!   was rebound to 127.0.0.1 cannot read it.
//! - At most [`AT_ONCE`] backfill pages and JSON documents are made at a time (a document holds
//!   the whole backfill while it is made), and at most [`READS_AT_ONCE`] reads of the manifest;
//!   reads and documents are made on blocking threads.
//! - Connections: a header-read timeout, an idle timeout and a bound on connections open at
//!   once, below the open-files limit (see [`conns`]).
//! - Every value on a page is escaped by the templates (minijinja's HTML auto-escaping);
//!   manifest locations are shown without their password.

mod conns;
mod metrics;
mod pages;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::exit::Error;
use crate::manifest::{self, Reads};
use crate::project::Project;

/// Backfill pages and documents made at once; the others wait their turn.
const AT_ONCE: usize = 4;
/// Reads of the manifest at once, each on a blocking thread with a connection of its own (kept
/// for the next read); the others wait their turn. It bounds the connections and files the
/// reads hold, whatever the number of requests (see [`FILES_BESIDES_CONNECTIONS`]).
const READS_AT_ONCE: usize = 8;
/// Files a read may hold: a SQLite manifest's connection (the database, its WAL and shared
/// memory, a temporary file), kept for the next read, or a PostgreSQL session's socket; a DAG
/// file, a try's log, a warehouse's file or session.
const FILES_PER_READ: u64 = 8;
/// Files the server holds beside its connections: stdin, stdout and stderr, the listening
/// socket, the runtime's and the signals' descriptors, a connection accepted while it waits
/// for a slot, with room to spare; and the reads'. What is left of the open-files limit is for
/// connections.
const FILES_BESIDES_CONNECTIONS: u64 = 24 + READS_AT_ONCE as u64 * FILES_PER_READ;

/// What every request shares.
pub(super) struct App {
    /// The manifest to read (a URL stands here without its password).
    manifest: PathBuf,
    project: Option<Project>,
    token: Option<String>,
    /// The cookie that keeps the token in a browser, named after the port: a browser sends a
    /// host's cookies to each of its ports.
    cookie: String,
    /// Without a token: what a request's `Host` may name (loopback, the address listened on).
    hosts: Vec<String>,
    busy: tokio::sync::Semaphore,
    /// Turns to read the manifest ([`READS_AT_ONCE`]).
    reads: Arc<tokio::sync::Semaphore>,
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
        // The turn is held by the read itself, which goes on should the request be dropped.
        let Ok(turn) = Arc::clone(&self.reads).acquire_owned().await else {
            return Err(Unreadable(
                "no turn to read the manifest (never: the turns are never closed)".into(),
            ));
        };
        let joined = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let reader = match manifest::Reader::take(&app.manifest) {
                Ok(r) => r,
                Err(manifest::Error::Missing { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            match f(&*reader, app.project.as_ref()) {
                Ok(v) => Ok(Some(v)),
                Err(e) => {
                    // A connection that failed is not kept: the next request opens a new one.
                    // Nor are the idle ones when the connection was lost, as they likely were
                    // too; a statement the server refused says nothing of them.
                    reader.discard();
                    if !e.is_statement_error() {
                        manifest::close_readers();
                    }
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

/// What `backfill serve` was given, checked (see `commands::serve`).
pub(crate) struct Options {
    /// The address to listen on.
    pub addr: SocketAddr,
    /// `--listen` as it was given, which errors name.
    pub listen: String,
    /// The token every request must carry, if any (another address than loopback has one).
    pub token: Option<String>,
    /// The manifest to read (a URL stands here without its password).
    pub manifest: PathBuf,
    /// The project, when there is one: its DAGs label the pages, its pools are shown and its
    /// lease timeout judges the leases.
    pub project: Option<Project>,
    /// Whether to leave out the notes on stderr (`--quiet`).
    pub quiet: bool,
}

/// Serves the page until Ctrl-C or SIGTERM.
pub(crate) fn run(options: Options) -> Result<(), Error> {
    let Options {
        addr,
        listen,
        token,
        manifest: path,
        project,
        quiet,
    } = options;
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
        cookie: format!("{COOKIE}_{}", bound.port()),
        hosts: vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "[::1]".into(),
            match bound.ip() {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            },
        ],
        busy: tokio::sync::Semaphore::new(AT_ONCE),
        reads: Arc::new(tokio::sync::Semaphore::new(READS_AT_ONCE)),
        pages: pages::Pages::new(path.display().to_string()),
    });
    let router = routes(Arc::clone(&app));
    if !quiet {
        crate::report::out::note(&format!(
            "serving the manifest {} at http://{bound}/ (read-only; Ctrl-C stops)",
            path.display()
        ));
    }
    let limits = conns::Limits::of_this_process(FILES_BESIDES_CONNECTIONS);
    if !quiet && limits.connections < conns::MOST_CONNECTIONS {
        crate::report::out::note(&format!(
            "at most {} connections at once: the limit on open files ({}) leaves room for no more; `ulimit -n` raises it",
            limits.connections, limits.open_files
        ));
    }
    let connections = conns::Connections::new(limits);
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        connections.serve(listener, router, stopped()).await;
        Ok::<_, std::io::Error>(())
    });
    drop(runtime);
    crate::manifest::close_readers();
    served.map_err(|e| Error::io("the server failed", e))
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
        .method_not_allowed_fallback(pages::not_allowed)
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

/// The cookie a browser keeps the token in (with the port after it).
const COOKIE: &str = "backfill_token";

/// Every request passes here: an address with a NUL in it is refused (400); without a token, a
/// `Host` that is not this host's loopback name is refused (421); with one, a request without
/// it (401). A right `?token=` sets the cookie and sends the browser to the same address
/// without it, so that links need not carry it and it stays out of the address bar. Then the
/// request waits for its turn ([`AT_ONCE`]).
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let mut r = checked(&app, request, next).await;
    harden(&mut r);
    r
}

async fn checked(app: &Arc<App>, request: Request, next: Next) -> Response {
    let uri = request.uri().to_string();
    if uri.contains("%00") {
        return app.pages.message(
            StatusCode::BAD_REQUEST,
            "Not an address of this server",
            "An address with a NUL character (%00) names nothing here.",
        );
    }
    let headers = request.headers();
    match app.token.as_deref() {
        None => {
            let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or("?"));
            if let Some(host) = host
                && !app.hosts.iter().any(|h| same_host(host, h))
            {
                return app.pages.message(
                    StatusCode::MISDIRECTED_REQUEST,
                    "Not this host's name",
                    "Without a token this server answers only to its loopback names (localhost, 127.0.0.1, [::1]): a web page whose name was pointed at this host must not read it. Open it by one of those, or start it with --token.",
                );
            }
        }
        Some(token) => {
            let given = |v: Option<&str>| v.is_some_and(|v| same(v.as_bytes(), token.as_bytes()));
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            let (query, rest) = token_in_query(request.uri().query());
            if given(query.as_deref()) {
                // Once in a browser: keep it in the cookie, and go to the address without it.
                let to = same_address(request.uri().path(), rest.as_deref());
                let mut r = StatusCode::SEE_OTHER.into_response();
                if let (Ok(location), Ok(cookie)) = (
                    HeaderValue::from_str(&to),
                    HeaderValue::from_str(&format!(
                        "{}={token}; Path=/; HttpOnly; SameSite=Lax",
                        app.cookie
                    )),
                ) {
                    r.headers_mut().insert(header::LOCATION, location);
                    r.headers_mut().insert(header::SET_COOKIE, cookie);
                }
                return r;
            }
            if !(given(bearer) || given(cookie(headers, &app.cookie).as_deref())) {
                let mut r = app.pages.message(
                    StatusCode::UNAUTHORIZED,
                    "This server needs its token",
                    "Send it as `Authorization: Bearer TOKEN`, or open this page once with ?token=TOKEN at the end of its address: the browser then keeps it.",
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"backfill\""),
                );
                return r;
            }
        }
    }
    // A backfill's page and JSON document are the largest answers: they take turns. The other
    // answers are small and do not wait behind them.
    let _turn = if whole_backfill(request.uri().path()) {
        app.busy.acquire().await.ok()
    } else {
        None
    };
    next.run(request).await
}

/// Whether an address is a backfill's page or JSON document (`/backfills/ID`,
/// `/api/backfills/ID`), which read the whole backfill.
fn whole_backfill(path: &str) -> bool {
    let rest = path
        .strip_prefix("/api/backfills/")
        .or_else(|| path.strip_prefix("/backfills/"));
    rest.is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// Where the browser goes once its `?token=` is kept: the same path with the rest of its query.
/// A path that starts with `//` would name another host: the list instead.
fn same_address(path: &str, rest: Option<&str>) -> String {
    let path = if path.starts_with("//") { "/" } else { path };
    match rest {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    }
}

/// Whether a `Host` header names `name`, with or without a port.
fn same_host(host: &str, name: &str) -> bool {
    let host = host.trim();
    let without_port = if host.starts_with('[') {
        host.find(']').map_or(host, |end| &host[..=end])
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    without_port.eq_ignore_ascii_case(name)
}

/// A query's `token=` value, and the rest of the query without it (`None` when nothing is left).
fn token_in_query(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(q) = query else {
        return (None, None);
    };
    let mut token = None;
    let mut rest = Vec::new();
    for kv in q.split('&') {
        match kv.split_once('=') {
            Some(("token", v)) => token = Some(v.to_string()),
            _ if !kv.is_empty() => rest.push(kv),
            _ => {}
        }
    }
    (token, (!rest.is_empty()).then(|| rest.join("&")))
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
async fn api_backfills(
    State(app): State<Arc<App>>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "the query takes dag=DAG and active=true|false",
        );
    };
    // The document is built where it is read, off the threads that answer requests.
    let read = app
        .read(move |conn, project| {
            let rows = crate::reads::backfills(conn, project, q.dag.as_deref(), q.active)?;
            let labels = |dag: &str| {
                crate::report::Labeler::of(project.and_then(|p| p.dag(dag).ok()).as_ref())
            };
            Ok(document(|sink| {
                crate::report::list::write(sink, &rows, &labels, "")
            }))
        })
        .await;
    let empty = || {
        document(|sink| {
            crate::report::list::write(sink, &[], &|_| crate::report::Labeler::of(None), "")
        })
    };
    match read {
        Ok(Some(Ok(body))) => json(StatusCode::OK, body),
        Ok(None) => match empty() {
            Ok(body) => json(StatusCode::OK, body),
            Err(why) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &why),
        },
        Ok(Some(Err(why))) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &why),
        Err(Unreadable(why)) => json_error(StatusCode::SERVICE_UNAVAILABLE, &why),
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
            let Some(shown) = crate::reads::shown(conn, project, id, true)? else {
                return Ok(None);
            };
            let kept = shown
                .dag
                .as_ref()
                .map(|d| crate::reads::kept_versions(d, &manifest));
            let labels = crate::report::Labeler::of(shown.dag.as_ref());
            Ok(Some(document(|sink| {
                crate::report::show::write(sink, &shown.detail, kept.as_deref(), &labels)
            })))
        })
        .await;
    match read {
        Ok(Some(Some(Ok(body)))) => json(StatusCode::OK, body),
        Ok(Some(Some(Err(why)))) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &why),
        Ok(_) => json_error(
            StatusCode::NOT_FOUND,
            &format!("the manifest has no backfill {id}"),
        ),
        Err(Unreadable(why)) => json_error(StatusCode::SERVICE_UNAVAILABLE, &why),
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
    fn the_token_is_left_out_of_the_address_and_the_host_stays() {
        assert_eq!(
            token_in_query(Some("page=2&token=abcdefgh&x=1")),
            (Some("abcdefgh".into()), Some("page=2&x=1".into()))
        );
        assert_eq!(
            token_in_query(Some("token=abcdefgh")),
            (Some("abcdefgh".into()), None)
        );
        assert_eq!(
            same_address("/backfills/1", Some("page=2")),
            "/backfills/1?page=2"
        );
        assert_eq!(same_address("//evil.example/x", None), "/");
        assert!(same_host("LOCALHOST:8460", "localhost"));
        assert!(same_host("[::1]:8460", "[::1]"));
        assert!(!same_host("localhost.evil.example", "localhost"));
    }

    #[test]
    fn only_a_backfills_page_and_document_take_turns() {
        assert!(whole_backfill("/backfills/1"));
        assert!(whole_backfill("/api/backfills/12"));
        assert!(!whole_backfill(
            "/backfills/1/intervals/2026-01-01T00:00:00Z"
        ));
        assert!(!whole_backfill("/api/backfills"));
        assert!(!whole_backfill("/api/backfills/"));
        assert!(!whole_backfill("/metrics"));
    }
}
