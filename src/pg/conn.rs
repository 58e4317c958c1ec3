//! Connections to a PostgreSQL server: the URL as libpq users write it (`sslmode`,
//! `sslrootcert`, `connect_timeout`, `application_name`, `keepalives*`, `tcp_user_timeout`) and
//! TLS through rustls.
//!
//! Every wait is bounded. `connect_timeout` covers the whole attempt, as libpq's does: the TCP
//! connection, TLS, the startup and authentication, and the session's settings (a server that
//! accepts the connection and never answers fails the attempt, it does not hang it). A
//! connection whose peer vanished (a cut network: nothing answers, nothing resets) is given up
//! by TCP keepalives and `tcp_user_timeout`, whose defaults here are far shorter than the
//! operating system's two hours (see [`KEEPALIVES_IDLE`]).
//!
//! The rest of the program is blocking where it talks to databases (SQLite is), and it does so
//! from threads of the scheduler's blocking pool, where a runtime cannot be entered again. So the
//! connections' sockets are driven by one small runtime of their own, on a thread of its own,
//! and a caller waits for a client's answer by parking its thread until the connection's task
//! wakes it ([`block_on`]): the client's futures only wait on channels to that task.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres::{CancelToken, Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalives when the URL does not say (`keepalives_idle`, `keepalives_interval`,
/// `keepalives_count`): an idle connection whose peer is gone is given up after about
/// 10 + 3 x 5 = 25 seconds.
pub(crate) const KEEPALIVES_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVES_COUNT: u32 = 3;

/// How long sent data may stay unacknowledged before the connection is given up, when the URL
/// does not say (`tcp_user_timeout`, in milliseconds as libpq reads it).
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// How a connection is secured, from `sslmode`.
#[derive(Clone)]
enum Tls {
    /// `disable`.
    None,
    /// `prefer`, `require`, `verify-ca` and `verify-full`, each with its verifier.
    Rustls(MakeRustlsConnect),
}

/// A database's URL, parsed once.
#[derive(Clone)]
pub(crate) struct Target {
    config: tokio_postgres::Config,
    tls: Tls,
}

