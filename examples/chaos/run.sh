#!/usr/bin/env bash
# The chaos suite at length: repeatedly kill -9s, freezes (SIGSTOP/SIGCONT), crashes at fault
# points and resumes backfills of a command DAG and of a SQL DAG at random moments, beside
# concurrent backfills of overlapping ranges; then, as many times, stagings, promotes and
# rollbacks of the SQL DAG and cascades from the command DAG to a downstream one under the
# same attacks; and checks the guarantees after each iteration (tests/chaos.rs says which).
# The same seed replays the same choices.
#
#   examples/chaos/run.sh [ITERATIONS] [SEED]      (default: 300 iterations, seed 20261130)
#
# Needs a Rust toolchain and flock(1) from util-linux. Takes about a second per iteration of
# the first test and three of the second.
set -euo pipefail

iterations=${1:-300}
seed=${2:-20261130}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
CHAOS_ITERATIONS=$iterations CHAOS_SEED=$seed \
  cargo test --locked --test chaos -- --nocapture --test-threads 1
