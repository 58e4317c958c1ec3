//! Where a manifest session stands: inside a transaction or not, and whether its connection
//! can be used, as one value (the states, their transitions and why they are so are told in
//! `manifest::postgres`).
//!
//! Only bookkeeping: the session does the talking, and moves its state with these transitions,
//! so that their rules are tested here without a server.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::state::BackfillState;

/// A backfill's (or a worker's) epoch and state, read under the writers' lock.
pub(super) type Fence = (i64, BackfillState);

/// What a session knows of the transaction it is in.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Tx {
    /// The transaction's "now" (unix milliseconds), read when its lock was taken: none until
    /// the round trip that took it answered, nor in a migration's transaction.
    pub now: Option<i64>,
    /// Backfills' epochs and states read in this transaction (workers' by their negated id),
    /// see `Conn::fenced`: the writers' lock keeps them true until the commit, unless this
    /// transaction writes them.
    pub fences: HashMap<i64, Fence>,
}

/// The state of a session (see `manifest::postgres` for the why of each).
#[derive(Debug, PartialEq)]
pub(super) enum State {
    /// Outside a transaction, on a connection not known to be lost: a statement that finds it
    /// lost makes it again and runs again (every statement outside a transaction reads, or
    /// commits alone).
    Idle,
    /// Inside a transaction (the writer's, or a migration's): a connection lost now is not
    /// made again, since what the transaction did is gone with it.
    InTx(Tx),
    /// The connection was lost, or went silent, inside a transaction: nothing more of it
    /// reaches the server, which rolls it back. It stays the session's transaction until it is
    /// ended on this side (committed or rolled back), and only then is the connection made
    /// again.
    LostInTx(Tx),
    /// Outside a transaction, the connection is lost or in no known state (silent, or a
    /// failed `PREPARE` of the writer's `BEGIN`): made again before the next statement.
    Lost,
    /// Making the connection again was given up `at` that instant: until the patience has
    /// passed since, every attempt fails at once, so that a process that lost its manifest
    /// ends without waiting again for each record it would write.
    GaveUp { at: Instant },
}

impl State {
    /// Inside a transaction, its connection lost or not: statements are deferred, and a lost
    /// connection is not made again.
    pub(crate) fn in_tx(&self) -> bool {
        matches!(self, State::InTx(_) | State::LostInTx(_))
    }

    /// Whether the connection is known to be lost (the session also asks the connection
    /// whether it closed).
    pub(crate) fn is_lost(&self) -> bool {
        matches!(
            self,
            State::LostInTx(_) | State::Lost | State::GaveUp { .. }
        )
    }

    /// The transaction the session is in.
    pub(crate) fn tx(&self) -> Option<&Tx> {
        match self {
            State::InTx(tx) | State::LostInTx(tx) => Some(tx),
            _ => None,
        }
    }

    fn tx_mut(&mut self) -> Option<&mut Tx> {
        match self {
            State::InTx(tx) | State::LostInTx(tx) => Some(tx),
            _ => None,
        }
    }

    /// Whether making the connection again fails at once: it was given up less than
    /// `patience` ago.
    pub(crate) fn refuses_reconnecting(&self, patience: Duration) -> bool {
        matches!(self, State::GaveUp { at } if at.elapsed() < patience)
    }

    /// Whether a statement asked now starts the count of the server's silence afresh, when
    /// nothing was asked for longer than the patience: outside a transaction, unless making
    /// the connection again was given up (that silence is the server's).
    pub(crate) fn asks_afresh(&self) -> bool {
        matches!(self, State::Idle | State::Lost)
    }

    /// A transaction begins on this side (its `BEGIN` is about to be sent): with no clock and
    /// no fences yet. Begun inside another, that one was committed in the same round trip. On
    /// a connection known to be lost, it is lost at once: nothing of it reaches the server.
    pub(crate) fn begin(&mut self) {
        *self = match self {
            State::Idle | State::InTx(_) => State::InTx(Tx::default()),
            State::LostInTx(_) | State::Lost | State::GaveUp { .. } => {
                State::LostInTx(Tx::default())
            }
        };
    }

