//! How `backfill serve` takes its connections: an accept loop of its own over hyper's HTTP/1
//! server (axum's router answers the requests), so that no client can hold the server.
//!
//! - A request's head must arrive within [`HEADER_READ`]: counted from the connection's start,
//!   and on a kept-alive connection from the end of the previous answer (hyper starts the timer
//!   whenever it waits for a head). Else the connection is closed.
//! - A connection on which no byte moves either way for [`IDLE`] while no request is being
//!   worked on (a client that stopped reading its answer) is closed.
//! - At most [`Limits::connections`] connections are open at once: [`MOST_CONNECTIONS`], or
//!   fewer when the open-files limit leaves less room beside what the rest of the server needs.
//!   When they are all taken, a new connection sheds the one that has been silent longest among
//!   those whose request is not being worked on (a head that never ends, a client that stopped
//!   reading); when every one is being worked on, it waits in the listening socket's backlog for
//!   one to end. So a few hundred half-sent requests cannot lock a request out.
//! - On Ctrl-C or SIGTERM the server stops accepting, closes the connections that carry no
//!   answer, and lets the answers in flight finish, for at most [`GRACE`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

/// How long a client has to send a request's head.
pub(crate) const HEADER_READ: Duration = Duration::from_secs(20);
/// How long a connection may stay silent (no byte read or written) while no request on it is
/// being worked on.
pub(crate) const IDLE: Duration = Duration::from_secs(60);
/// The most connections open at once, however many files the process may open.
pub(crate) const MOST_CONNECTIONS: usize = 512;
/// The fewest, however few files it may open (reads may then fail for want of files, and say so
/// on their page).
const FEWEST_CONNECTIONS: usize = 8;
/// How long the answers in flight at Ctrl-C have to finish.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// The server's bounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_read: Duration,
    pub idle: Duration,
    pub connections: usize,
    /// The open-files limit they were drawn from.
    pub open_files: u64,
}

impl Limits {
    /// This process's: as many connections as its open-files limit (the soft one) leaves room
    /// for beside the `besides` files the rest of the server may hold, up to
    /// [`MOST_CONNECTIONS`]; the timeouts as the tests may shorten them (`BACKFILL_FAULT`).
    pub(crate) fn of_this_process(besides: u64) -> Self {
        use nix::sys::resource::{Resource, getrlimit};
        let (header_read, idle) = match crate::fault::serve_timeouts() {
            Some(d) => (d, d),
            None => (HEADER_READ, IDLE),
        };
        let open_files = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
        Self {
            header_read,
            idle,
            connections: connections_for(open_files, besides),
            open_files,
        }
    }
}

/// Connections that fit in `open_files` beside `besides`.
fn connections_for(open_files: u64, besides: u64) -> usize {
    usize::try_from(open_files.saturating_sub(besides))
        .unwrap_or(usize::MAX)
        .clamp(FEWEST_CONNECTIONS, MOST_CONNECTIONS)
}

/// What the accept loop and a connection's task know of a connection.
struct Watch {
    epoch: Instant,
    /// When a byte last moved on it, or a request was last done with: milliseconds since
    /// `epoch`.
    last: AtomicU64,
    /// Requests being worked on: from the arrival of the head to the answer's head.
    working: AtomicUsize,
    /// Whether its last write found the client's window full: an answer's bytes wait to be sent.
    unsent: AtomicBool,
    /// Told when the accept loop sheds it.
    shed: Notify,
}

