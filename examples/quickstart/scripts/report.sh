#!/bin/sh
# Aggregates one day's staged events per region into the report partition, replacing it
# atomically, and tells backfill what it wrote through $BACKFILL_RESULT. Under
# `backfill verify` (BACKFILL_VERIFY=1) it reads and writes beside the published data.
set -eu
ds="$1"
root=out
[ "${BACKFILL_VERIFY:-}" = 1 ] && root=out/verify
in="$root/staging/ds=$ds/events.csv"
dir="$root/report/ds=$ds"
mkdir -p "$dir"
awk -F, '{ n[$3]++; s[$3] += $4 } END { for (r in n) printf "%s,%s,%d,%.2f\n", $1, r, n[r], s[r] }' "$in" \
  | sort > "$dir/part.csv.tmp"
mv "$dir/part.csv.tmp" "$dir/part.csv"
rows=$(wc -l < "$dir/part.csv" | tr -d ' ')
sum=$(cksum < "$dir/part.csv" | cut -d' ' -f1)
printf '{"rows": %s, "partitions": ["%s"], "inputs": ["%s"], "fingerprint": "%s"}\n' \
  "$rows" "$dir" "$in" "$sum" > "$BACKFILL_RESULT"
echo "wrote $rows rows to $dir"
