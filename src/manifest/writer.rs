//! The one writer thread that owns the manifest's write connection.
//!
//! Jobs arrive on a channel. The thread takes every job waiting (up to [`MAX_BATCH`]), runs them
//! in one `BEGIN IMMEDIATE` transaction, each inside its own savepoint (a failing job rolls back
//! alone), commits once, and only then answers each caller. An answered job is therefore
//! durable: this is group commit, and a `kill -9` never loses a state change that was
//! acknowledged. [`Writer::close`] checkpoints the WAL into the database file.
//!
//! On PostgreSQL the batch's transaction first takes the writers' lock (see
//! `manifest::postgres`). A connection lost before the commit is made again, with a growing
//! pause, and the batch runs again in a new transaction (a job is therefore `FnMut`: it only
//! reads and writes the manifest, and runs once in the transaction that commits). A connection
//! lost during `COMMIT` is asked afterwards whether the commit happened, by the token the
//! transaction recorded.
//!
//! A job's last statement may be deferred on PostgreSQL (a [`Step::Later`]: its answer is
//! needed by nothing else in the job): the batch's deferred statements go to the server
//! together, pipelined in the round trip of the batch's `COMMIT` (and of the next batch's
//! `BEGIN`, when jobs wait), and each job's answer is made from its rows then. So a batch of
//! such jobs costs one round trip however many it holds. When a deferred statement failed, the
//! server rolled the transaction back: the first job that failed, in order, is to blame (every
//! later statement fails with it), and the others run again without it. When the connection is lost
//! during that round trip and the server did commit, each answer the connection took with it
//! is read again from what its job recorded ([`super::db::Deferred`]).
//!
//! Jobs that arrive while a PostgreSQL batch's jobs run (each statement that is not deferred
//! is a round trip) join that batch before it commits, up to `MAX_BATCH` in all: a busy
//! writer commits what waits in the round trip it sends anyway, instead of one later.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use tokio::sync::oneshot;

use super::db::{Conn, Recover, Step};
use super::postgres::Session;
use super::{Error, Result};

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 1024;

/// A queued job: run in the batch's transaction (again, should that not commit), then answered.
trait Pending: Send {
    fn run(&mut self, conn: &Conn);
    /// Makes its answer from its deferred statement's rows, once the batch's were sent.
    fn settle(&mut self, conn: &Conn);
    /// Reads its answer again from the committed record, when its rows were lost with the
    /// connection after the server committed.
    fn recover(&mut self, conn: &Conn);
    /// Whether its last run failed.
    fn failed(&self) -> bool;
    /// Whether its last run failed because the server asks for the transaction to run again
    /// (a serialization failure, a deadlock): then the whole batch runs again.
    fn retryable(&self) -> bool;
    /// Answers the caller: the job's result, or `failed` (the transaction did not commit).
    fn answer(self: Box<Self>, failed: Option<String>);
}

struct Job<R, F> {
    f: F,
    result: Option<Result<R>>,
    /// Its last run's deferred statement, not answered yet.
    later: Option<Step<R>>,
    /// How its deferred statement's answer is read again (see [`Pending::recover`]).
    recover: Option<Recover<R>>,
    reply: oneshot::Sender<Result<R>>,
    path: PathBuf,
}