impl Watch {
    fn new(epoch: Instant) -> Self {
        let w = Self {
            epoch,
            last: AtomicU64::new(0),
            working: AtomicUsize::new(0),
            unsent: AtomicBool::new(false),
            shed: Notify::new(),
        };
        w.touch();
        w
    }

    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    fn silent_for(&self) -> Duration {
        self.epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last.load(Ordering::Relaxed)))
    }

    fn working(&self) -> bool {
        self.working.load(Ordering::Relaxed) > 0
    }

    /// Whether it carries an answer: a request worked on, or bytes not sent yet.
    fn answering(&self) -> bool {
        self.working() || self.unsent.load(Ordering::Relaxed)
    }

    /// When it is to be looked at again for silence.
    fn idle_deadline(&self, idle: Duration) -> tokio::time::Instant {
        let at = if self.working() {
            Instant::now() + idle
        } else {
            self.epoch + Duration::from_millis(self.last.load(Ordering::Relaxed)) + idle
        };
        tokio::time::Instant::from_std(at)
    }
}

/// A request being worked on, for as long as this lives.
struct Working(Arc<Watch>);

impl Working {
    fn new(w: &Arc<Watch>) -> Self {
        w.working.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(w))
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.touch();
        self.0.working.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The open connections.
struct Registry {
    epoch: Instant,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Watch>>>,
}

impl Registry {
    fn add(&self) -> (u64, Arc<Watch>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let w = Arc::new(Watch::new(self.epoch));
        self.lock().insert(id, Arc::clone(&w));
        (id, w)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Watch>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sheds the connection silent longest among those whose request is not being worked on;
    /// `false` when every one is being worked on.
    fn shed_silent(&self) -> bool {
        let mut open = self.lock();
        let silent = open
            .iter()
            .filter(|(_, w)| !w.working())
            .min_by_key(|(_, w)| w.last.load(Ordering::Relaxed))
            .map(|(id, _)| *id);
        let Some(w) = silent.and_then(|id| open.remove(&id)) else {
            return false;
        };
        w.shed.notify_one();
        true
    }
}

/// The server's connections.
pub(crate) struct Connections {
    limits: Limits,
    slots: Arc<Semaphore>,
    registry: Registry,
}

impl Connections {
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            slots: Arc::new(Semaphore::new(limits.connections)),
            registry: Registry {
                epoch: Instant::now(),
                next: AtomicU64::new(0),
                open: Mutex::new(HashMap::new()),
            },
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.limits.connections - self.slots.available_permits()
    }

    /// Serves `router` on the connections `listener` accepts, until `stop`; then lets the
    /// answers in flight finish (for at most [`GRACE`]).
    pub(crate) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        router: Router,
        stop: impl Future<Output = ()>,
    ) {
        let (closing, _) = watch::channel(false);
        tokio::pin!(stop);
        loop {
            let stream = tokio::select! {
                () = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        self.accept_failed(&e).await;
                        continue;
                    }
                },
            };
            let slot = match Arc::clone(&self.slots).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    self.registry.shed_silent();
                    tokio::select! {
                        () = &mut stop => break,
                        slot = Arc::clone(&self.slots).acquire_owned() => {
                            let Ok(slot) = slot else { break };
                            slot
                        }
                    }
                }
            };
            tokio::spawn(Arc::clone(&self).connection(
                stream,
                slot,
                router.clone(),
                closing.subscribe(),
            ));
        }
        drop(listener);
        let _ = closing.send(true);
        let _ = tokio::time::timeout(GRACE, closing.closed()).await;
    }

    /// An accept that failed. For want of file descriptors (the room left beside the
    /// connections was misjudged): a silent connection is shed and the loop pauses, rather
    /// than spin; anything else was the connection's own and the next is accepted.
    async fn accept_failed(&self, e: &std::io::Error) {
        use nix::libc::{EMFILE, ENFILE, ENOBUFS, ENOMEM};
        if matches!(e.raw_os_error(), Some(EMFILE | ENFILE | ENOBUFS | ENOMEM)) {
            tracing::warn!("cannot accept a connection: {e}");
            self.registry.shed_silent();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Serves one connection until it ends, is shed, stays silent for the idle timeout, or
    /// the server stops.
    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        _slot: OwnedSemaphorePermit,
        router: Router,
        mut closing: watch::Receiver<bool>,
    ) {
        if *closing.borrow_and_update() {
            return;
        }
        let (id, w) = self.registry.add();
        let io = TokioIo::new(Watched {
            stream,
            watch: Arc::clone(&w),
        });
        let router = TowerToHyperService::new(router);
        let on = Arc::clone(&w);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let working = Working::new(&on);
            let answer = hyper::service::Service::call(&router, request);
            async move {
                let answer = answer.await;
                drop(working);
                answer
            }
        });
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read);
        let conn = http.serve_connection(io, service);
        tokio::pin!(conn);
        let idle = self.limits.idle;
        let mut stopping = false;
        loop {
            tokio::select! {
                _ = conn.as_mut() => break,
                () = w.shed.notified() => break,
                _ = closing.changed(), if !stopping => {
                    if !w.answering() {
                        break;
                    }
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = tokio::time::sleep_until(w.idle_deadline(idle)) => {
                    if !w.working() && w.silent_for() >= idle {
                        break;
                    }
                }
            }
        }
        self.registry.remove(id);
    }
}