    /// The transaction's `BEGIN` was answered: its clock, and the fences read with its lock.
    pub(crate) fn begun(&mut self, now: i64, fences: HashMap<i64, Fence>) {
        if let Some(tx) = self.tx_mut() {
            tx.now = Some(now);
            tx.fences = fences;
        }
    }

    /// A fence read in the transaction (ignored outside one: nothing keeps it true then).
    /// Whether it was kept.
    pub(crate) fn remember(&mut self, key: i64, fence: Fence) -> bool {
        match self.tx_mut() {
            Some(tx) => {
                tx.fences.insert(key, fence);
                true
            }
            None => false,
        }
    }

    /// The transaction wrote a backfill or a worker: what it read of them is forgotten.
    pub(crate) fn forget_fences(&mut self) {
        if let Some(tx) = self.tx_mut() {
            tx.fences.clear();
        }
    }

    /// The connection was lost, or a round trip got no answer in time.
    pub(crate) fn lose(&mut self) {
        *self = match std::mem::replace(self, State::Idle) {
            State::Idle => State::Lost,
            State::InTx(tx) => State::LostInTx(tx),
            other => other,
        };
    }

    /// The transaction ended on this side (committed, rolled back, or given up with its
    /// connection).
    pub(crate) fn end(&mut self) {
        *self = match std::mem::replace(self, State::Idle) {
            State::InTx(_) => State::Idle,
            State::LostInTx(_) => State::Lost,
            other => other,
        };
    }

    /// A new connection replaces the old. Only ever done outside a transaction; were it done
    /// inside one, the transaction would go on, on this side, on the new connection.
    pub(crate) fn reconnected(&mut self) {
        *self = match std::mem::replace(self, State::Idle) {
            State::InTx(tx) | State::LostInTx(tx) => State::InTx(tx),
            State::Idle | State::Lost | State::GaveUp { .. } => State::Idle,
        };
    }

