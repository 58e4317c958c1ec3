//! The one writer thread that owns the manifest's write connection.
//!
//! Jobs arrive on a channel. The thread takes every job waiting (up to [`MAX_BATCH`]), runs them
//! in one `BEGIN IMMEDIATE` transaction, each inside its own savepoint (a failing job rolls back
//! alone), commits once, and only then answers each caller. An answered job is therefore
//! durable: this is group commit, and a `kill -9` never loses a state change that was
//! acknowledged. [`Writer::close`] checkpoints the WAL into the database file.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::{Error, Result};

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 1024;

/// Called after the commit with `None` on success or the commit error.
type Finish = Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>;
/// Runs against the open transaction; `Err` when the transaction could not be started.
type Job = Box<dyn FnOnce(std::result::Result<&Connection, &rusqlite::Error>) -> Finish + Send>;

enum Message {
    Job(Job),
    /// Checkpoint, close the connection, and answer.
    Close(std::sync::mpsc::Sender<()>),
}

/// A handle to the writer thread. Cheap to clone.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Message>,
    path: PathBuf,
}

impl Writer {
    /// Starts the writer thread on an open connection to the manifest at `path`. The thread
    /// ends when [`Writer::close`] is called or the last handle is dropped. Every write a
    /// caller was told about is already committed, so nothing is lost if the process exits
    /// without closing.
    pub fn spawn(conn: Connection, path: &Path) -> Result<Writer> {
        // Every statement of the runner's writes stays prepared (rusqlite keeps 16 by default,
        // fewer than the writes of one try use).
        conn.set_prepared_statement_cache_capacity(64);
        let (tx, rx) = mpsc::channel::<Message>();
        std::thread::Builder::new()
            .name("manifest-writer".into())
            .spawn(move || run(conn, rx))
            .map_err(|e| Error::Invalid(format!("cannot start the manifest writer thread: {e}")))?;
        Ok(Writer {
            tx,
            path: path.to_path_buf(),
        })
    }

    /// Opens the manifest at `path` for writing (creating and migrating it as needed) and
    /// starts its writer.
    pub fn open(path: &Path, durability: super::Durability) -> Result<Writer> {
        Self::spawn(super::open(path, durability)?, path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `f`; the receiver answers once the transaction that ran it has committed.
    pub fn submit<R, F>(&self, f: F) -> oneshot::Receiver<Result<R>>
    where
        R: Send + 'static,
        F: FnOnce(&dyn super::Store) -> Result<R> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let path = self.path.clone();
        let job: Job = Box::new(move |conn| {
            let result = match conn {
                Ok(conn) => in_savepoint(conn, f),
                Err(e) => Err(Error::Invalid(format!("cannot start a transaction: {e}"))),
            };
            Box::new(move |commit_error: Option<&rusqlite::Error>| {
                let result = match commit_error {
                    None => result,
                    Some(e) => Err(Error::Invalid(format!("commit failed: {e}"))),
                };
                let _ = reply.send(result.map_err(|e| match e {
                    Error::Invalid(why) => Error::Invalid(format!("{}: {why}", path.display())),
                    other => other.at(&path),
                }));
            })
        });
        if self.tx.send(Message::Job(job)).is_err() {
            let (reply, rx) = oneshot::channel();
            let _ = reply.send(Err(Error::WriterGone));
            return rx;
        }
        rx
    }

    /// Runs `f` in the writer and waits until it is committed.
    pub async fn call<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn super::Store) -> Result<R> + Send + 'static,
    {
        self.submit(f).await.map_err(|_| Error::WriterGone)?
    }

    /// Like [`Writer::call`], for code outside the async runtime.
    pub fn call_blocking<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn super::Store) -> Result<R> + Send + 'static,
    {
        self.submit(f)
            .blocking_recv()
            .map_err(|_| Error::WriterGone)?
    }

    /// Waits for every queued job, checkpoints the WAL into the database file and closes the
    /// connection, so that the manifest file alone is a complete copy.
    pub fn close(self) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.tx.send(Message::Close(done)).is_ok() {
            let _ = wait.recv();
        }
    }
}

fn in_savepoint<R>(conn: &Connection, f: impl FnOnce(&dyn super::Store) -> Result<R>) -> Result<R> {
    // Prepared once: every job passes through here.
    let exec = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
    exec("SAVEPOINT job")?;
    match f(conn) {
        Ok(r) => {
            exec("RELEASE job")?;
            Ok(r)
        }
        Err(e) => {
            exec("ROLLBACK TO job")?;
            exec("RELEASE job")?;
            Err(e)
        }
    }
}

fn run(conn: Connection, rx: mpsc::Receiver<Message>) {
    let mut closing = None;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Job(job) => batch.push(job),
                Message::Close(done) => {
                    closing = Some(done);
                    break;
                }
            }
            if batch.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            commit(&conn, batch);
        }
        if closing.is_some() {
            break;
        }
    }
    let _ = super::checkpoint(&conn);
    drop(conn);
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

fn commit(conn: &Connection, batch: Vec<Job>) {
    if let Err(e) = conn
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]))
    {
        for job in batch {
            job(Err(&e))(None);
        }
        return;
    }
    let finishers: Vec<Finish> = batch.into_iter().map(|job| job(Ok(conn))).collect();
    if let Some(delay) = crate::fault::slow_commit() {
        std::thread::sleep(delay);
    }
    let commit = conn
        .prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]))
        .err();
    if commit.is_some() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for finish in finishers {
        finish(commit.as_ref());
    }
}