impl<R, F> Pending for Job<R, F>
where
    R: Send + 'static,
    F: FnMut(&dyn super::Store) -> Result<Step<R>> + Send,
{
    fn run(&mut self, conn: &Conn) {
        self.later = None;
        self.recover = None;
        self.result = match in_savepoint(conn, &mut self.f) {
            Ok(Step::Done(r)) => Some(Ok(r)),
            Ok(later) => {
                self.later = Some(later);
                None
            }
            Err(e) => Some(Err(e)),
        };
    }

    fn settle(&mut self, conn: &Conn) {
        if let Some(later) = self.later.take() {
            let (answer, recover) = later.settle(conn);
            self.result = Some(answer);
            self.recover = recover;
        }
    }

    fn recover(&mut self, conn: &Conn) {
        if matches!(self.result, Some(Err(_)))
            && let Some(recover) = self.recover.take()
        {
            self.result = Some(recover(conn));
        }
    }

    fn failed(&self) -> bool {
        matches!(self.result, Some(Err(_)))
    }

    fn retryable(&self) -> bool {
        matches!(&self.result, Some(Err(Error::Pg(e))) if e.kind() == crate::pg::Kind::Retryable)
    }

    fn answer(self: Box<Self>, failed: Option<String>) {
        let result = match failed {
            None => self
                .result
                .unwrap_or_else(|| Err(Error::Invalid("the job did not run".into()))),
            Some(why) => Err(Error::Invalid(why)),
        };
        let path = self.path;
        let _ = self.reply.send(result.map_err(|e| match e {
            Error::Invalid(why) => Error::Invalid(format!("{}: {why}", path.display())),
            other => other.at(&path),
        }));
    }
}

enum Message {
    Job(Box<dyn Pending>),
    /// Checkpoint, close the connection, and answer.
    Close(std::sync::mpsc::Sender<()>),
}

/// A handle to the writer thread. Cheap to clone.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Message>,
    path: PathBuf,
    /// A SQLite manifest's file as it was opened: its device and inode (see
    /// [`Writer::removed`]).
    file: Option<(u64, u64)>,
}

impl Writer {
    /// Starts the writer thread on an open connection to the manifest at `path`. The thread
    /// ends when [`Writer::close`] is called or the last handle is dropped. Every write a
    /// caller was told about is already committed, so nothing is lost if the process exits
    /// without closing.
    pub fn spawn(conn: Conn, path: &Path) -> Result<Writer> {
        let mut file = None;
        if let Conn::Sqlite(c) = &conn {
            // Every statement of the runner's writes stays prepared (rusqlite keeps 16 by
            // default, fewer than the writes of one try use).
            c.set_prepared_statement_cache_capacity(64);
            file = file_id(path);
        }
        let (tx, rx) = mpsc::channel::<Message>();
        std::thread::Builder::new()
            .name("manifest-writer".into())
            .spawn(move || run(conn, rx))
            .map_err(|e| Error::Invalid(format!("cannot start the manifest writer thread: {e}")))?;
        Ok(Writer {
            tx,
            path: path.to_path_buf(),
            file,
        })
    }

