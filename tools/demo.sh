#!/usr/bin/env bash
# The main job (`make demo`): a local kvfs cluster — three kvfs-meta replicas (Raft; one with
# KVFS_META_REPLICAS=1) + 11 kvfs-node under one state directory — mounted with kvfs-mount; writes and reads a few 2 MiB block files through the
# mount, checks them, and shows what an operator sees (ls, du, df, .kvfs/nodes, xattrs, the
# daemons' Prometheus /metrics addresses). Then
# serving: a synthetic model, `kvinfer gateway` with 2 prefill + 2 decode workers whose KV
# cache is on the mount, two requests sharing a long prefix (TTFT and cached_tokens of each),
# then a vision encode worker: one picture sent twice (encoded once; the repeat's cached_tokens).
# The cluster, the mount and the servers keep running afterwards; stop them with `make demo-stop`
# (= tools/demo.sh stop).
#
#   tools/demo.sh [BUILD]         start (restarts a demo already running)
#   tools/demo.sh stop [BUILD]    unmount and stop every process of the demo
# State: $KVFS_DEMO_DIR (default /tmp/kvfs-demo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=start
if [ "${1:-}" = stop ] || [ "${1:-}" = start ]; then
	cmd=$1
	shift
fi
build=$(cd "${1:-$here/../build}" && pwd)
state=${KVFS_DEMO_DIR:-/tmp/kvfs-demo}
mnt=$state/mnt
export KVFS_BIN=$build/bin

is_mounted() { grep -q " $mnt fuse" /proc/mounts 2>/dev/null; }

stop() {
	if is_mounted; then
		fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" || true
		echo "demo: unmounted $mnt"
	fi
	if [ -f "$state/serve.pids" ]; then # the kvinfer gateway and workers
		while read -r p; do kill "$p" 2>/dev/null || true; done <"$state/serve.pids"
		rm -f "$state/serve.pids"
		echo "demo: stopped the kvinfer gateway and workers"
	fi
	if [ -f "$state/pids" ]; then
		bash "$here/kvfs-cluster.sh" stop "$state"
	fi
}

if [ "$cmd" = stop ]; then
	stop
	exit 0
fi

for b in kvfs-meta kvfs-node kvfs-mount kvfs; do
	[ -x "$build/bin/$b" ] || { echo "demo: $build/bin/$b not built (make build)" >&2; exit 1; }
done
stop >/dev/null 2>&1 || true
if is_mounted; then # never rm -rf through a live mount
	echo "demo: $mnt is still mounted; unmount it first (fusermount3 -uz $mnt)" >&2
	exit 1
fi
rm -rf "$state"
mkdir -p "$state"

reps=${KVFS_META_REPLICAS:-3}
echo "== starting a local cluster: $reps kvfs-meta (replicas) + 11 kvfs-node in $state"
# KVFS_METRICS=1: meta and every node serve /metrics (addresses in $state/*.metrics).
KVFS_META_REPLICAS=$reps KVFS_METRICS=1 bash "$here/kvfs-cluster.sh" start "$state" 11
# Every replica's address: clients follow whichever leads.
meta=$(paste -sd, "$state/meta.addr")
# meta's /metrics: meta.metrics with one meta, metaR.metrics per replica.
meta_metrics() {
	local f
	for f in "$state"/meta.metrics "$state"/meta[0-9]*.metrics; do
		[ -s "$f" ] && printf '%s http://%s/metrics   ' "$(basename "$f" .metrics)" "$(cat "$f")"
	done
	echo
}

if [ ! -c /dev/fuse ] || ! command -v fusermount3 >/dev/null; then
	echo "demo: no /dev/fuse or fusermount3 here: the cluster runs, the mount is skipped."
	echo "      use the CLI instead:  $build/bin/kvfs --cluster $state status"
	echo "      metrics: $(meta_metrics)"
	echo "stop: make demo-stop   (or: bash tools/demo.sh stop)"
	exit 0
fi

echo
echo "== mounting it: kvfs-mount $meta $mnt"
mkdir -p "$mnt"
rm -f "$state/mount.metrics"
"$build/bin/kvfs-mount" --secret-file "$state/secret" --log-file "$state/mount.log" \
	--metrics-listen 127.0.0.1:0 --metrics-addr-file "$state/mount.metrics" "$meta" "$mnt"

