#!/usr/bin/env bash
# Measures backfill's performance targets side by side with their baselines and exits non-zero
# when one is missed. Not part of the test suite; takes about six minutes on 2 cores.
#
#   examples/bench/overhead.sh [ROUNDS]        (default 5 rounds; medians are reported)
#
# 1. overhead: 10,000 intervals of `true` at --max-active-runs 8 on a fresh manifest, alternated
#    with `xargs -P 8` running `true` 10,000 times: wall time ratio <= 1.0
# 2. planning: `create --dry-run --output json` of an @hourly DAG over 10 years against a
#    manifest holding a run for each interval: < 0.5 s and < 100 MB (croniter, if installed,
#    expands the same fire times for reference)
# 3. memory: peak RSS of (1) < 40 MB, and growing < 2x from 10,000 to 100,000 intervals
# 4. reading: `show ID` and `runs --dag ID` on that 87,672-interval backfill < 0.3 s
# and, for reference, a dry run of a minutely DAG over a year (525,600 intervals; the limit of
# one backfill is 1,000,000).
#
# Needs bash, GNU time (/usr/bin/time; Debian package `time`), seq, xargs and awk.
set -euo pipefail

rounds=${1:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/backfill-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
export BACKFILL_NOW=2026-11-29T12:00:00Z

if [ ! -x /usr/bin/time ]; then
  echo "GNU time is needed: apt-get install time" >&2
  exit 2
fi

echo "building the release binary..." >&2
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
bin="$root/target/release/backfill"

# A project with one no-op task on the given schedule.
project() { # DIR SCHEDULE
  mkdir -p "$1/dags"
  : > "$1/backfill.toml"
  printf 'schedule = "%s"\n[[tasks]]\nid = "noop"\ncommand = ["true"]\n' "$2" > "$1/dags/noop.toml"
}

# Runs a command, appends "wall_seconds peak_kb" to FILE.
measure() { # FILE CMD...
  local out=$1
  shift
  /usr/bin/time -f "%e %M" -o "$work/one" "$@" > /dev/null 2>&1 || true
  tail -n 1 "$work/one" >> "$out"
}

median() { # FILE COLUMN
  awk -v c="$2" '{print $c}' "$1" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'
}

failures=0
verdict() { # NAME VALUE OP LIMIT UNIT
  local ok
  ok=$(awk -v v="$2" -v l="$4" -v op="$3" 'BEGIN {print (op == "<=" ? v <= l : v < l) ? "ok" : "MISSED"}')
  printf '  %-52s %10s %-4s (target %s %s %s)\n' "$1" "$2" "$5" "$3" "$4" "$ok"
  [ "$ok" = ok ] || failures=$((failures + 1))
}

# 10,000 hourly intervals from 2015-01-01; 100,000 for the memory growth.
to_10k=2016-02-21T15:00:00Z
to_100k=2026-05-29T15:00:00Z

run_backfill() { # N_INTERVALS_END
  local d
  d=$(mktemp -d "$work/run.XXXXXX")
  project "$d" "@hourly"
  "$bin" -C "$d" -q create --dag noop --from 2015-01-01T00:00:00Z --to "$1" --max-active-runs 8
}
export -f project run_backfill
export bin work

echo "1. overhead: $rounds rounds of backfill and xargs, alternated" >&2
: > "$work/a"
: > "$work/b"
for _ in $(seq "$rounds"); do
  measure "$work/a" bash -c "run_backfill $to_10k"
  measure "$work/b" sh -c 'seq 10000 | xargs -P 8 -n 1 true'
  rm -rf "$work"/run.*
done
a=$(median "$work/a" 1)
b=$(median "$work/b" 1)
ratio=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}')

echo "3. memory at 100,000 intervals" >&2
: > "$work/big"
measure "$work/big" bash -c "run_backfill $to_100k"
rm -rf "$work"/run.*
rss_10k=$(awk '{print $2}' "$work/a" | sort -n | tail -n 1)
rss_100k=$(awk '{print $2}' "$work/big")
growth=$(awk -v a="$rss_10k" -v b="$rss_100k" 'BEGIN {printf "%.2f", b / a}')

echo "2. planning: creating a manifest with a run for each of 87,672 hourly intervals" >&2
big="$work/hourly"
project "$big" "@hourly"
"$bin" -C "$big" -q create --dag noop --from 2016-01-01 --to 2025-12-31 --max-active-runs 8
: > "$work/plan"
: > "$work/show"
: > "$work/runs"
for _ in $(seq "$rounds"); do
  measure "$work/plan" "$bin" -C "$big" create --dag noop --from 2016-01-01 --to 2025-12-31 --dry-run --output json
  measure "$work/show" "$bin" -C "$big" show 1
  measure "$work/runs" "$bin" -C "$big" runs --dag noop
done
croniter=""
if python3 -c "import croniter" 2> /dev/null; then
  croniter=$(python3 - << 'PY'
import time
from datetime import datetime, timezone
from croniter import croniter
start = time.perf_counter()
# get_next() excludes its start: begin an hour early so that 2016-01-01T00:00 is counted.
it = croniter("0 * * * *", datetime(2015, 12, 31, 23, tzinfo=timezone.utc))
n = 0
while it.get_next(datetime) < datetime(2026, 1, 1, tzinfo=timezone.utc):
    n += 1
print(f"{time.perf_counter() - start:.2f} {n}")
PY
)
fi

echo "5. a minutely DAG over a year, dry run" >&2
minutely="$work/minutely"
project "$minutely" "* * * * *"
: > "$work/minutely.txt"
measure "$work/minutely.txt" "$bin" -C "$minutely" create --dag noop --from 2025-01-01 --to 2025-12-31 --dry-run --output json

echo
echo "backfill $("$bin" --version | awk '{print $2}') on $(nproc) cores, $(uname -m); medians of $rounds runs"
echo "1. 10,000 intervals of true, --max-active-runs 8: backfill ${a}s, xargs -P 8 ${b}s"
verdict "wall time / xargs" "$ratio" "<=" 1.0 "x"
echo "2. dry run of 87,672 hourly intervals against a manifest with a run for each"
verdict "wall time" "$(median "$work/plan" 1)" "<" 0.5 "s"
verdict "peak RSS" "$(awk -v k="$(median "$work/plan" 2)" 'BEGIN {printf "%.1f", k / 1024}')" "<" 100 "MB"
if [ -n "$croniter" ]; then
  read -r secs n <<< "$croniter"
  echo "   for reference, Python croniter (what Airflow uses) expands the same $n fire times in ${secs}s:" \
    "$(awk -v c="$secs" -v b="$(median "$work/plan" 1)" 'BEGIN {printf "%.1f", c / b}')x backfill's whole dry run"
else
  echo "   (pip install croniter to compare with the expansion Airflow uses)"
fi
echo "3. memory of the runs in 1."
verdict "peak RSS at 10,000 intervals" "$(awk -v k="$rss_10k" 'BEGIN {printf "%.1f", k / 1024}')" "<" 40 "MB"
verdict "growth from 10,000 to 100,000 intervals" "$growth" "<" 2 "x"
echo "4. reading the 87,672-interval backfill"
verdict "show 1" "$(median "$work/show" 1)" "<" 0.3 "s"
verdict "runs --dag" "$(median "$work/runs" 1)" "<" 0.3 "s"
echo "5. dry run of 525,600 minutely intervals (reference):" \
  "$(awk '{printf "%ss, %.1f MB peak", $1, $2 / 1024}' "$work/minutely.txt")"
if [ "$failures" -gt 0 ]; then
  echo "$failures target(s) missed"
  exit 1
fi
echo "all targets met"
