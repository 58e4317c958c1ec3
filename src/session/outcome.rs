//! How a backfill ended, decided in one place: from what its runs did and whether it was
//! stopped, the state the manifest records and the exit code the process returns.

use crate::exit;
use crate::manifest::queries::Counts;
use crate::state::BackfillState;

/// The final outcome of a backfill's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every planned interval succeeded, or there was nothing to do.
    Completed,
    /// A staged backfill whose outputs await `promote`.
    Staged,
    /// An interval failed or was rejected; the rest completed. With `--max-failures`, the rest
    /// may still be planned, for `resume`.
    Failed,
    /// Stopped (a signal, `cancel`, a takeover) before every interval ended; resumable.
    Interrupted,
    /// Stopped by an environment fault (a full disk, no descriptors or memory, see
    /// [`crate::environment`]): resumable once its cause is gone, and the process says so
    /// with exit code 1, as for a warehouse that cannot be written.
    Faulted,
}

impl Outcome {
    /// Judges a run that ended: `faulted` when an environment fault stopped it, `halted` when
    /// `--max-failures` stopped dispatching, `stopped` when a signal or `cancel` did, `counts`
    /// of the backfill's intervals as the manifest has them, `staging` for `create --stage`.
    pub(crate) fn judge(
        faulted: bool,
        halted: bool,
        stopped: bool,
        counts: &Counts,
        staging: bool,
    ) -> Self {
        if faulted {
            Self::Faulted
        } else if halted && !stopped && counts.cancelled == 0 {
            Self::Failed
        } else if stopped || counts.pending > 0 || counts.cancelled > 0 {
            Self::Interrupted
        } else if counts.failed + counts.rejected > 0 {
            Self::Failed
        } else if staging && counts.succeeded > 0 {
            Self::Staged
        } else {
            Self::Completed
        }
    }

    /// The state the manifest records.
    pub(crate) fn state(self) -> BackfillState {
        match self {
            Self::Completed => BackfillState::Completed,
            Self::Staged => BackfillState::Staged,
            Self::Failed => BackfillState::Failed,
            Self::Interrupted | Self::Faulted => BackfillState::Cancelled,
        }
    }

    /// The exit code of the process.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Self::Completed | Self::Staged => exit::OK,
            Self::Failed => exit::FAILED,
            Self::Interrupted => exit::INTERRUPTED,
            Self::Faulted => exit::INTERNAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(succeeded: i64, failed: i64, cancelled: i64, pending: i64) -> Counts {
        Counts {
            succeeded,
            failed,
            cancelled,
            pending,
            ..Counts::default()
        }
    }

    #[test]
    fn outcomes_decide_state_and_exit_code() {
        let cases = [
            // halted, stopped, counts, staging => outcome
            (false, false, counts(3, 0, 0, 0), false, Outcome::Completed),
            (false, false, counts(0, 0, 0, 0), false, Outcome::Completed),
            (false, false, counts(3, 0, 0, 0), true, Outcome::Staged),
            (false, false, counts(0, 0, 0, 0), true, Outcome::Completed),
            (false, false, counts(2, 1, 0, 0), false, Outcome::Failed),
            (true, false, counts(1, 2, 0, 5), false, Outcome::Failed),
            (true, true, counts(1, 2, 0, 5), false, Outcome::Interrupted),
            (false, true, counts(3, 0, 0, 0), false, Outcome::Interrupted),
            (
                false,
                false,
                counts(2, 0, 1, 0),
                false,
                Outcome::Interrupted,
            ),
            (
                false,
                false,
                counts(2, 0, 0, 1),
                false,
                Outcome::Interrupted,
            ),
        ];
        for (halted, stopped, c, staging, want) in cases {
            assert_eq!(
                Outcome::judge(false, halted, stopped, &c, staging),
                want,
                "{c:?}"
            );
            // An environment fault stopped it: resumable, whatever else happened.
            assert_eq!(
                Outcome::judge(true, halted, stopped, &c, staging),
                Outcome::Faulted,
                "{c:?}"
            );
        }
        assert_eq!(Outcome::Faulted.exit_code(), exit::INTERNAL);
        assert_eq!(Outcome::Faulted.state(), BackfillState::Cancelled);
        assert_eq!(Outcome::Staged.exit_code(), exit::OK);
        assert_eq!(Outcome::Staged.state(), BackfillState::Staged);
        assert_eq!(Outcome::Failed.exit_code(), exit::FAILED);
        assert_eq!(Outcome::Interrupted.exit_code(), exit::INTERRUPTED);
        assert_eq!(Outcome::Interrupted.state(), BackfillState::Cancelled);
    }
}
