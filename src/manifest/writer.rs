//! The one writer thread that owns the manifest's write connection.
//!
//! Jobs arrive on a channel. The thread takes every job waiting (up to [`MAX_BATCH`]), runs them
//! in one `BEGIN IMMEDIATE` transaction, each inside its own savepoint (a failing job rolls back
//! alone), commits once, and only then answers each caller. An answered job is therefore
//! durable: this is group commit, and a `kill -9` never loses a state change that was
//! acknowledged.

use std::sync::mpsc;

use anyhow::{Context as _, anyhow};
use rusqlite::Connection;
use tokio::sync::oneshot;

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 1024;

/// Called after the commit with `None` on success or the commit error.
type Finish = Box<dyn FnOnce(Option<&str>) + Send>;
/// Runs against the open transaction; `None` when the transaction could not be started.
type Job = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;

/// A handle to the writer thread. Cheap to clone.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread on an open connection. The thread ends (closing the
    /// connection) when the last handle is dropped. It is never joined: every write a caller
    /// was told about is already committed, so nothing is lost if the process exits first.
    pub fn spawn(conn: Connection) -> anyhow::Result<Writer> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("manifest-writer".into())
            .spawn(move || run(conn, rx))
            .context("cannot start the manifest writer thread")?;
        Ok(Writer { tx })
    }

    /// Queues `f`; the receiver answers once the transaction that ran it has committed.
    pub fn submit<R, F>(&self, f: F) -> oneshot::Receiver<anyhow::Result<R>>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> anyhow::Result<R> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = match conn {
                Some(conn) => in_savepoint(conn, f),
                None => Err(anyhow!("cannot start a manifest transaction")),
            };
            Box::new(move |commit_error: Option<&str>| {
                let result = match commit_error {
                    None => result,
                    Some(e) => Err(anyhow!("manifest commit failed: {e}")),
                };
                let _ = reply.send(result);
            })
        });
        if self.tx.send(job).is_err() {
            let (reply, rx) = oneshot::channel();
            let _ = reply.send(Err(anyhow!("the manifest writer has stopped")));
            return rx;
        }
        rx
    }

    /// Runs `f` in the writer and waits until it is committed.
    pub async fn call<R, F>(&self, f: F) -> anyhow::Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> anyhow::Result<R> + Send + 'static,
    {
        self.submit(f)
            .await
            .map_err(|_| anyhow!("the manifest writer has stopped"))?
    }

    /// Like [`Writer::call`], for code outside the async runtime.
    pub fn call_blocking<R, F>(&self, f: F) -> anyhow::Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> anyhow::Result<R> + Send + 'static,
    {
        self.submit(f)
            .blocking_recv()
            .map_err(|_| anyhow!("the manifest writer has stopped"))?
    }
}

fn in_savepoint<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    conn.execute_batch("SAVEPOINT job")?;
    match f(conn) {
        Ok(r) => {
            conn.execute_batch("RELEASE job")?;
            Ok(r)
        }
        Err(e) => {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")?;
            Err(e)
        }
    }
}

fn run(conn: Connection, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if conn.execute_batch("BEGIN IMMEDIATE").is_err() {
            for job in batch {
                job(None)(Some("cannot start a transaction"));
            }
            continue;
        }
        let finishers: Vec<Finish> = batch.into_iter().map(|job| job(Some(&conn))).collect();
        let commit = conn.execute_batch("COMMIT").err().map(|e| e.to_string());
        if commit.is_some() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for finish in finishers {
            finish(commit.as_deref());
        }
    }
}