impl Target {
    /// How long one connection attempt may take in all: `connect_timeout` for each host the
    /// URL names, tried in turn (as libpq does).
    pub(crate) fn attempt_bound(&self) -> Duration {
        let timeout = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        let hosts = u32::try_from(self.config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        timeout.saturating_mul(hosts)
    }
}

/// Parses a URL as libpq does, with the modes `tokio-postgres` lacks (`verify-ca`,
/// `verify-full`) done by the TLS verifier. Never puts the URL in an error: it may hold a
/// password.
pub(crate) fn target(url: &str) -> Result<Target, String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut mode = None;
    let mut root_cert = None;
    let mut user_timeout = None;
    let mut keepalives_count = None;
    let mut rest = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        // A value as libpq reads it: percent-decoded (`sslrootcert=%2Fetc%2Fca.crt`).
        let decoded = kv.split_once('=').map(|(k, v)| {
            (
                k,
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        });
        match decoded.as_ref().map(|(k, v)| (*k, v.as_str())) {
            Some(("sslmode", v)) => mode = Some(v.to_string()),
            Some(("sslrootcert", v)) => root_cert = Some(v.to_string()),
            // libpq's milliseconds (the driver would read seconds), and libpq's name for what
            // the driver calls keepalives_retries.
            Some(("tcp_user_timeout", v)) => {
                user_timeout = Some(v.parse::<u64>().map_err(|_| {
                    format!("tcp_user_timeout `{v}` is not a number of milliseconds")
                })?);
            }
            Some(("keepalives_count", v)) => {
                keepalives_count = Some(
                    v.parse::<u32>()
                        .map_err(|_| format!("keepalives_count `{v}` is not a number"))?,
                );
            }
            _ => rest.push(kv),
        }
    }
    let given = |key: &str| rest.iter().any(|kv| kv.split('=').next() == Some(key));
    let (idle_given, interval_given) = (given("keepalives_idle"), given("keepalives_interval"));
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| format!("the URL is not a PostgreSQL URL libpq would take: {e}"))?;
    let roots = Roots::of(root_cert.as_deref());
    // `sslrootcert=system` makes verify-full the default, and allows nothing weaker.
    let mode = match (mode, &roots) {
        (None, Roots::System) => "verify-full".to_string(),
        (None, _) => "prefer".to_string(),
        (Some(m), Roots::System) if m != "verify-full" => {
            return Err(format!(
                "sslrootcert=system needs sslmode=verify-full (it was `{m}`), as libpq does"
            ));
        }
        (Some(m), _) => m,
    };
    let verify = match (mode.as_str(), &roots) {
        ("disable", _) => None,
        // As libpq: a root certificate that exists is used whenever the connection is
        // encrypted; without one, an encrypted connection is not verified.
        ("allow" | "prefer" | "require", Roots::None) => Some(Verify::Nothing),
        ("allow" | "prefer" | "require" | "verify-ca", _) if !matches!(roots, Roots::None) => {
            Some(Verify::Chain)
        }
        ("verify-ca" | "verify-full", Roots::None) => {
            return Err(format!(
                "sslmode={mode} needs a root certificate to verify the server with, and there is none: give sslrootcert=FILE (or sslrootcert=system for the system's roots), or put it in ~/.postgresql/root.crt"
            ));
        }
        ("verify-full", _) => Some(Verify::Full),
        (other, _) => {
            return Err(format!(
                "sslmode `{other}` is none of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
    };
    match verify {
        None => warn_unverified(&config_hosts(&url), &mode, "is not encrypted"),
        Some(Verify::Nothing) => warn_unverified(
            &config_hosts(&url),
            &mode,
            "does not verify the server (no root certificate)",
        ),
        _ => {}
    }
    config.ssl_mode(match mode.as_str() {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        _ => SslMode::Require,
    });
    if config.get_application_name().is_none() {
        config.application_name("backfill");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if !idle_given {
        config.keepalives_idle(KEEPALIVES_IDLE);
    }
    if !interval_given {
        config.keepalives_interval(KEEPALIVES_INTERVAL);
    }
    config.keepalives_retries(keepalives_count.unwrap_or(KEEPALIVES_COUNT));
    match user_timeout {
        // 0: the system's default, as libpq.
        Some(0) => {}
        Some(ms) => {
            config.tcp_user_timeout(Duration::from_millis(ms));
        }
        None => {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
    }
    let tls = match verify {
        None => Tls::None,
        Some(v) => Tls::Rustls(MakeRustlsConnect::new(tls_config(v, &roots)?)),
    };
    Ok(Target { config, tls })
}

/// The root certificates a connection is verified with, found as libpq finds them.
enum Roots {
    /// `sslrootcert=FILE`, else `~/.postgresql/root.crt`, when the file exists.
    File(std::path::PathBuf),
    /// `sslrootcert=system`: the system's trusted roots.
    System,
    None,
}

impl Roots {
    fn of(root_cert: Option<&str>) -> Roots {
        match root_cert {
            Some("system") => Roots::System,
            Some(file) => {
                let file = std::path::PathBuf::from(file);
                if file.is_file() {
                    Roots::File(file)
                } else {
                    Roots::None
                }
            }
            None => std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".postgresql/root.crt"))
                .filter(|p| p.is_file())
                .map_or(Roots::None, Roots::File),
        }
    }
}

/// The hosts a URL names (for the warning below), from the URL as the driver reads it.
fn config_hosts(url: &str) -> Vec<String> {
    url.parse::<tokio_postgres::Config>()
        .map(|c| {
            c.get_hosts()
                .iter()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    // A unix socket: on this machine.
                    tokio_postgres::config::Host::Unix(_) => "localhost".to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a host name is this machine.
fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Says once per host, on stderr, that a connection to another machine is not verified: its
/// password and its data could go to whoever answers in the server's place.
fn warn_unverified(hosts: &[String], mode: &str, what: &str) {
    static WARNED: LazyLock<Mutex<std::collections::HashSet<String>>> =
        LazyLock::new(Mutex::default);
    for host in hosts.iter().filter(|h| !is_loopback(h)) {
        let first = WARNED
            .lock()
            .map(|mut w| w.insert(host.clone()))
            .unwrap_or(false);
        if first {
            eprintln!(
                "warning: the connection to PostgreSQL on {host} {what}, with sslmode={mode}: a password and the data could go to whoever answers in its place; use sslmode=verify-full with sslrootcert=FILE, or sslrootcert=system"
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    /// Encrypted, the certificate not checked (libpq's `require` without a root certificate).
    Nothing,
    /// The certificate's chain, not its host name.
    Chain,
    /// Chain and host name.
    Full,
}

fn tls_config(verify: Verify, roots_from: &Roots) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    if verify == Verify::Nothing {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    match roots_from {
        Roots::File(file) => {
            for cert in CertificateDer::pem_file_iter(file)
                .map_err(|e| format!("sslrootcert {}: {e}", file.display()))?
            {
                let cert = cert.map_err(|e| format!("sslrootcert {}: {e}", file.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {}: {e}", file.display()))?;
            }
        }
        Roots::System => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
        Roots::None => return Err("no root certificate to verify the server with".into()),
    }
    let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| format!("TLS: {e}"))?;
    let builder = builder.dangerous();
    Ok(if verify == Verify::Full {
        builder.with_custom_certificate_verifier(webpki)
    } else {
        builder.with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
    }
    .with_no_client_auth())
}

/// `require`: the handshake's signatures are checked, the certificate is not.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name may differ.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The runtime that drives every connection's socket.
static IO: LazyLock<Option<tokio::runtime::Runtime>> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("backfill-postgres")
        .enable_all()
        .build()
        .ok()
});

fn io() -> Result<&'static tokio::runtime::Runtime, String> {
    IO.as_ref()
        .ok_or_else(|| "cannot start the thread that talks to PostgreSQL".to_string())
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits for `f` on this thread, parked between polls: for futures that a task of [`IO`] makes
/// ready (a client's requests, a join handle), from any thread, inside a runtime or not.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Runs `f` on [`IO`] and waits for it.
fn on_io<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> Result<T, String> {
    block_on(io()?.spawn(f)).map_err(|e| format!("the PostgreSQL thread failed: {e}"))
}

/// A connection's socket side: what reads and writes its messages.
type Driver = std::pin::Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// One connection.
pub(crate) struct Conn {
    pub client: Client,
    /// Driven by the thread that waits for an answer (see [`Conn::wait`]); `None` once it
    /// ended (the connection closed).
    driver: Mutex<Option<Driver>>,
    cancel: CancelToken,
    tls: Tls,
    url: String,
    /// How long one connection attempt may take (see [`Target::attempt_bound`]): a cancel
    /// request is a connection of its own.
    bound: Duration,
    /// When the statement running was asked to stop ([`Conn::canceller`]): a wait that has
    /// not ended [`GIVE_UP_AFTER_CANCEL`] later gives the connection up.
    cancelled: Arc<Mutex<Option<Instant>>>,
}

/// How long a statement may go on answering nothing after it was cancelled before its wait
/// gives the connection up (closes it, and the wait ends with the driver's "connection
/// closed"). A server that got the cancel request answers in milliseconds; one behind a network
/// that hangs never would. The statement's transaction cannot commit: its client is gone.
pub(crate) const GIVE_UP_AFTER_CANCEL: Duration = Duration::from_secs(10);

impl Conn {
    /// The URL the connection was opened with (it may hold a password: never show it).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Waits for `f`, driving the connection meanwhile.
    pub(crate) fn wait<F: Future>(&self, f: F) -> F::Output {
        match self.drive(f, None) {
            Some(v) => v,
            None => unreachable!("a wait without a deadline ends only with its answer"),
        }
    }

    /// [`Conn::wait`] for at most `bound`: `None` when `f` has not finished by then. The
    /// connection is then in no known state (a request half answered): drop it.
    pub(crate) fn wait_within<F: Future>(&self, f: F, bound: Duration) -> Option<F::Output> {
        self.drive(f, Some(Instant::now() + bound))
    }

    fn drive<F: Future>(&self, f: F, deadline: Option<Instant>) -> Option<F::Output> {
        // The waiting thread drives the socket itself: the server's answer wakes it directly
        // (through the IO thread's reactor), not through a task on another thread first.
        let mut driver = self
            .driver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut f = pin!(f);
        let waker = Arc::new(Unpark(std::thread::current())).into();
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Some(d) = driver.as_mut()
                && d.as_mut().poll(&mut cx).is_ready()
            {
                *driver = None;
            }
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return Some(v);
            }
            if let Some(d) = driver.as_mut()
                && d.as_mut().poll(&mut cx).is_ready()
            {
                *driver = None;
                continue;
            }
            let given_up = self
                .cancelled
                .lock()
                .ok()
                .and_then(|c| *c)
                .is_some_and(|at| at.elapsed() >= GIVE_UP_AFTER_CANCEL);
            if given_up && driver.is_some() {
                tracing::warn!(
                    "no answer {} after a cancel: the connection is given up",
                    humantime::format_duration(GIVE_UP_AFTER_CANCEL)
                );
                // Its requests end with "connection closed" once their connection is gone.
                *driver = None;
                continue;
            }
            match deadline {
                // Woken by the answer; now and then to see whether a cancel went unanswered.
                None => std::thread::park_timeout(Duration::from_millis(250)),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    std::thread::park_timeout(left);
                }
            }
        }
    }

    /// Cancels what the connection's server process is running, from another thread: a cancel
    /// request on a connection of its own, so the server stops the statement (not only this
    /// client waiting for it).
    pub(crate) fn canceller(&self) -> Box<dyn Fn() + Send> {
        let (token, tls, bound) = (self.cancel.clone(), self.tls.clone(), self.bound);
        let cancelled = self.cancelled.clone();
        Box::new(move || {
            if let Ok(mut c) = cancelled.lock() {
                c.get_or_insert_with(Instant::now);
            }
            let (token, tls) = (token.clone(), tls.clone());
            // Bounded as a connection is: through a network that hangs, the request's TLS
            // negotiation would wait for an answer forever.
            let sent = on_io(async move {
                let cancel = async {
                    match &tls {
                        Tls::None => token.cancel_query(NoTls).await,
                        Tls::Rustls(t) => token.cancel_query(t.clone()).await,
                    }
                };
                match tokio::time::timeout(bound, cancel).await {
                    Ok(sent) => sent.map_err(|e| super::describe(&e)),
                    Err(_) => Err(format!(
                        "the server did not answer within {} (connect_timeout)",
                        humantime::format_duration(bound)
                    )),
                }
            })
            .and_then(|r| r);
            if let Err(why) = sent {
                tracing::warn!("could not ask the PostgreSQL server to cancel a statement: {why}");
            }
        })
    }

    /// How long one connection attempt may take (see [`Target::attempt_bound`]).
    pub(crate) fn attempt_bound(&self) -> Duration {
        self.bound
    }

    /// Forgets a cancel: the statement it was for has ended, and the connection serves another.
    pub(crate) fn forget_cancel(&self) {
        if let Ok(mut c) = self.cancelled.lock() {
            *c = None;
        }
    }

    /// Whether the connection is closed: its socket is looked at once (a server that restarted
    /// while the connection sat idle closed it) without waiting.
    pub(crate) fn is_closed(&self) -> bool {
        let mut driver = self
            .driver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Some(d) = driver.as_mut()
            && d.as_mut().poll(&mut cx).is_ready()
        {
            *driver = None;
        }
        driver.is_none() || self.client.is_closed()
    }
}

/// Opens a connection to the database at `url` (which may hold a password; no error repeats
/// it).
pub(crate) fn connect_url(url: &str) -> Result<Conn, ConnectError> {
    connect_with(url, "")
}

/// Why a connection could not be made: what a person reads, and whether the server is out of
/// reach or of a resource (see [`super::Resource`]) rather than refusing this connection (a
/// wrong password, a database that does not exist).
#[derive(Debug, Clone)]
pub(crate) struct ConnectError {
    pub message: String,
    pub resource: Option<super::Resource>,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for ConnectError {
    fn from(message: String) -> Self {
        Self {
            message,
            resource: None,
        }
    }
}

impl From<ConnectError> for String {
    fn from(e: ConnectError) -> Self {
        e.message
    }
}

/// [`connect_url`], then `setup` (statements that set the session up) in the same round trip
/// as the connection's own settings, all within the attempt's bound (see
/// [`Target::attempt_bound`]).
pub(crate) fn connect_with(url: &str, setup: &str) -> Result<Conn, ConnectError> {
    let target = target(url)?;
    let bound = target.attempt_bound();
    let started = Instant::now();
    let timed_out = || {
        format!(
            "cannot connect: the server did not answer within {} (connect_timeout)",
            humantime::format_duration(bound)
        )
    };
    let tls = target.tls.clone();
    let (client, driver, tls) = on_io(async move {
        tokio::time::timeout(bound, async move {
            match &target.tls {
                Tls::None => {
                    let (client, connection) = target.config.connect(NoTls).await?;
                    Ok((client, Box::pin(connection) as Driver, tls))
                }
                Tls::Rustls(t) => {
                    let (client, connection) = target.config.connect(t.clone()).await?;
                    Ok((client, Box::pin(connection) as Driver, tls))
                }
            }
        })
        .await
    })?
    .map_err(|_| ConnectError {
        message: timed_out(),
        resource: Some(super::Resource::Unreachable),
    })?
    .map_err(|e: tokio_postgres::Error| ConnectError {
        message: format!("cannot connect: {}", super::describe(&e)),
        resource: super::error::resource(&e),
    })?;
    // Output settings pinned, so that a row's text (which fingerprints hash) is the same in
    // every session whatever the database's defaults; `DateStyle = ISO` sets the output format
    // only, and keeps how dates are read.
    let cancel = client.cancel_token();
    let conn = Conn {
        client,
        driver: Mutex::new(Some(driver)),
        cancel,
        tls,
        url: url.to_string(),
        bound,
        cancelled: Arc::default(),
    };
    let settings = format!(
        "SET DateStyle = 'ISO'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 1; SET bytea_output = 'hex'; {setup}"
    );
    conn.wait_within(
        conn.client.batch_execute(&settings),
        bound.saturating_sub(started.elapsed()),
    )
    .ok_or_else(|| ConnectError {
        message: timed_out(),
        resource: Some(super::Resource::Unreachable),
    })?
    .map_err(|e| ConnectError {
        message: format!("cannot set up the session: {}", super::describe(&e)),
        resource: super::error::resource(&e),
    })?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_settings_parse_as_libpq_takes_them() {
        let t = target(
            "postgresql://etl:secret@db.internal:5433/analytics?sslmode=require&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(t.config.get_dbname(), Some("analytics"));
        assert_eq!(t.config.get_ports(), &[5433]);
        assert_eq!(t.config.get_application_name(), Some("backfill"));
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        assert_eq!(t.config.get_ssl_mode(), SslMode::Require);
        let t = target("postgresql://etl@db/a?sslmode=disable&application_name=nightly").unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
        assert_eq!(t.config.get_application_name(), Some("nightly"));
        assert_eq!(t.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
    }

    #[test]
    fn errors_never_repeat_the_password() {
        let err = target("postgresql://etl:hunter2@db/a?sslmode=sometimes")
            .err()
            .unwrap();
        assert!(err.contains("sslmode `sometimes`"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = target("postgresql://etl:hunter2@db:notaport/a")
            .err()
            .unwrap();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn tls_modes_follow_libpqs_rules() {
        let dir = std::env::temp_dir().join(format!("backfill-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("none.crt");
        // verify-* without a root certificate is refused, never verified against something else.
        for mode in ["verify-ca", "verify-full"] {
            let err = target(&format!(
                "postgresql://etl@db.internal/a?sslmode={mode}&sslrootcert={}",
                missing.display()
            ))
            .err()
            .unwrap();
            assert!(err.contains("needs a root certificate"), "{err}");
        }
        // sslrootcert=system: verify-full by default, nothing weaker.
        let t = target("postgresql://etl@db.internal/a?sslrootcert=system").unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Require);
        let err = target("postgresql://etl@db.internal/a?sslrootcert=system&sslmode=require")
            .err()
            .unwrap();
        assert!(err.contains("needs sslmode=verify-full"), "{err}");
        // Values are percent-decoded as libpq does: this root certificate exists (and is not
        // one), so `require` reads it and says so, where the undecoded name would be missing.
        let garbage = dir.join("not a cert.crt");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let encoded = garbage
            .display()
            .to_string()
            .replace('/', "%2F")
            .replace(' ', "%20");
        let err = target(&format!(
            "postgresql://etl@db.internal/a?sslmode=require&sslrootcert={encoded}"
        ))
        .err()
        .unwrap();
        assert!(err.contains("sslrootcert"), "{err}");
        assert!(matches!(Roots::of(Some("system")), Roots::System));
        assert!(matches!(
            Roots::of(Some(missing.to_str().unwrap())),
            Roots::None
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn loopback_hosts_are_this_machine() {
        for h in ["localhost", "127.0.0.1", "::1", "[::1]"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["db.internal", "10.0.0.5", "localhost.example.com"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}
