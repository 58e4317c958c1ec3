//! The deferred statements of the writer's transaction: queued with a ticket, sent together
//! in one round trip, answered by ticket, and the first the server refused.
//!
//! A statement whose answer the rest of its job does not need waits here until the writer
//! asks for the answers, or until a statement that is not deferred must run (the server runs
//! the transaction's statements in the order they were asked for). The server fails every
//! statement of a transaction after the first that failed, so that first refusal, by the
//! order sent, is why the transaction cannot commit; it is kept past the commit for the writer
//! to ask, with the answers, until the next transaction begun alone.
//!
//! This is bookkeeping only: sending is the session's (see `Session::flush`).

use std::collections::HashMap;

use rusqlite::types::Value;

use super::failure;
use crate::pg::error::{Error as PgError, Result as PgResult};

/// A deferred statement's rows.
pub(super) type Rows = Vec<Vec<Value>>;

/// A deferred statement not sent yet.
pub(super) struct Unsent {
    pub ticket: usize,
    pub sql: String,
    pub values: Vec<Value>,
}

/// The deferred statements of a session (see the module's doc).
#[derive(Default)]
pub(super) struct Deferrals {
    /// Not sent yet, in the order asked for.
    unsent: Vec<Unsent>,
    /// Answers not taken yet, by ticket.
    answers: HashMap<usize, PgResult<Rows>>,
    /// The next statement's ticket.
    next_ticket: usize,
    /// The first of the transaction's statements that the server refused, by ticket: the
    /// transaction cannot commit.
    refused: Option<(usize, PgError)>,
}

impl Deferrals {
    /// Queues `sql`; returns the ticket of its answer.
    pub(crate) fn push(&mut self, sql: &str, values: Vec<Value>) -> usize {
        let ticket = self.next_ticket;
        self.next_ticket = ticket.wrapping_add(1);
        self.unsent.push(Unsent {
            ticket,
            sql: sql.to_string(),
            values,
        });
        ticket
    }

    pub(crate) fn has_unsent(&self) -> bool {
        !self.unsent.is_empty()
    }

    /// The statements not sent yet, in order, to be sent now.
    pub(crate) fn take_unsent(&mut self) -> Vec<Unsent> {
        std::mem::take(&mut self.unsent)
    }

    /// Drops the statements not sent (their transaction ended); the answers of those sent are
    /// kept.
    pub(crate) fn drop_unsent(&mut self) {
        self.unsent.clear();
    }

    /// The server refused statement `ticket`: remembered when it is the first, in the order
    /// sent, that it refused.
    pub(crate) fn refuse(&mut self, ticket: usize, e: &PgError) {
        if self.refused.as_ref().is_none_or(|(t, _)| ticket < *t) {
            self.refused = Some((ticket, e.clone()));
        }
    }

    /// The first refusal of the transaction's statements.
    pub(crate) fn refusal(&self) -> Option<PgError> {
        self.refused.as_ref().map(|(_, e)| e.clone())
    }

    /// Whether a statement was refused, asked once: forgotten then.
    pub(crate) fn take_refusal(&mut self) -> bool {
        self.refused.take().is_some()
    }

    /// Records the answers of the statements `sent` (in order): `answered` holds the first
    /// ones, and those that got none have the round trip's `failure`, or, should it have none,
    /// a failure of their own.
    pub(crate) fn answered(
        &mut self,
        sent: &[Unsent],
        answered: Vec<PgResult<Rows>>,
        failure_of_round_trip: Option<&PgError>,
    ) {
        let mut answered = answered.into_iter();
        for u in sent {
            let answer = answered
                .next()
                .unwrap_or_else(|| match failure_of_round_trip {
                    Some(e) => Err(e.clone()),
                    None => Err(failure("a deferred statement got no answer".into())),
                });
            self.answers.insert(u.ticket, answer);
        }
    }

    /// The answer of statement `ticket`, once.
    pub(crate) fn take_answer(&mut self, ticket: usize) -> PgResult<Rows> {
        self.answers
            .remove(&ticket)
            .unwrap_or_else(|| Err(failure("a deferred statement's answer is missing".into())))
    }