    /// Why the manifest's file is no longer at its path: removed (its connection, open, still
    /// writes the file, which is lost once closed), or another file put in its place. `None`
    /// while it is there, and for a manifest in PostgreSQL.
    pub fn removed(&self) -> Option<String> {
        let opened = self.file?;
        match file_id(&self.path) {
            Some(now) if now == opened => None,
            Some(_) => Some(format!(
                "the manifest {} was replaced by another file while this command ran: what it recorded since went to the file it replaced, which is lost",
                self.path.display()
            )),
            None => Some(format!(
                "the manifest {} was removed while this command ran: what it recorded is lost with the file",
                self.path.display()
            )),
        }
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
    pub fn submit<R, F>(&self, mut f: F) -> oneshot::Receiver<Result<R>>
    where
        R: Send + 'static,
        F: FnMut(&dyn super::Store) -> Result<R> + Send + 'static,
    {
        self.submit_step(move |c| f(c).map(Step::Done))
    }

    /// [`Writer::submit`] for a job whose last statement may be deferred (see [`Step`]).
    pub fn submit_step<R, F>(&self, f: F) -> oneshot::Receiver<Result<R>>
    where
        R: Send + 'static,
        F: FnMut(&dyn super::Store) -> Result<Step<R>> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job = Box::new(Job {
            f,
            result: None,
            later: None,
            recover: None,
            reply,
            path: self.path.clone(),
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
        F: FnMut(&dyn super::Store) -> Result<R> + Send + 'static,
    {
        self.submit(f).await.map_err(|_| Error::WriterGone)?
    }

    /// [`Writer::call`] for a job whose last statement may be deferred (see [`Step`]).
    pub async fn call_step<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnMut(&dyn super::Store) -> Result<Step<R>> + Send + 'static,
    {
        self.submit_step(f).await.map_err(|_| Error::WriterGone)?
    }

    /// Like [`Writer::call`], for code outside the async runtime.
    pub fn call_blocking<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnMut(&dyn super::Store) -> Result<R> + Send + 'static,
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

/// The device and inode of the file at `path`.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn in_savepoint<R>(
    conn: &Conn,
    f: &mut dyn FnMut(&dyn super::Store) -> Result<Step<R>>,
) -> Result<Step<R>> {
    match conn {
        Conn::Sqlite(c) => {
            // Prepared once: every job passes through here.
            let exec = |sql: &str| c.prepare_cached(sql).and_then(|mut s| s.execute([]));
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
        // No savepoint (two statements more per job, and a subtransaction on the server): a
        // job that fails rolls the whole transaction back, and the others run again without it
        // (see `commit_postgres`).
        Conn::Pg(_) => f(conn),
    }
}

fn run(conn: Conn, rx: mpsc::Receiver<Message>) {
    // This process's writer, in hex: it is written into the writer's statements.
    let writer = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        crate::liveness::Host::name(&crate::process::LOCAL).hash(&mut h);
        format!(
            "{:x}-{:x}-{:x}",
            h.finish(),
            std::process::id(),
            crate::clock::now_ms()
        )
    };
    let mut token = 0;
    let mut closing = None;
    // The next batch, gathered at the previous one's commit, and whether its transaction was
    // begun in that commit's round trip (PostgreSQL).
    let mut carried: Option<(Vec<Box<dyn Pending>>, bool)> = None;
    loop {
        let (batch, begun) = match carried.take() {
            Some(next) => next,
            None => {
                let Ok(first) = rx.recv() else {
                    break;
                };
                (gather(Some(first), &rx, &mut closing, MAX_BATCH), false)
            }
        };
        if !batch.is_empty() {
            match &conn {
                Conn::Sqlite(c) => commit_sqlite(&conn, c, batch),
                Conn::Pg(s) => {
                    let mut waiting = |most| {
                        if closing.is_some() {
                            Vec::new()
                        } else {
                            gather(None, &rx, &mut closing, most)
                        }
                    };
                    carried = commit_postgres(
                        &conn,
                        s,
                        (&writer, &mut token),
                        batch,
                        begun,
                        &mut waiting,
                    );
                }
            }
        }
        if closing.is_some() && carried.is_none() {
            break;
        }
    }
    if let Conn::Sqlite(c) = &conn {
        let _ = super::checkpoint(c);
    }
    drop(conn);
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

/// The jobs waiting (after `first`), up to `most` (at least one), without waiting for more; a
/// close request ends the gathering and is kept in `closing`.
fn gather(
    first: Option<Message>,
    rx: &mpsc::Receiver<Message>,
    closing: &mut Option<mpsc::Sender<()>>,
    most: usize,
) -> Vec<Box<dyn Pending>> {
    let mut batch = Vec::new();
    let mut next = first.or_else(|| rx.try_recv().ok());
    while let Some(message) = next.take() {
        match message {
            Message::Job(job) => batch.push(job),
            Message::Close(done) => {
                *closing = Some(done);
                break;
            }
        }
        if batch.len() < most {
            next = rx.try_recv().ok();
        }
    }
    batch
}

fn answer_all(batch: Vec<Box<dyn Pending>>, failed: Option<String>) {
    for job in batch {
        job.answer(failed.clone());
    }
}

fn commit_sqlite(conn: &Conn, c: &rusqlite::Connection, mut batch: Vec<Box<dyn Pending>>) {
    let _open = crate::fault::manifest_tx();
    if let Err(e) = c
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]))
    {
        let holder = match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy) => c
                .path()
                .map(|p| crate::sqlite::locked_by(std::path::Path::new(p)))
                .unwrap_or_default(),
            _ => String::new(),
        };
        return answer_all(
            batch,
            Some(format!("cannot start a transaction: {e}{holder}")),
        );
    }
    for job in &mut batch {
        job.run(conn);
        job.settle(conn);
    }
    if let Some(delay) = crate::fault::slow_commit() {
        std::thread::sleep(delay);
    }
    let commit = c
        .prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]))
        .err();
    if commit.is_some() {
        let _ = c.execute_batch("ROLLBACK");
    }
    answer_all(batch, commit.map(|e| format!("commit failed: {e}")));
}

