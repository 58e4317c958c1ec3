//! The heartbeat of an owner while it recovers and plans, before the runner's own heartbeat
//! starts: a backfill whose recovery or planning takes longer than the lease timeout must not
//! look dead to other processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::{HEARTBEAT, now_ms};
use crate::manifest::writer::Writer;
use crate::manifest::{self, Owner};

/// Writes the owner's heartbeat every [`HEARTBEAT`] until dropped.
pub(crate) struct Beating {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Beating {
    pub(crate) fn start(writer: &Writer, owner: Owner) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s) = (writer.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::park_timeout(HEARTBEAT);
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    let beat = w.call_blocking(move |c| c.heartbeat(owner, now_ms()));
                    if let Err(manifest::Error::Fenced { .. }) = beat {
                        break;
                    }
                }
            })
            .ok();
        Self { stop, thread }
    }
}

impl Drop for Beating {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
