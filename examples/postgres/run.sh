#!/usr/bin/env bash
# Runs the PostgreSQL example end to end: starts a throwaway server (in /tmp/backfill-example-pg,
# or BACKFILL_EXAMPLE_PG_DIR; see server.sh), creates the shop's tables and orders once, then
# backfills January 2026.
#
#   examples/postgres/run.sh [BACKFILL ARGS...]     # default: create --dag orders_fact --from 2026-01-01 --to 2026-01-31
#   examples/postgres/server.sh stop     # when done
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
eval "$("$here/server.sh")"
bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
PGOPTIONS="-c client_min_messages=warning" "$bin/psql" -X -q -v ON_ERROR_STOP=1 "$BACKFILL_EXAMPLE_PG_URL" -f "$here/schema.sql" -f "$here/seed.sql"
if [ "$#" -eq 0 ]; then
  set -- create --dag orders_fact --from 2026-01-01 --to 2026-01-31
fi
cd "$here/../.."
exec cargo run --quiet -- -C examples/postgres "$@"
