#!/usr/bin/env bash
# The no-op benchmark against each manifest: 10,000 hourly intervals of `true` at
# --max-active-runs 8, on a fresh SQLite manifest and on a fresh PostgreSQL manifest (a database
# of its own each round), alternated; medians of the wall time. The target: PostgreSQL within 2x
# of SQLite. The server is a throwaway one started here with PostgreSQL's default durability
# (fsync and synchronous_commit on), on this machine, over TCP to 127.0.0.1.
#
#   examples/bench/manifest.sh [ROUNDS]        (default 5)
#
# Needs bash, GNU time (/usr/bin/time), PostgreSQL's server binaries (PG_BIN, or Debian's
# postgresql package) and, as root, the user `nobody` to run the server.
set -euo pipefail

rounds=${1:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/backfill-bench-manifest.XXXXXX)
pgbin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
as_server() { if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi; }
cleanup() {
  as_server "$pgbin/pg_ctl" stop -D "$work/pg" -m immediate > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
export BACKFILL_NOW=2026-11-29T12:00:00Z

if [ ! -x /usr/bin/time ] || [ ! -x "$pgbin/initdb" ]; then
  echo "needs GNU time (/usr/bin/time) and PostgreSQL's server binaries (PG_BIN)" >&2
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

# A project with one no-op hourly task.
project() { # DIR
  mkdir -p "$1/dags"
  : > "$1/backfill.toml"
  printf 'schedule = "@hourly"\n[[tasks]]\nid = "noop"\ncommand = ["true"]\n' > "$1/dags/noop.toml"
}

# Runs a backfill of 10,000 intervals; appends "wall_seconds peak_kb" to FILE.
measure() { # FILE [MANIFEST_URL]
  local d
  d=$(mktemp -d "$work/run.XXXXXX")
  project "$d"
  local args=(-C "$d" -q)
  if [ -n "${2:-}" ]; then args+=(--manifest "$2"); fi
  /usr/bin/time -f "%e %M" -o "$work/one" "$bin" "${args[@]}" create --dag noop \
    --from 2015-01-01T00:00:00Z --to 2016-02-21T15:00:00Z --max-active-runs 8 > /dev/null
  tail -n 1 "$work/one" >> "$1"
  rm -rf "$d"
}

median() { # FILE COLUMN
  awk -v c="$2" '{print $c}' "$1" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'
}

: > "$work/sqlite"
: > "$work/postgres"
for i in $(seq "$rounds"); do
  measure "$work/sqlite"
  psql -d postgres -c "CREATE DATABASE m$i"
  measure "$work/postgres" "postgresql://postgres@127.0.0.1:$port/m$i"
  echo "  round $i: sqlite $(tail -n 1 "$work/sqlite" | cut -d' ' -f1) s, postgres $(tail -n 1 "$work/postgres" | cut -d' ' -f1) s" >&2
done
s=$(median "$work/sqlite" 1)
p=$(median "$work/postgres" 1)
ratio=$(awk -v a="$p" -v b="$s" 'BEGIN {printf "%.2f", a / b}')
ok=$(awk -v r="$ratio" 'BEGIN {print (r <= 2.0) ? "ok" : "MISSED"}')
printf '10,000 no-op intervals at -m 8 (medians of %s rounds)\n' "$rounds"
printf '  SQLite manifest      %6s s  (peak %s kB)\n' "$s" "$(median "$work/sqlite" 2)"
printf '  PostgreSQL manifest  %6s s  (peak %s kB)\n' "$p" "$(median "$work/postgres" 2)"
printf '  ratio                %6sx  (target <= 2.0x: %s)\n' "$ratio" "$ok"
[ "$ok" = ok ]
