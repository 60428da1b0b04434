#!/usr/bin/env bash
# The main job. Today: the erasure-coding benchmark. It grows into a local cluster, mounted,
# serving a model (see README).
set -euo pipefail
build=${1:-build}
if [ -x "$build/tools/kvfs-ec-bench" ]; then
	"$build/tools/kvfs-ec-bench"
else
	echo "demo: $build/tools/kvfs-ec-bench not built yet"
	exit 1
fi
