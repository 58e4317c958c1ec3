#!/bin/sh
# Stages the events of one day: a deterministic stand-in for reading a source system.
# Idempotent: writes to a temporary file and renames it over the partition. Under
# `backfill verify` (BACKFILL_VERIFY=1) it writes beside the published data, never over it.
set -eu
ds="$1"
root=out
[ "${BACKFILL_VERIFY:-}" = 1 ] && root=out/verify
dir="$root/staging/ds=$ds"
mkdir -p "$dir"
seed=$(printf '%s' "$ds" | cksum | cut -d' ' -f1)
awk -v seed="$seed" -v ds="$ds" 'BEGIN {
  srand(seed); n = 500 + int(rand() * 500)
  split("eu us apac", regions, " ")
  for (i = 1; i <= n; i++) printf "%s,%s-%05d,%s,%.2f\n", ds, ds, i, regions[1 + int(rand() * 3)], rand() * 200
}' > "$dir/events.csv.tmp"
mv "$dir/events.csv.tmp" "$dir/events.csv"
rows=$(wc -l < "$dir/events.csv" | tr -d ' ')
sum=$(cksum < "$dir/events.csv" | cut -d' ' -f1)
printf '{"rows": %s, "partitions": ["%s"], "fingerprint": "%s"}\n' "$rows" "$dir" "$sum" > "$BACKFILL_RESULT"
echo "staged $rows events for $ds"
