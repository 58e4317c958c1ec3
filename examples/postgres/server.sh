#!/usr/bin/env bash
# A throwaway PostgreSQL server for this example, in a folder of its own (DIR, else the folder
# BACKFILL_EXAMPLE_PG_DIR names, else /tmp/backfill-example-pg), with a database `shop`:
#
#   eval "$(examples/postgres/server.sh [DIR])"   # start; prints export BACKFILL_EXAMPLE_PG_URL=...
#   examples/postgres/server.sh stop [DIR]        # stop it; `rm -rf DIR` forgets it
#
# Starting again reuses the folder, its port and its data (it says so on stderr). Needs PostgreSQL's server binaries: PG_BIN, or
# Debian's postgresql package (its own service is not used). The server refuses to run as root:
# under root it runs as `nobody`, who must be able to reach DIR.
set -euo pipefail

action=start
if [ "${1:-}" = stop ]; then action=stop; shift; fi
dir=${1:-${BACKFILL_EXAMPLE_PG_DIR:-/tmp/backfill-example-pg}}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
if [ ! -x "$bin/initdb" ]; then
  echo "no PostgreSQL server binaries (set PG_BIN or install Debian's postgresql)" >&2
  exit 1
fi

as_server() {
  if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}

if [ "$action" = stop ]; then
  if as_server "$bin/pg_ctl" status -D "$dir/data" >/dev/null; then
    as_server "$bin/pg_ctl" stop -D "$dir/data" -m fast >&2
  else
    echo "no server running in $dir" >&2
  fi
  exit 0
fi

if [ ! -f "$dir/data/PG_VERSION" ]; then
  if [ "$(id -u)" = 0 ]; then chown nobody: "$dir"; fi
  if ! as_server test -w "$dir"; then
    echo "the server's user cannot write $dir: give a folder under /tmp" >&2
    exit 1
  fi
  as_server "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C \
    --no-sync --no-instructions >&2
  # A free port: one nothing on 127.0.0.1 answers on.
  port=$((20000 + RANDOM % 40000))
  while (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((20000 + RANDOM % 40000)); done
  cat >>"$dir/data/postgresql.conf" <<EOF
# A throwaway server: fast, not safe from a crash of its machine. With fsync off a commit costs
# one write(2); synchronous_commit stays on so that the write happens before the commit returns
# (off, a crash of the server alone would lose commits a backfill already acted on).
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir/data'
fsync = off
synchronous_commit = on
full_page_writes = off
EOF
fi
port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$dir/data/postgresql.conf" | tail -n 1)

if ! as_server "$bin/pg_ctl" status -D "$dir/data" >/dev/null; then
  # The port was free when it was chosen; another server may have taken it since: then another.
  tries=0
  until as_server "$bin/pg_ctl" start -D "$dir/data" -l "$dir/data/server.log" -w >&2; do
    tries=$((tries + 1))
    if [ "$tries" -ge 10 ] || ! tail -n 20 "$dir/data/server.log" | grep -q 'could not bind\|Address already in use'; then
      tail -n 20 "$dir/data/server.log" >&2
      exit 1
    fi
    port=$((20000 + RANDOM % 40000))
    while (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((20000 + RANDOM % 40000)); done
    echo "port = $port" >>"$dir/data/postgresql.conf"
    echo "the port was taken meanwhile; trying port $port" >&2
  done
else
  echo "reusing the server already running in $dir (stop it with: $0 stop $dir; rm -rf $dir for a fresh one)" >&2
fi
psql() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }
if [ -z "$(psql -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'shop'")" ]; then
  psql -d postgres -c 'CREATE DATABASE shop'
fi
echo "export BACKFILL_EXAMPLE_PG_URL=postgresql://postgres@127.0.0.1:$port/shop"