/// Runs a batch in one transaction of the writers' lock and commits it (`begun`: its
/// transaction is open already). When more jobs wait by the time it commits, they are the next
/// batch, returned with whether its transaction was begun in the commit's own round trip (one
/// round trip less per batch while the writer is busy).
/// How many times a batch runs again when the server asks for it (see [`Pending::retryable`]).
const RUN_AGAIN: u32 = 5;

fn commit_postgres(
    conn: &Conn,
    s: &Session,
    (writer, token): (&str, &mut i64),
    mut batch: Vec<Box<dyn Pending>>,
    mut begun: bool,
    waiting: &mut dyn FnMut(usize) -> Vec<Box<dyn Pending>>,
) -> Option<(Vec<Box<dyn Pending>>, bool)> {
    // Connections lost again and again are tried for as long as one that cannot be made (see
    // `postgres::patience`), with a growing pause between tries: until the server has been
    // silent that long when the connection was first lost, counted from the batch's start or
    // from the server's last answer, whichever is later (a long wait for the writers' lock that
    // ended with an answer is not silence). Fixed then: a batch that loses its connection each
    // time the server answers (a statement that brings the server down) is not tried for ever.
    let started = std::time::Instant::now();
    let mut deadline = None;
    let mut pause = std::time::Duration::from_millis(50);
    // Jobs that failed: answered with their error, not run again.
    let mut skip = vec![false; batch.len()];
    let mut lost = false;
    // Runs of the batch the server asked for again.
    let mut again = 0;
    // Times the connection was lost: the batch is tried again at least once whatever the
    // deadline, since a process frozen mid-batch finds its session ended by the server on
    // waking, its deadline long past while the server never stopped answering.
    let mut losses = 0;
    loop {
        if lost {
            losses += 1;
            let deadline = *deadline
                .get_or_insert_with(|| (started + super::postgres::patience()).max(s.give_up_at()));
            if losses > 1 && std::time::Instant::now() >= deadline {
                answer_all(
                    batch,
                    Some("the connection was lost in every transaction tried".into()),
                );
                return None;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
        }
        lost = true;
        if !std::mem::take(&mut begun) {
            *token += 1;
            if s.is_broken()
                && let Err(e) = s.reconnect()
            {
                answer_all(batch, Some(format!("cannot start a transaction: {e}")));
                return None;
            }
            if let Err(e) = s.begin(writer, *token) {
                if s.is_broken() {
                    continue;
                }
                answer_all(batch, Some(format!("cannot start a transaction: {e}")));
                return None;
            }
        }
        // The writers' lock is held from here to the commit.
        crate::fault::point("manifest-transaction");
        // The jobs run, in order, up to the first that fails here. Those that came meanwhile
        // join the batch, to commit with it rather than one round trip later.
        let mut ran = Vec::new();
        let mut i = 0;
        loop {
            if i == batch.len() {
                // At most MAX_BATCH in all: a transaction lasts, and holds the writers' lock,
                // no longer than a batch did before it could grow, and its jobs' clock (read
                // when the lock was taken) is no older.
                let more = if batch.len() < MAX_BATCH {
                    waiting(MAX_BATCH - batch.len())
                } else {
                    Vec::new()
                };
                if more.is_empty() {
                    break;
                }
                skip.extend(more.iter().map(|_| false));
                batch.extend(more);
            }
            if !skip[i] {
                batch[i].run(conn);
                ran.push(i);
                if s.is_broken() || batch[i].failed() {
                    break;
                }
            }
            i += 1;
        }
        // Every job ran: the batch commits, its deferred statements sent first in the same
        // round trip. Else they are sent alone, to find the job to blame.
        let ran_all = !s.is_broken() && !ran.last().is_some_and(|&i| batch[i].failed());
        let mut next = Vec::new();
        let this = *token;
        let committed = if ran_all {
            if let Some(delay) = crate::fault::slow_commit() {
                std::thread::sleep(delay);
            }
            next = waiting(MAX_BATCH);
            Some(if next.is_empty() {
                s.commit()
            } else {
                tracing::trace!(
                    jobs = next.len(),
                    "the next batch begins in this commit's round trip"
                );
                *token += 1;
                s.commit_and_begin(writer, *token)
            })
        } else {
            // A connection lost here is seen below (`is_broken`).
            let _ = s.flush();
            None
        };
        for &i in &ran {
            batch[i].settle(conn);
        }
        // When nothing was committed (the batch did not reach its commit, or the server refused
        // one of its statements), the first job that failed, in order, is the one to blame: the
        // server fails every statement of a transaction after one that failed. A commit that
        // happened is never run again: an answer that could not be made is its job's error.
        let refused = s.refused_commit();
        let (mut failed, mut retry) = (false, false);
        if !s.is_broken()
            && (committed.is_none() || refused)
            && let Some(i) = ran.iter().copied().find(|&i| batch[i].failed())
        {
            if batch[i].retryable() && again < RUN_AGAIN {
                // The whole transaction runs again (its writes are undone with it).
                retry = true;
            } else {
                // Its writes are undone with everyone's; it keeps its error, the others run
                // again without it, as if it had failed alone.
                skip[i] = true;
                failed = true;
            }
        }
        let committed = match committed {
            Some(committed) if !failed && !retry => committed,
            _ => {
                s.rollback();
                // A job that failed is not a lost connection: the others run again at once.
                lost = !failed && !retry;
                if retry {
                    again += 1;
                    tracing::info!(manifest = %s.shown(), attempt = again, "the server asked for the manifest's transaction to run again");
                    std::thread::sleep(std::time::Duration::from_millis(10 << again));
                }
                // Jobs gathered for the next batch join this one.
                skip.extend(next.iter().map(|_| false));
                batch.extend(next);
                continue;
            }
        };
        let e = match committed {
            Ok(()) => {
                answer_all(batch, None);
                return (!next.is_empty()).then_some((next, true));
            }
            Err(e) => e,
        };
        // Did it commit? (The error may be the next transaction's, or the connection went
        // during the commit.)
        // (`committed` connects again first when the connection is gone.)
        let broken = s.is_broken();
        let known = if broken || !next.is_empty() {
            s.committed(writer, this)
        } else {
            Ok(false)
        };
        match known {
            Ok(true) => {
                if broken {
                    tracing::warn!(manifest = %s.shown(), "the manifest's connection was lost during a commit that happened; what it did not answer is read from the record: {e}");
                }
                // The answers that the connection took with it are read from the record.
                for &i in &ran {
                    batch[i].recover(conn);
                }
                answer_all(batch, None);
                return (!next.is_empty()).then_some((next, false));
            }
            Ok(false) if broken => {
                tracing::warn!(manifest = %s.shown(), "the manifest's connection was lost during a commit that did not happen; running the jobs again: {e}");
                // The waiting jobs join this batch.
                skip.extend(next.iter().map(|_| false));
                batch.extend(next);
            }
            Ok(false) => {
                s.rollback();
                answer_all(batch, Some(format!("commit failed: {e}")));
                return (!next.is_empty()).then_some((next, false));
            }
            Err(e2) => {
                answer_all(batch, Some(format!("commit failed: {e}; {e2}")));
                return (!next.is_empty()).then_some((next, false));
            }
        }
    }
}