    /// Making the connection again was given up `at` that instant. Only ever done outside a
    /// transaction; inside one, the transaction is lost.
    pub(crate) fn give_up(&mut self, at: Instant) {
        *self = match std::mem::replace(self, State::Idle) {
            State::InTx(tx) | State::LostInTx(tx) => State::LostInTx(tx),
            State::Idle | State::Lost | State::GaveUp { .. } => State::GaveUp { at },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(30);

    fn fence(epoch: i64) -> Fence {
        (epoch, BackfillState::Running)
    }

    /// A transaction begun and answered, at `now`, with backfill 7's fence.
    fn begun(now: i64) -> State {
        let mut s = State::Idle;
        s.begin();
        s.begun(now, HashMap::from([(7, fence(1))]));
        s
    }

    #[test]
    fn a_transaction_has_its_clock_and_fences_once_begun_and_none_after() {
        let mut s = State::Idle;
        assert!(!s.in_tx() && !s.is_lost() && s.tx().is_none());
        s.begin();
        assert_eq!(s, State::InTx(Tx::default()), "no clock before the lock");
        s.begun(1000, HashMap::from([(7, fence(1))]));
        let tx = s.tx().unwrap();
        assert_eq!((tx.now, tx.fences.get(&7)), (Some(1000), Some(&fence(1))));
        s.end();
        assert_eq!(s, State::Idle);
        assert!(
            s.tx().is_none(),
            "nothing read in a transaction outlives it"
        );
    }

    #[test]
    fn a_transaction_begun_in_a_commits_round_trip_starts_with_nothing_of_the_one_before() {
        let mut s = begun(1000);
        s.begin();
        assert_eq!(s, State::InTx(Tx::default()));
    }

    #[test]
    fn fences_are_kept_inside_a_transaction_only_and_forgotten_when_it_writes() {
        let mut s = State::Idle;
        assert!(
            !s.remember(7, fence(1)),
            "outside a transaction nothing holds it"
        );
        assert!(s.tx().is_none());
        let mut s = begun(1000);
        assert!(s.remember(-3, fence(2)));
        assert_eq!(s.tx().unwrap().fences.len(), 2);
        s.forget_fences();
        assert!(s.tx().unwrap().fences.is_empty());
        assert_eq!(s.tx().unwrap().now, Some(1000), "the clock stays");
    }

    #[test]
    fn a_connection_lost_inside_a_transaction_is_made_again_only_once_it_ended() {
        let mut s = begun(1000);
        s.lose();
        assert!(s.is_lost());
        assert!(
            s.in_tx(),
            "not made again mid-way: it stays the session's transaction"
        );
        assert_eq!(
            s.tx().unwrap().now,
            Some(1000),
            "its clock stays what it read"
        );
        assert!(s.remember(8, fence(1)), "still the transaction's");
        s.lose();
        assert!(matches!(s, State::LostInTx(_)), "lost twice is lost");
        s.end();
        assert_eq!(s, State::Lost, "ended on this side, still to be made again");
        assert!(!s.in_tx() && s.is_lost());
        s.reconnected();
        assert_eq!(s, State::Idle);
    }

    #[test]
    fn a_connection_lost_outside_a_transaction_is_made_again_before_the_next_statement() {
        let mut s = State::Idle;
        s.lose();
        assert_eq!(s, State::Lost);
        assert!(s.is_lost() && !s.in_tx());
        s.end();
        assert_eq!(s, State::Lost, "no transaction to end");
        s.reconnected();
        assert_eq!(s, State::Idle);
    }

    #[test]
    fn a_transaction_begun_on_a_lost_connection_is_lost_at_once() {
        for mut s in [State::Lost, State::GaveUp { at: Instant::now() }] {
            s.begin();
            assert_eq!(s, State::LostInTx(Tx::default()));
            s.end();
            assert_eq!(s, State::Lost);
        }
    }

    #[test]
    fn a_session_that_gave_up_refuses_at_once_for_the_patience_then_tries_again() {
        let mut s = State::Lost;
        s.give_up(Instant::now());
        assert!(s.is_lost() && !s.in_tx());
        assert!(s.refuses_reconnecting(PATIENCE));
        // Neither losing again nor ending a transaction it is not in changes that.
        s.lose();
        s.end();
        assert!(s.refuses_reconnecting(PATIENCE));
        let long_ago = Instant::now().checked_sub(PATIENCE * 2);
        if let Some(at) = long_ago {
            let s = State::GaveUp { at };
            assert!(
                !s.refuses_reconnecting(PATIENCE),
                "tried again after the patience"
            );
            assert!(s.is_lost());
        }
        s.reconnected();
        assert_eq!(s, State::Idle);
        assert!(!s.refuses_reconnecting(PATIENCE));
    }

    #[test]
    fn only_a_session_outside_a_transaction_that_did_not_give_up_counts_silence_afresh() {
        let mut lost_in_tx = begun(1);
        lost_in_tx.lose();
        for (s, afresh) in [
            (State::Idle, true),
            (State::Lost, true),
            (begun(1), false),
            (lost_in_tx, false),
            (State::GaveUp { at: Instant::now() }, false),
        ] {
            assert_eq!(s.asks_afresh(), afresh, "{s:?}");
        }
    }

    #[test]
    fn giving_up_inside_a_transaction_loses_the_transaction() {
        let mut s = begun(1000);
        s.give_up(Instant::now());
        assert!(matches!(&s, State::LostInTx(tx) if tx.now == Some(1000)));
        assert!(!s.refuses_reconnecting(PATIENCE));
        let mut s = begun(1000);
        s.lose();
        s.reconnected();
        assert!(
            matches!(&s, State::InTx(tx) if tx.now == Some(1000)),
            "a connection made again inside a transaction keeps it on this side"
        );
    }
}