/// A connection's socket, which notes when bytes move and whether the client's window is full.
struct Watched {
    stream: TcpStream,
    watch: Arc<Watch>,
}

impl Watched {
    fn wrote(&self, r: &Poll<std::io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) => {
                if *n > 0 {
                    self.watch.touch();
                }
                self.watch.unsent.store(false, Ordering::Relaxed);
            }
            Poll::Ready(Err(_)) => self.watch.unsent.store(false, Ordering::Relaxed),
            Poll::Pending => self.watch.unsent.store(true, Ordering::Relaxed),
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.watch.touch();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, data);
        this.wrote(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, data);
        this.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream as Client;

    use axum::routing::get;

    use super::*;

    /// A server with `limits` on a runtime of its own: an answer of 64 MiB at `/big`, one that
    /// takes a second at `/slow`, a small one at `/`.
    fn server(limits: Limits) -> (tokio::runtime::Runtime, String, Arc<Connections>) {
        let (rt, addr, connections, _stop, _served) = stoppable(limits);
        (rt, addr, connections)
    }

    /// Like [`server`], with what stops it (as Ctrl-C does) and its task, which ends when it
    /// has stopped.
    fn stoppable(
        limits: Limits,
    ) -> (
        tokio::runtime::Runtime,
        String,
        Arc<Connections>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let router = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/big", get(|| async { vec![b'x'; 64 << 20] }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "slow"
                }),
            );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let connections = Connections::new(limits);
        let serving = Arc::clone(&connections);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            // Stopped when told; never when what tells it is dropped.
            let stopped = async move {
                if stopped.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            serving.serve(listener, router, stopped).await;
        });
        (runtime, addr, connections, stop, served)
    }

    fn limits(header_read: u64, idle: u64, connections: usize) -> Limits {
        Limits {
            header_read: Duration::from_millis(header_read),
            idle: Duration::from_millis(idle),
            connections,
            open_files: 1024,
        }
    }

    /// A request sent whole; its answer's status line.
    fn get_status(addr: &str, path: &str) -> String {
        let mut c = Client::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            c,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        text.lines().next().unwrap_or_default().to_string()
    }

    /// A request that stops inside its headers.
    fn half_sent(addr: &str) -> Client {
        let mut c = Client::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-a: ").unwrap();
        c
    }

    /// Whether the server closed `c` (EOF or a reset), waiting at most `wait`.
    fn closed(c: &mut Client, wait: Duration) -> bool {
        c.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0u8; 64];
        match c.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        start.elapsed()
    }

    #[test]
    fn room_for_connections_is_what_the_open_files_limit_leaves() {
        assert_eq!(connections_for(1024, 88), MOST_CONNECTIONS);
        assert_eq!(connections_for(128, 88), 40);
        assert_eq!(connections_for(64, 88), FEWEST_CONNECTIONS);
        assert_eq!(connections_for(u64::MAX, 88), MOST_CONNECTIONS);
    }

    #[test]
    fn a_head_that_never_ends_is_closed_after_the_header_read_timeout() {
        let (_rt, addr, connections) = server(limits(500, 60_000, 16));
        let mut c = half_sent(&addr);
        wait_for("the connection to open", Duration::from_secs(5), || {
            connections.open() == 1
        });
        assert!(!closed(&mut c, Duration::from_millis(200)), "closed early");
        assert!(closed(&mut c, Duration::from_secs(5)));
        wait_for("the connection to end", Duration::from_secs(5), || {
            connections.open() == 0
        });
    }

    #[test]
    fn a_client_that_stops_reading_its_answer_is_let_go_after_the_idle_timeout() {
        let (_rt, addr, connections) = server(limits(60_000, 700, 16));
        let mut c = Client::connect(&addr).unwrap();
        c.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        wait_for("the connection to open", Duration::from_secs(5), || {
            connections.open() == 1
        });
        let took = wait_for("the connection to end", Duration::from_secs(10), || {
            connections.open() == 0
        });
        assert!(took >= Duration::from_millis(600), "{took:?}");
        // What was sent can still be read, and then the connection ends short of the answer.
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        assert!(got.len() < 64 << 20, "{}", got.len());
    }

    #[test]
    fn when_every_slot_is_taken_the_silent_connection_is_shed_and_the_request_answered() {
        let (_rt, addr, connections) = server(limits(60_000, 60_000, 4));
        let mut first = half_sent(&addr);
        wait_for("the first connection", Duration::from_secs(5), || {
            connections.open() == 1
        });
        std::thread::sleep(Duration::from_millis(20));
        let mut rest: Vec<Client> = (0..3).map(|_| half_sent(&addr)).collect();
        wait_for("four connections", Duration::from_secs(5), || {
            connections.open() == 4
        });
        let start = Instant::now();
        assert_eq!(get_status(&addr, "/"), "HTTP/1.1 200 OK");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(
            closed(&mut first, Duration::from_secs(2)),
            "the oldest is shed"
        );
        for c in &mut rest {
            assert!(!closed(c, Duration::from_millis(50)), "a newer one is kept");
        }
        assert!(connections.open() <= 4);
    }

    #[test]
    fn a_request_being_worked_on_is_never_shed_and_the_next_waits_for_its_slot() {
        let (_rt, addr, _connections) = server(limits(60_000, 60_000, 1));
        let slow = std::thread::spawn({
            let addr = addr.clone();
            move || get_status(&addr, "/slow")
        });
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        assert_eq!(get_status(&addr, "/"), "HTTP/1.1 200 OK");
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(slow.join().unwrap(), "HTTP/1.1 200 OK");
    }

    #[test]
    fn a_kept_alive_connection_waiting_for_its_next_request_is_closed_after_the_header_read_timeout()
     {
        let (_rt, addr, connections) = server(limits(500, 60_000, 16));
        let mut c = Client::connect(&addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
        assert!(buf[..n].ends_with(b"ok"));
        let took = wait_for("the connection to end", Duration::from_secs(5), || {
            connections.open() == 0
        });
        assert!(took >= Duration::from_millis(400), "{took:?}");
        assert!(closed(&mut c, Duration::from_secs(1)));
    }

    #[test]
    fn on_stopping_a_half_sent_request_is_closed_at_once_and_an_answer_in_flight_finishes() {
        let (_rt, addr, connections, stop, served) = stoppable(limits(60_000, 60_000, 16));
        let mut half = half_sent(&addr);
        let slow = std::thread::spawn({
            let addr = addr.clone();
            move || get_status(&addr, "/slow")
        });
        wait_for("two connections", Duration::from_secs(5), || {
            connections.open() == 2
        });
        stop.send(()).unwrap();
        assert!(closed(&mut half, Duration::from_millis(500)));
        assert_eq!(slow.join().unwrap(), "HTTP/1.1 200 OK");
        wait_for("the server to stop", Duration::from_secs(5), || {
            served.is_finished()
        });
        assert!(Client::connect(&addr).is_err(), "it listens no more");
    }
}
