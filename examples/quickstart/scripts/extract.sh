#!/bin/sh
# Stages the events of one day: a deterministic stand-in for reading a source system.
# Idempotent: writes to a temporary file and renames it over the partition.
set -eu
ds="$1"
dir="out/staging/ds=$ds"
mkdir -p "$dir"
seed=$(printf '%s' "$ds" | cksum | cut -d' ' -f1)
awk -v seed="$seed" -v ds="$ds" 'BEGIN {
  srand(seed); n = 500 + int(rand() * 500)
  split("eu us apac", regions, " ")
  for (i = 1; i <= n; i++) printf "%s,%s-%05d,%s,%.2f\n", ds, ds, i, regions[1 + int(rand() * 3)], rand() * 200
}' > "$dir/events.csv.tmp"
mv "$dir/events.csv.tmp" "$dir/events.csv"
echo "staged $(wc -l < "$dir/events.csv") events for $ds"
