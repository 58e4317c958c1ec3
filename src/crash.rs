//! A panic ends the process at once, whichever thread it happens on.
//!
//! A panic is a bug, or a resource the program could not get where the libraries it uses give
//! no error: tokio panics when the operating system refuses a thread (`OS can't spawn worker
//! thread`), or the pipe its signal handling needs. Unwinding from there is not safe: a runtime
//! being built waits, as it unwinds, for a worker thread that nothing will ever wake, and every
//! other thread then waits for ever (signals included, since the thread that would have acted
//! on them is the one waiting). So the hook [`install`]ed first thing in `main` says what
//! failed as an internal error, says how to take the backfill up again, and aborts the process:
//! a crash, which the manifest is built to survive (as a `kill -9`), and which `backfill resume`
//! takes over from. Rust's own answer to an allocation that fails is the same abort.
//!
//! Where a panic must become an error instead, the code runs under [`catching`]: the hook then
//! lets it unwind to there (only in code that holds no lock or thread another waits for).
//!
//! The runner still turns a task's `JoinError` into an error ("publish panicked: ..."): in the
//! binary it can only be a task that was cancelled, as the hook ends the process before a panic
//! reaches a join handle; the library without the hook (its own tests) unwinds as Rust does.

use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};

/// How long the hook may take to end the process before SIGALRM ends it.
const ALARM_SECS: u32 = 5;

/// The backfill this process runs (0 for none yet), for the hook's message.
static BACKFILL: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// Whether a panic on this thread is caught by [`catching`] rather than ending the process.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
}

/// Installs the hook. Called first thing in `main`.
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        if CATCHING.with(Cell::get) {
            return;
        }
        // Whatever happens below, the process ends: out of memory, saying what failed or
        // capturing the backtrace fails to allocate, and a process under an address-space
        // limit was once seen to stay alive after Rust's own "memory allocation failed"
        // message. SIGALRM's default action ends it.
        nix::unistd::alarm::set(ALARM_SECS);
        let what = message(info.payload());
        let thread = std::thread::current();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        // Written as it can be: a stderr that fails must not stop the abort.
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "error: internal error: {what} (thread '{}'{at})",
            thread.name().unwrap_or("unnamed")
        );
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            let _ = writeln!(err, "{backtrace}");
        }
        let _ = writeln!(err, "error: {}", after());
        std::process::abort();
    }));
}

/// What the hook says after the error: how to go on.
fn after() -> String {
    match BACKFILL.load(Ordering::Relaxed) {
        0 => "the process stops here; `backfill list` shows a backfill it may have left running, and `backfill resume ID` takes one up again".into(),
        id => format!(
            "the process stops here; backfill {id} stays resumable: `backfill resume {id}` takes it up again"
        ),
    }
}

/// Records the backfill this process runs, for the hook's message.
pub(crate) fn running(backfill_id: i64) {
    BACKFILL.store(backfill_id, Ordering::Relaxed);
}

/// The text of a panic's payload.
fn message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}

/// Runs `f`, turning a panic on this thread into an error that carries its message. Only for
/// code that leaves nothing waiting when it unwinds (no thread started, no lock held).
pub(crate) fn catching<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let before = CATCHING.with(|c| c.replace(true));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(before));
    caught.map_err(|payload| message(&*payload).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_an_error_with_its_message() {
        assert_eq!(catching(|| 7), Ok(7));
        let e = catching(|| -> u8 { panic!("no pipe: {}", 24) }).unwrap_err();
        assert_eq!(e, "no pipe: 24");
        assert!(!CATCHING.with(Cell::get));
    }
}
