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
use std::time::{Duration, Instant};

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
    pub(crate) fn spawn(conn: Conn, path: &Path) -> Result<Writer> {
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
    pub(crate) fn removed(&self) -> Option<String> {
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

    pub(crate) fn path(&self) -> &Path {
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
    pub(crate) async fn call<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnMut(&dyn super::Store) -> Result<R> + Send + 'static,
    {
        self.submit(f).await.map_err(|_| Error::WriterGone)?
    }

    /// [`Writer::call`] for a job whose last statement may be deferred (see [`Step`]).
    pub(crate) async fn call_step<R, F>(&self, f: F) -> Result<R>
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
    let mut carried: Carried = None;
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
                    let mut w = PgWriter {
                        conn: &conn,
                        s,
                        name: &writer,
                        token: &mut token,
                        waiting: &mut waiting,
                    };
                    carried = commit_postgres(&mut w, batch, begun);
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

/// How many times a batch runs again when the server asks for it (see [`Pending::retryable`]).
const RUN_AGAIN: u32 = 5;

/// The jobs of the next batch, gathered at a commit, and whether their transaction was begun in
/// that commit's round trip (PostgreSQL).
type Carried = Option<(Vec<Box<dyn Pending>>, bool)>;

/// The PostgreSQL writer as one batch sees it: the session, what names its transactions (to
/// ask afterwards whether one committed), and the jobs waiting.
struct PgWriter<'a> {
    conn: &'a Conn,
    s: &'a Session,
    /// This process's writer, in hex.
    name: &'a str,
    /// The token of its latest transaction.
    token: &'a mut i64,
    /// The jobs waiting, up to a number, without waiting for more.
    waiting: &'a mut dyn FnMut(usize) -> Vec<Box<dyn Pending>>,
}

/// A batch on PostgreSQL: its jobs, which of them failed alone, and how often the server asked
/// for it to run again.
struct Batch {
    jobs: Vec<Box<dyn Pending>>,
    /// Jobs that failed: answered with their error, not run again.
    skip: Vec<bool>,
    /// Runs of the batch the server asked for again.
    again: u32,
}

/// How one try of a batch ended.
enum Try {
    /// Every job is answered; the next batch, when jobs were gathered at the commit.
    Answered(Carried),
    /// The connection was lost: the batch is tried again after a pause, within its deadline.
    Lost,
    /// The batch runs again at once: without the job to blame, or because the server asked.
    Again,
}

/// Who is to blame for a batch that did not commit, among its jobs.
#[derive(Debug, PartialEq)]
enum Blame {
    /// No job that ran failed.
    Nobody,
    /// The first job that failed, set aside: it keeps its error, and the others run again
    /// without it, as if it had failed alone.
    Job,
    /// The first job that failed because the server asks for the transaction to run again:
    /// the whole batch does (its writes are undone with it).
    Server,
}

/// What a batch's commit did, or the sending of its deferred statements when it did not reach
/// its commit.
struct Sent {
    /// The commit's result; `None` when the batch did not reach it.
    committed: Option<crate::pg::error::Result<()>>,
    /// The jobs gathered at the commit for the next batch.
    next: Vec<Box<dyn Pending>>,
    /// The token of the transaction committed.
    token: i64,
}

/// The pace at which a batch whose connection was lost is tried again. Connections lost again
/// and again are tried for as long as one that cannot be made (see `postgres::patience`), with
/// a growing pause between tries: until the server has been silent that long when the
/// connection was first lost, counted from the batch's start or from the server's last answer,
/// whichever is later (a long wait for the writers' lock that ended with an answer is not
/// silence). Fixed then: a batch that loses its connection each time the server answers (a
/// statement that brings the server down) is not tried for ever.
struct Losses {
    started: Instant,
    deadline: Option<Instant>,
    pause: Duration,
    /// Times the connection was lost: the batch is tried again at least once whatever the
    /// deadline, since a process frozen mid-batch finds its session ended by the server on
    /// waking, its deadline long past while the server never stopped answering.
    count: u32,
}

impl Losses {
    fn new(started: Instant) -> Losses {
        Losses {
            started,
            deadline: None,
            pause: Duration::from_millis(50),
            count: 0,
        }
    }

    /// After a loss at `now`: the pause before the batch is tried again, or `None` when it is
    /// given up. `patience` and the session's `give_up_at` fix the deadline at the first loss.
    fn next_pause(
        &mut self,
        now: Instant,
        patience: Duration,
        give_up_at: Instant,
    ) -> Option<Duration> {
        self.count += 1;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| (self.started + patience).max(give_up_at));
        if self.count > 1 && now >= deadline {
            return None;
        }
        let pause = self.pause;
        self.pause = (pause * 2).min(Duration::from_secs(2));
        Some(pause)
    }
}

impl Batch {
    fn new(jobs: Vec<Box<dyn Pending>>) -> Batch {
        Batch {
            skip: vec![false; jobs.len()],
            jobs,
            again: 0,
        }
    }

    /// Jobs that arrived meanwhile join the batch.
    fn join(&mut self, more: Vec<Box<dyn Pending>>) {
        self.skip.extend(more.iter().map(|_| false));
        self.jobs.extend(more);
    }

    /// Answers every job: its result, or `failed`.
    fn answer(&mut self, failed: Option<String>) {
        answer_all(std::mem::take(&mut self.jobs), failed);
    }

    /// Who is to blame among the jobs that `ran`, in order, when nothing was committed: the
    /// first that failed (the server fails every statement of a transaction after one that
    /// failed). Set aside unless the server asked for the transaction to run again, which it
    /// does [`RUN_AGAIN`] times at most.
    fn blame(&mut self, ran: &[usize]) -> Blame {
        let Some(i) = ran.iter().copied().find(|&i| self.jobs[i].failed()) else {
            return Blame::Nobody;
        };
        if self.jobs[i].retryable() && self.again < RUN_AGAIN {
            Blame::Server
        } else {
            self.skip[i] = true;
            Blame::Job
        }
    }
}

/// Runs a batch in one transaction of the writers' lock and commits it (`begun`: its
/// transaction is open already), trying it again while its connection is lost (see
/// [`Losses`]). When more jobs wait by the time it commits, they are the next batch, returned
/// with whether its transaction was begun in the commit's own round trip (one round trip less
/// per batch while the writer is busy).
fn commit_postgres(w: &mut PgWriter<'_>, jobs: Vec<Box<dyn Pending>>, mut begun: bool) -> Carried {
    let mut batch = Batch::new(jobs);
    let mut losses = Losses::new(Instant::now());
    let mut lost = false;
    loop {
        if lost {
            let now = Instant::now();
            match losses.next_pause(now, super::postgres::patience(), w.s.give_up_at()) {
                Some(pause) => std::thread::sleep(pause),
                None => {
                    batch.answer(Some(
                        "the connection was lost in every transaction tried".into(),
                    ));
                    return None;
                }
            }
        }
        match w.try_batch(&mut batch, std::mem::take(&mut begun)) {
            Try::Answered(next) => return next,
            Try::Lost => lost = true,
            Try::Again => lost = false,
        }
    }
}

impl PgWriter<'_> {
    /// One try of the batch, in one transaction: begun (unless `begun`), its jobs run, then
    /// committed; or, when it did not commit, why.
    fn try_batch(&mut self, batch: &mut Batch, begun: bool) -> Try {
        if !begun && let Err(ended) = self.begin(batch) {
            return ended;
        }
        // The writers' lock is held from here to the commit.
        crate::fault::point("manifest-transaction");
        let ran = self.run_jobs(batch);
        let mut sent = self.send(batch, &ran);
        for &i in &ran {
            batch.jobs[i].settle(self.conn);
        }
        // When nothing was committed (the batch did not reach its commit, or the server refused
        // one of its statements), the first job that failed, in order, is the one to blame: the
        // server fails every statement of a transaction after one that failed. A commit that
        // happened is never run again: an answer that could not be made is its job's error.
        let refused = self.s.refused_commit();
        let blame = if !self.s.is_broken() && (sent.committed.is_none() || refused) {
            batch.blame(&ran)
        } else {
            Blame::Nobody
        };
        match (sent.committed.take(), blame) {
            (Some(Ok(())), Blame::Nobody) => {
                batch.answer(None);
                Try::Answered((!sent.next.is_empty()).then_some((sent.next, true)))
            }
            (Some(Err(e)), Blame::Nobody) => self.commit_failed(batch, &ran, e, sent),
            (_, blame) => self.not_committed(batch, &blame, sent.next),
        }
    }

    /// Begins the batch's transaction under a new token, on a connection made again first if
    /// it was lost. `Err`: how the try ends.
    fn begin(&mut self, batch: &mut Batch) -> Result<(), Try> {
        *self.token += 1;
        if self.s.is_broken()
            && let Err(e) = self.s.reconnect()
        {
            batch.answer(Some(format!("cannot start a transaction: {e}")));
            return Err(Try::Answered(None));
        }
        if let Err(e) = self.s.begin(self.name, *self.token) {
            if self.s.is_broken() {
                return Err(Try::Lost);
            }
            batch.answer(Some(format!("cannot start a transaction: {e}")));
            return Err(Try::Answered(None));
        }
        Ok(())
    }

    /// Runs the jobs, in order, up to the first that fails here or loses the connection. Those
    /// that came meanwhile join the batch, to commit with it rather than one round trip later.
    /// Returns the jobs that ran, in order.
    fn run_jobs(&mut self, batch: &mut Batch) -> Vec<usize> {
        let mut ran = Vec::new();
        let mut i = 0;
        loop {
            if i == batch.jobs.len() {
                // At most MAX_BATCH in all: a transaction lasts, and holds the writers' lock,
                // no longer than a batch did before it could grow, and its jobs' clock (read
                // when the lock was taken) is no older.
                let more = if batch.jobs.len() < MAX_BATCH {
                    (self.waiting)(MAX_BATCH - batch.jobs.len())
                } else {
                    Vec::new()
                };
                if more.is_empty() {
                    break;
                }
                batch.join(more);
            }
            if !batch.skip[i] {
                batch.jobs[i].run(self.conn);
                ran.push(i);
                if self.s.is_broken() || batch.jobs[i].failed() {
                    break;
                }
            }
            i += 1;
        }
        ran
    }

    /// Every job ran: the batch commits, its deferred statements sent first in the same round
    /// trip (and the next batch's transaction begun in it too, when jobs wait). Else the
    /// deferred statements are sent alone, to find the job to blame.
    fn send(&mut self, batch: &Batch, ran: &[usize]) -> Sent {
        let ran_all = !self.s.is_broken() && !ran.last().is_some_and(|&i| batch.jobs[i].failed());
        let token = *self.token;
        if !ran_all {
            // A connection lost here is seen by the caller (`is_broken`).
            let _ = self.s.flush();
            return Sent {
                committed: None,
                next: Vec::new(),
                token,
            };
        }
        if let Some(delay) = crate::fault::slow_commit() {
            std::thread::sleep(delay);
        }
        let next = (self.waiting)(MAX_BATCH);
        let committed = if next.is_empty() {
            self.s.commit()
        } else {
            tracing::trace!(
                jobs = next.len(),
                "the next batch begins in this commit's round trip"
            );
            *self.token += 1;
            self.s.commit_and_begin(self.name, *self.token)
        };
        Sent {
            committed: Some(committed),
            next,
            token,
        }
    }

    /// The batch did not commit: its transaction is rolled back, and it runs again, with the
    /// jobs gathered for the next batch. A job that failed is not a lost connection: the
    /// others run again at once.
    fn not_committed(
        &mut self,
        batch: &mut Batch,
        blame: &Blame,
        next: Vec<Box<dyn Pending>>,
    ) -> Try {
        self.s.rollback();
        let again = match blame {
            Blame::Nobody => Try::Lost,
            Blame::Job => Try::Again,
            Blame::Server => {
                batch.again += 1;
                tracing::info!(manifest = %self.s.shown(), attempt = batch.again, "the server asked for the manifest's transaction to run again");
                std::thread::sleep(Duration::from_millis(10 << batch.again));
                Try::Again
            }
        };
        // Jobs gathered for the next batch join this one.
        batch.join(next);
        again
    }

    /// The commit failed with `e`: did it happen? (The error may be the next transaction's,
    /// or the connection went during the commit.) Asked by the token the transaction recorded;
    /// `committed` connects again first when the connection is gone.
    fn commit_failed(
        &mut self,
        batch: &mut Batch,
        ran: &[usize],
        e: crate::pg::Error,
        sent: Sent,
    ) -> Try {
        let next = sent.next;
        let broken = self.s.is_broken();
        let known = if broken || !next.is_empty() {
            self.s.committed(self.name, sent.token)
        } else {
            Ok(false)
        };
        match known {
            Ok(true) => {
                if broken {
                    tracing::warn!(manifest = %self.s.shown(), "the manifest's connection was lost during a commit that happened; what it did not answer is read from the record: {e}");
                }
                // The answers that the connection took with it are read from the record.
                for &i in ran {
                    batch.jobs[i].recover(self.conn);
                }
                batch.answer(None);
                Try::Answered((!next.is_empty()).then_some((next, false)))
            }
            Ok(false) if broken => {
                tracing::warn!(manifest = %self.s.shown(), "the manifest's connection was lost during a commit that did not happen; running the jobs again: {e}");
                // The waiting jobs join this batch.
                batch.join(next);
                Try::Lost
            }
            Ok(false) => {
                self.s.rollback();
                batch.answer(Some(format!("commit failed: {e}")));
                Try::Answered((!next.is_empty()).then_some((next, false)))
            }
            Err(e2) => {
                batch.answer(Some(format!("commit failed: {e}; {e2}")));
                Try::Answered((!next.is_empty()).then_some((next, false)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that failed or not, as it says.
    struct Fake {
        failed: bool,
        retryable: bool,
    }

    impl Pending for Fake {
        fn run(&mut self, _: &Conn) {}
        fn settle(&mut self, _: &Conn) {}
        fn recover(&mut self, _: &Conn) {}
        fn failed(&self) -> bool {
            self.failed
        }
        fn retryable(&self) -> bool {
            self.retryable
        }
        fn answer(self: Box<Self>, _: Option<String>) {}
    }

    /// A batch of jobs that failed (`f`), failed for the server to run them again (`r`) or
    /// not (`-`).
    fn batch(jobs: &str) -> Batch {
        Batch::new(
            jobs.chars()
                .map(|c| {
                    Box::new(Fake {
                        failed: c != '-',
                        retryable: c == 'r',
                    }) as Box<dyn Pending>
                })
                .collect(),
        )
    }

    #[test]
    fn the_first_job_that_failed_among_those_that_ran_is_set_aside() {
        let mut b = batch("--f-f");
        assert_eq!(
            b.blame(&[0, 1]),
            Blame::Nobody,
            "those that ran did not fail"
        );
        assert_eq!(b.skip, [false; 5]);
        assert_eq!(b.blame(&[0, 1, 2, 3, 4]), Blame::Job);
        assert_eq!(b.skip, [false, false, true, false, false], "only the first");
        // Run again without it, the next is to blame.
        assert_eq!(b.blame(&[0, 1, 3, 4]), Blame::Job);
        assert_eq!(b.skip, [false, false, true, false, true]);
    }

    #[test]
    fn a_batch_the_server_asks_to_run_again_runs_whole_a_few_times_then_the_job_is_blamed() {
        let mut b = batch("-r-");
        assert_eq!(b.blame(&[0, 1]), Blame::Server);
        assert_eq!(
            b.skip, [false; 3],
            "nobody set aside: the whole batch runs again"
        );
        b.again = RUN_AGAIN;
        assert_eq!(b.blame(&[0, 1]), Blame::Job);
        assert_eq!(b.skip, [false, true, false]);
    }

    #[test]
    fn jobs_that_join_a_batch_are_run_like_the_others() {
        let mut b = batch("f");
        b.blame(&[0]);
        b.join(vec![Box::new(Fake {
            failed: false,
            retryable: false,
        })]);
        assert_eq!(b.jobs.len(), 2);
        assert_eq!(b.skip, [true, false]);
    }

    #[test]
    fn a_lost_batch_is_tried_again_with_growing_pauses_until_its_deadline() {
        let start = Instant::now();
        let patience = Duration::from_secs(30);
        let mut l = Losses::new(start);
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
        // The deadline is the later of the batch's start and the last answer, plus patience.
        let give_up_at = start + Duration::from_secs(40);
        assert_eq!(ms(l.next_pause(start, patience, give_up_at)), Some(50));
        assert_eq!(ms(l.next_pause(start, patience, give_up_at)), Some(100));
        // Fixed at the first loss: a later answer does not move it.
        let later = start + Duration::from_secs(100);
        assert_eq!(
            ms(l.next_pause(start + Duration::from_secs(39), patience, later)),
            Some(200)
        );
        assert_eq!(l.next_pause(give_up_at, patience, later), None);
        let mut l = Losses::new(start);
        let pauses: Vec<_> = (0..8)
            .map(|_| ms(l.next_pause(start, patience, start)).unwrap())
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
    }

    #[test]
    fn a_batch_lost_past_its_deadline_is_tried_again_once_all_the_same() {
        // A process frozen mid-batch for longer than its patience wakes to a session the
        // server ended: it tries once more before it gives up.
        let start = Instant::now();
        let mut l = Losses::new(start);
        let woke = start + Duration::from_secs(300);
        let patience = Duration::from_secs(30);
        assert!(l.next_pause(woke, patience, start).is_some());
        assert!(l.next_pause(woke, patience, start).is_none());
    }
}