    /// Forgets the answers not taken and the refusal, at the start of a transaction begun
    /// alone (one begun in a commit's round trip leaves them to the writer).
    pub(crate) fn forget_answers(&mut self) {
        self.answers.clear();
        self.refused = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::Kind;

    fn rows(n: i64) -> PgResult<Rows> {
        Ok(vec![vec![Value::Integer(n)]])
    }

    fn refusal(message: &str) -> PgError {
        PgError::new(Kind::Constraint, message.to_string())
    }

    #[test]
    fn statements_wait_in_the_order_asked_for_with_tickets_that_grow() {
        let mut d = Deferrals::default();
        assert!(!d.has_unsent());
        assert_eq!(d.push("SELECT 1", vec![]), 0);
        assert_eq!(d.push("SELECT 2", vec![Value::Integer(2)]), 1);
        assert!(d.has_unsent());
        let sent = d.take_unsent();
        assert_eq!(
            sent.iter()
                .map(|u| (u.ticket, u.sql.as_str()))
                .collect::<Vec<_>>(),
            [(0, "SELECT 1"), (1, "SELECT 2")]
        );
        assert!(!d.has_unsent(), "what was taken is sent once");
        // Tickets are never used twice, across transactions.
        assert_eq!(d.push("SELECT 3", vec![]), 2);
        d.drop_unsent();
        assert!(d.take_unsent().is_empty());
        d.forget_answers();
        assert_eq!(d.push("SELECT 4", vec![]), 3);
    }

    #[test]
    fn each_answer_is_taken_once_by_its_ticket() {
        let mut d = Deferrals::default();
        let (a, b) = (d.push("A", vec![]), d.push("B", vec![]));
        let sent = d.take_unsent();
        d.answered(&sent, vec![rows(1), rows(2)], None);
        assert_eq!(d.take_answer(b).unwrap(), rows(2).unwrap());
        assert_eq!(d.take_answer(a).unwrap(), rows(1).unwrap());
        let again = d.take_answer(a).unwrap_err();
        assert!(again.to_string().contains("missing"), "{again}");
    }

    #[test]
    fn statements_without_an_answer_have_the_round_trips_failure() {
        let mut d = Deferrals::default();
        let tickets: Vec<usize> = (0..3).map(|i| d.push(&format!("S{i}"), vec![])).collect();
        let sent = d.take_unsent();
        let gone = super::super::lost("the connection was lost".into());
        d.answered(&sent, vec![rows(0)], Some(&gone));
        assert!(d.take_answer(tickets[0]).is_ok());
        for t in &tickets[1..] {
            assert!(d.take_answer(*t).unwrap_err().is_disconnected());
        }
        // A round trip that failed nothing, yet answered too few: a failure all the same.
        let t = d.push("S3", vec![]);
        let sent = d.take_unsent();
        d.answered(&sent, vec![], None);
        let e = d.take_answer(t).unwrap_err();
        assert!(
            !e.is_disconnected() && e.to_string().contains("no answer"),
            "{e}"
        );
    }

    #[test]
    fn the_first_refusal_in_the_order_sent_is_kept_until_asked_once() {
        let mut d = Deferrals::default();
        assert!(d.refusal().is_none());
        d.refuse(3, &refusal("third"));
        d.refuse(1, &refusal("first"));
        d.refuse(2, &refusal("second"));
        assert!(d.refusal().unwrap().to_string().contains("first"));
        assert!(
            d.refusal().is_some(),
            "looking does not forget: the commit reads it, then the writer asks"
        );
        assert!(d.take_refusal());
        assert!(!d.take_refusal(), "asked once");
        assert!(d.refusal().is_none());
    }

    #[test]
    fn answers_and_the_refusal_outlive_the_transaction_until_the_next_begun_alone() {
        let mut d = Deferrals::default();
        let t = d.push("A", vec![]);
        let u = d.push("B", vec![]);
        let sent = d.take_unsent();
        d.refuse(u, &refusal("refused"));
        d.answered(&sent, vec![rows(1), Err(refusal("refused"))], None);
        // The transaction ends on this side: what was not sent goes, what was answered stays.
        d.push("C", vec![]);
        d.drop_unsent();
        assert!(!d.has_unsent());
        assert!(d.refusal().is_some());
        d.forget_answers();
        assert!(d.refusal().is_none());
        assert!(d.take_answer(t).is_err(), "forgotten");
    }
}
