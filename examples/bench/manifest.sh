#!/usr/bin/env bash
# The no-op benchmark against each manifest: 10,000 hourly intervals of `true` at
# --max-active-runs 8 (or MAX_ACTIVE_RUNS), on a fresh SQLite manifest, on a fresh PostgreSQL
# manifest (a database of its own each round), and on a PostgreSQL manifest reached through a proxy that delays each
# direction by 1 ms (2 ms more per round trip, as a network between hosts would), alternated;
# medians of the wall time, and of the CPU seconds spent: backfill's own (its `true` processes
# included) and, on PostgreSQL, the server's (its sessions' processes, as the postmaster counts its
# ended children). The target: PostgreSQL within 1.3x of SQLite. The server is a
# throwaway one started here with PostgreSQL's default durability (fsync and synchronous_commit
# on), on this machine, over TCP to 127.0.0.1.
#
#   examples/bench/manifest.sh [ROUNDS] [INTERVALS] [MAX_ACTIVE_RUNS]     (defaults 5, 10000, 8)
#
# Needs bash, GNU time (/usr/bin/time), python3 (the delay proxy), PostgreSQL's server binaries
# (PG_BIN, or Debian's postgresql package) and, as root, the user `nobody` to run the server.
set -euo pipefail

rounds=${1:-5}
intervals=${2:-10000}
slots=${3:-8}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/backfill-bench-manifest.XXXXXX)
pgbin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
as_server() { if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi; }
cleanup() {
  if [ -n "${proxy:-}" ]; then kill "$proxy" 2> /dev/null || true; fi
  as_server "$pgbin/pg_ctl" stop -D "$work/pg" -m immediate > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
export BACKFILL_NOW=2026-11-29T12:00:00Z

if [ ! -x /usr/bin/time ] || [ ! -x "$pgbin/initdb" ] || ! command -v python3 > /dev/null; then
  echo "needs GNU time (/usr/bin/time), python3 and PostgreSQL's server binaries (PG_BIN)" >&2
  exit 2
fi

echo "building the release binary..." >&2
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
bin="$root/target/release/backfill"

if [ "$(id -u)" = 0 ]; then chown nobody: "$work"; fi
as_server "$pgbin/initdb" -D "$work/pg" -U postgres -A trust -E UTF8 --locale=C --no-instructions > /dev/null
port=$((20000 + RANDOM % 40000))
while (: < "/dev/tcp/127.0.0.1/$port") 2> /dev/null; do port=$((20000 + RANDOM % 40000)); done
printf "port = %s\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n" "$port" "$work/pg" >> "$work/pg/postgresql.conf"
as_server "$pgbin/pg_ctl" start -D "$work/pg" -l "$work/pg/server.log" -w > /dev/null
psql() { "$pgbin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }
echo "PostgreSQL $(psql -d postgres -c 'SHOW server_version') on port $port: fsync=$(psql -d postgres -c 'SHOW fsync'), synchronous_commit=$(psql -d postgres -c 'SHOW synchronous_commit')" >&2
far=$((20000 + RANDOM % 40000))
while [ "$far" = "$port" ] || (: < "/dev/tcp/127.0.0.1/$far") 2> /dev/null; do far=$((20000 + RANDOM % 40000)); done
python3 "$root/examples/bench/delay_proxy.py" "$far" 127.0.0.1 "$port" 1 > "$work/proxy.out" &
proxy=$!
until grep -q ready "$work/proxy.out" 2> /dev/null; do sleep 0.1; done
# A round trip's time (`SELECT 1` in one session), direct and through the proxy.
round_trip() { # PORT
  echo "SELECT 1;" > "$work/one.sql"
  "$pgbin/pgbench" -h 127.0.0.1 -p "$1" -U postgres -n -T 2 -f "$work/one.sql" postgres 2> /dev/null \
    | awk '/latency average/ {print $4}'
}
near_rt=$(round_trip "$port")
far_rt=$(round_trip "$far")
echo "a round trip: $near_rt ms direct, $far_rt ms through the delay proxy" >&2

# The last interval starts $intervals - 1 hours after the first (`--to` is inclusive).
to=$(date -u -d "2015-01-01 00:00:00 UTC + $((intervals - 1)) hours" +%Y-%m-%dT%H:00:00Z)

# A project with one no-op hourly task.
project() { # DIR
  mkdir -p "$1/dags"
  : > "$1/backfill.toml"
  printf 'schedule = "@hourly"\n[[tasks]]\nid = "noop"\ncommand = ["true"]\n' > "$1/dags/noop.toml"
}

# CPU seconds of the server's ended processes (the postmaster's reaped children: a session's
# backend once it disconnects), read once the count is stable.
server_cpu() {
  local pm last now
  pm=$(head -n 1 "$work/pg/postmaster.pid")
  last=$(awk '{print $16 + $17}' "/proc/$pm/stat")
  for _ in $(seq 100); do
    sleep 0.05
    now=$(awk '{print $16 + $17}' "/proc/$pm/stat")
    if [ "$now" = "$last" ]; then break; fi
    last=$now
  done
  awk -v t="$last" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz}'
}

# Runs a backfill of $intervals hourly intervals; appends
# "wall_seconds peak_kb client_cpu_seconds server_cpu_seconds transactions" to FILE, the last
# the transactions committed in the manifest's database (0 on SQLite).
measure() { # FILE [MANIFEST_URL]
  local d
  d=$(mktemp -d "$work/run.XXXXXX")
  project "$d"
  local args=(-C "$d" -q)
  if [ -n "${2:-}" ]; then args+=(--manifest "$2"); fi
  local before
  before=$(server_cpu)
  /usr/bin/time -f "%e %M %U %S" -o "$work/one" "$bin" "${args[@]}" create --dag noop \
    --from 2015-01-01T00:00:00Z --to "$to" --max-active-runs "$slots" > /dev/null
  local after xacts=0
  after=$(server_cpu)
  if [ -n "${2:-}" ]; then
    xacts=$(psql -d postgres -c "SELECT xact_commit FROM pg_stat_database WHERE datname = '${2##*/}'")
  fi
  tail -n 1 "$work/one" | awk -v s="$(awk -v a="$after" -v b="$before" 'BEGIN {print a - b}')" -v x="$xacts" \
    '{printf "%s %s %.2f %.2f %d\n", $1, $2, $3 + $4, s, x}' >> "$1"
  rm -rf "$d"
}

median() { # FILE COLUMN
  awk -v c="$2" '{print $c}' "$1" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'
}

: > "$work/sqlite"
: > "$work/postgres"
: > "$work/far"
for i in $(seq "$rounds"); do
  measure "$work/sqlite"
  psql -d postgres -c "CREATE DATABASE m$i"
  psql -d postgres -c "CREATE DATABASE f$i"
  measure "$work/postgres" "postgresql://postgres@127.0.0.1:$port/m$i"
  measure "$work/far" "postgresql://postgres@127.0.0.1:$far/f$i"
  echo "  round $i: sqlite $(tail -n 1 "$work/sqlite" | cut -d' ' -f1) s, postgres $(tail -n 1 "$work/postgres" | cut -d' ' -f1) s, postgres +2 ms $(tail -n 1 "$work/far" | cut -d' ' -f1) s" >&2
done
s=$(median "$work/sqlite" 1)
p=$(median "$work/postgres" 1)
f=$(median "$work/far" 1)
ratio=$(awk -v a="$p" -v b="$s" 'BEGIN {printf "%.2f", a / b}')
ok=$(awk -v r="$ratio" 'BEGIN {print (r <= 1.3) ? "ok" : "MISSED"}')
# What the slower round trip adds to each interval, in round trips of the proxy's added time.
grow=$(awk -v a="$f" -v b="$p" -v n="$intervals" -v far="$far_rt" -v near="$near_rt" 'BEGIN {d = (a - b) * 1000 / n; printf "%.2f ms an interval: %.2f of the %.2f ms each round trip gained", d, d / (far - near), far - near}')
printf "%d no-op intervals at -m %d (medians of %s rounds)\n" "$intervals" "$slots" "$rounds"
printf '  SQLite manifest               %6s s  (CPU: backfill %s s; peak %s kB)\n' "$s" \
  "$(median "$work/sqlite" 3)" "$(median "$work/sqlite" 2)"
printf '  PostgreSQL manifest           %6s s  (CPU: backfill %s s, server %s s; peak %s kB)\n' "$p" \
  "$(median "$work/postgres" 3)" "$(median "$work/postgres" 4)" "$(median "$work/postgres" 2)"
printf '  ratio                         %6sx  (target <= 1.3x: %s)\n' "$ratio" "$ok"
printf '  PostgreSQL, +2 ms round trip  %6s s  (+%s)\n' "$f" "$grow"
printf '  transactions committed: %s (%s an interval)\n' "$(median "$work/postgres" 5)" \
  "$(awk -v x="$(median "$work/postgres" 5)" -v n="$intervals" 'BEGIN {printf "%.2f", x / n}')"
printf '  CPU seconds an interval: SQLite %s ms, PostgreSQL %s ms (backfill %s, server %s)\n' \
  "$(awk -v c="$(median "$work/sqlite" 3)" -v n="$intervals" 'BEGIN {printf "%.3f", c * 1000 / n}')" \
  "$(awk -v c="$(median "$work/postgres" 3)" -v v="$(median "$work/postgres" 4)" -v n="$intervals" 'BEGIN {printf "%.3f", (c + v) * 1000 / n}')" \
  "$(awk -v c="$(median "$work/postgres" 3)" -v n="$intervals" 'BEGIN {printf "%.3f", c * 1000 / n}')" \
  "$(awk -v c="$(median "$work/postgres" 4)" -v n="$intervals" 'BEGIN {printf "%.3f", c * 1000 / n}')"
# How busy the machine's cores were (CPU seconds over wall seconds times cores), and the least
# wall time the PostgreSQL run's CPU seconds allow at the SQLite run's busyness.
cores=$(nproc)
busy() { awk -v w="$1" -v c="$2" -v n="$cores" 'BEGIN {printf "%.0f%%", 100 * c / (w * n)}'; }
pc=$(awk -v c="$(median "$work/postgres" 3)" -v v="$(median "$work/postgres" 4)" 'BEGIN {print c + v}')
printf '  cores busy (of %d): SQLite %s, PostgreSQL %s; at SQLite'"'"'s, PostgreSQL'"'"'s CPU needs %.2f s (%.2fx)\n' \
  "$cores" "$(busy "$s" "$(median "$work/sqlite" 3)")" "$(busy "$p" "$pc")" \
  "$(awk -v pc="$pc" -v sc="$(median "$work/sqlite" 3)" -v s="$s" 'BEGIN {print pc * s / sc}')" \
  "$(awk -v pc="$pc" -v sc="$(median "$work/sqlite" 3)" 'BEGIN {print pc / sc}')"
[ "$ok" = ok ]