echo
echo "== writing 8 block files of 2 MiB through the mount (each published whole at close)"
dir=$mnt/demo-model/3f
mkdir -p "$dir" "$state/src"
for i in 1 2 3 4 5 6 7 8; do
	h=$(printf 'block-%d' "$i" | sha256sum | cut -c1-64)
	head -c 2097152 /dev/urandom >"$state/src/$h.kvb"
done
t0=$(date +%s.%N)
cp "$state"/src/*.kvb "$dir/"
t1=$(date +%s.%N)
echo "   wrote 16 MiB in $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
sync
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
t0=$(date +%s.%N)
cat "$dir"/*.kvb >/dev/null
t1=$(date +%s.%N)
echo "   read 16 MiB back (page cache dropped first) in $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
(cd "$state/src" && sha256sum *.kvb) >"$state/src.sum"
(cd "$dir" && sha256sum *.kvb) >"$state/mnt.sum"
if cmp -s "$state/src.sum" "$state/mnt.sum"; then
	echo "   sha256 of all 8 files equal to the originals"
else
	echo "demo: read-back mismatch!" >&2
	exit 1
fi
echo
echo "== ls -l $dir"
ls -l "$dir"
echo
echo "   (each node reports its usage to meta by heartbeat, every 1 s: df, .kvfs/nodes and"
echo "    kvfs status lag a write by up to that; waiting one heartbeat before showing them)"
sleep 1.5
echo
echo "== du -sh (what the cluster stores: data + parity)   vs   du -sh --apparent-size"
du -sh "$mnt/demo-model"
du -sh --apparent-size "$mnt/demo-model"
echo
echo "== df -h $mnt (usable = raw x k/(k+m))"
df -h "$mnt"
echo
echo "== cat $mnt/.kvfs/nodes"
cat "$mnt/.kvfs/nodes"
echo
echo "== the geometry lines of $mnt/.kvfs/config (every option in force is there)"
grep -E '^(k|m|chunk) = |^#' "$mnt/.kvfs/config" | sed 's/^/   /'
f=$(ls "$dir" | head -1)
echo
echo "== extended attributes of $f (getfattr -d FILE)"
if command -v getfattr >/dev/null; then
	for n in layout stored atime nodes; do
		v=$(getfattr --absolute-names --only-values -n "user.kvfs.$n" "$dir/$f")
		echo "   user.kvfs.$n: ${v//$'\n'/$'\n'      }"
	done
else
	echo "   (getfattr not installed: tools/install-deps.sh installs it, package attr)"
fi
echo
echo "== Prometheus /metrics of every daemon (text format; try: curl -s http://ADDR/metrics)"
echo "   $(meta_metrics)"
echo "   node0  http://$(cat "$state/node0.metrics")/metrics   (node1 .. node10: $state/nodeN.metrics)"
for _ in $(seq 1 50); do [ -s "$state/mount.metrics" ] && break; sleep 0.1; done
[ -s "$state/mount.metrics" ] && echo "   mount  http://$(cat "$state/mount.metrics")/metrics"

echo
echo "== serving: kvinfer gateway + 2 prefill + 2 decode + 1 encode workers, KV cache on the mount"
if [ -x "$build/bin/kvinfer" ] && [ -x "$build/tools/kvinfer-synth" ] &&
	[ -x "$build/tools/kvinfer-load" ]; then
	model=$state/demo-model.gguf
	mmproj=$state/demo-mmproj.gguf
	"$build/tools/kvinfer-synth" --preset "${KVFS_DEMO_PRESET:-small}" -o "$model" \
		--mmproj "$mmproj" >/dev/null
	mkdir -p "$mnt/kv"
	w=(-m "$model" --kv-dir "$mnt/kv" --secret-file "$state/secret" -t 1 --ignore-eos)
	for i in 0 1; do
		rm -f "$state/prefill$i.port" "$state/decode$i.port"
		# Logs take stdout too: the servers outlive this script, and must not hold its
		# output open (`make demo | tee log` would never end).
		"$build/bin/kvinfer" prefill "${w[@]}" --port-file "$state/prefill$i.port" \
			>"$state/prefill$i.log" 2>&1 &
		echo $! >>"$state/serve.pids"
		"$build/bin/kvinfer" decode "${w[@]}" --port-file "$state/decode$i.port" \
			>"$state/decode$i.log" 2>&1 &
		echo $! >>"$state/serve.pids"
	done
	rm -f "$state/encode0.port" "$state/encode0.metrics"
	"$build/bin/kvinfer" encode --mmproj "$mmproj" --kv-dir "$mnt/kv" --secret-file "$state/secret" \
		-t 1 --port-file "$state/encode0.port" --metrics-listen 127.0.0.1:0 \
		--metrics-addr-file "$state/encode0.metrics" >"$state/encode0.log" 2>&1 &
	echo $! >>"$state/serve.pids"
	wait_port() { for _ in $(seq 1 300); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
	for f in prefill0 prefill1 decode0 decode1 encode0; do wait_port "$state/$f.port"; done
	en=127.0.0.1:$(cat "$state/encode0.port")
	pf=127.0.0.1:$(cat "$state/prefill0.port"),127.0.0.1:$(cat "$state/prefill1.port")
	dc=127.0.0.1:$(cat "$state/decode0.port"),127.0.0.1:$(cat "$state/decode1.port")
	rm -f "$state/gateway.port"
	"$build/bin/kvinfer" gateway --open-gateway --prefill "$pf" --decode "$dc" --encode "$en" \
		--secret-file "$state/secret" --policy cache --port 0 --port-file "$state/gateway.port" >"$state/gateway.log" 2>&1 &
	echo $! >>"$state/serve.pids"
	wait_port "$state/gateway.port"
	port=$(cat "$state/gateway.port")
	sleep 0.3
	echo "   gateway: http://127.0.0.1:$port/v1/completions (prefill $pf, decode $dc)"
	echo "   two requests sharing a long prefix (a ~1000-token document, different questions):"
	for i in 0 1; do
		"$build/tools/kvinfer-load" --port "$port" --requests 1 --concurrency 1 --prefixes 1 \
			--prefix-words 250 --max-tokens 8 --offset "$i" --label "request-$((i + 1))" |
			awk '{ for (k = 1; k <= NF; k++) { if ($k == "p50") t = $(k+1); if ($k == "prompt") p = $(k+1); if ($k == "cached") c = $(k+1) } }
			     { printf "   %s: TTFT %s ms, prompt %s tokens, cached_tokens %s\n", $1, t, p, c }'
	done
	# an 8x8 PNG, as a client sends it (a data URL in a chat message's image_url part)
	png=iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAbElEQVR4nBXNQRUAUQhCUaMYhShGeVGIQhSizB+XXA7ODDtouIHBQ4YOM8suWm5h8ZKl+0CskDiBsIioHhx76LiDw0eO3oN/4FVf+J8h0PduzBqZ8x/bxNQPwgaFy192SGgelC0q13/CJaXlA8Z7WAGfV950AAAAAElFTkSuQmCC
	img='{"messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture? "},{"type":"image_url","image_url":{"url":"data:image/png;base64,'$png'"}}]}],"max_tokens":8}'
	echo "   one picture sent twice (encode -> prefill -> decode; the embeddings cached on the mount):"
	for i in 1 2; do
		curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "$img" |
			grep -o '"prompt_tokens":[0-9]*\|"cached_tokens":[0-9]*' | tr '\n' ' ' |
			sed "s/^/   picture request-$i: /; s/\$/\n/"
	done
	em=$(cat "$state/encode0.metrics")
	echo "   encoder: $(curl -s "http://$em/metrics" | grep -E '^encoder_(encodes|cache_hits)_total' | tr '\n' ' ')"
	echo "   the KV blocks on the mount: $(find "$mnt/kv" -name '*.kvb' | wc -l) files, image embeddings: $(find "$mnt/kv" -name '*.kve' | wc -l)"
	echo "   try:  curl -s http://127.0.0.1:$port/v1/completions -d '{\"prompt\":\"Hello\",\"max_tokens\":8}'"
else
	echo "   (kvinfer, kvinfer-synth or kvinfer-load not built: skipped)"
fi

echo
echo "The cluster and the mount keep running at $mnt (state in $state)."
echo "metrics:    $(meta_metrics)(nodes, mount: $state/*.metrics)"
echo "stop them:  make demo-stop      (or: bash tools/demo.sh stop)"
echo "by hand:    fusermount3 -u $mnt && bash tools/kvfs-cluster.sh stop $state"
