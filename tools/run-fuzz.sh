#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD/fuzz/ for SECONDS each, with its seed corpus from
# tests/fuzz/corpus/<name>/ when present. Fails if any target crashes.
set -euo pipefail
build=${1:-build-fuzz}
secs=${2:-20}
shopt -s nullglob
targets=("$build"/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
	echo "run-fuzz: no fuzz targets built"
	exit 0
fi
for t in "${targets[@]}"; do
	name=$(basename "$t")
	work=$(mktemp -d)
	seeds=tests/fuzz/corpus/$name
	[ -d "$seeds" ] && cp -r "$seeds"/. "$work"/
	echo "run-fuzz: $name for ${secs}s"
	"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$work" 2>&1 | tail -n 12
	rm -rf "$work"
done
echo "run-fuzz: all targets ran without a crash"
