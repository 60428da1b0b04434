#!/usr/bin/env bash
# ctest test_openai_client: the official openai npm client (openai_client.mjs) against
# `kvinfer serve` (embedded) and against `kvinfer gateway` with one prefill and one decode
# worker (disaggregated), both on a synthetic model from kvinfer-synth.
#   run.sh BUILD_DIR
# Exit 77 (skipped) when node or the client (npm ci in tests/clients, tools/install-deps.sh)
# is missing. Every process started here is stopped by PID on exit.
set -euo pipefail
BUILD=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null; then
	echo "node not installed: skipping the openai client test"
	exit 77
fi
if [ ! -d "$HERE/node_modules/openai" ]; then
	echo "openai npm package not installed (npm ci in tests/clients): skipping"
	exit 77
fi
KV="$BUILD/bin/kvinfer"
TMP=$(mktemp -d /tmp/test_openai_client.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${PIDS[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$TMP"
}
trap cleanup EXIT

wait_file() {
	for _ in $(seq 1 300); do
		[ -s "$1" ] && return 0
		sleep 0.05
	done
	echo "timed out waiting for $1" >&2
	return 1
}

"$BUILD/tools/kvinfer-synth" --preset small -o "$TMP/m.gguf" >/dev/null
mkdir -p "$TMP/kv" "$TMP/kv2"
COMMON=(-m "$TMP/m.gguf" -t 1 --block-tokens 16 --ignore-eos --ctx 4096)
MODELS="kvfs-small,gpt-kvfs"
# the gateways require API keys (docs/serving.md): one tenant for the client
export OPENAI_API_KEY=openai-client-test-key-0123456789
printf '%s tester\n' "$OPENAI_API_KEY" >"$TMP/keys"
printf 'openai-client-tenant-secret-0123456789\n' >"$TMP/tsecret"
KEYS=(--api-keys "$TMP/keys" --tenant-secret-file "$TMP/tsecret")

echo "== embedded: kvinfer serve"
"$KV" serve "${COMMON[@]}" --kv-dir "$TMP/kv" --port 0 --port-file "$TMP/port" \
	--model-id "$MODELS" "${KEYS[@]}" 2>"$TMP/serve.log" &
PIDS+=($!)
wait_file "$TMP/port"
node "$HERE/openai_client.mjs" "http://127.0.0.1:$(cat "$TMP/port")/v1" gpt-kvfs 4096 embedded

echo "== disaggregated: kvinfer gateway + prefill + decode"
printf 'openai-client-test-secret-0123456789\n' >"$TMP/secret"
"$KV" prefill "${COMMON[@]}" --kv-dir "$TMP/kv2" --secret-file "$TMP/secret" \
	--port-file "$TMP/pport" 2>"$TMP/prefill.log" &
PIDS+=($!)
"$KV" decode "${COMMON[@]}" --kv-dir "$TMP/kv2" --secret-file "$TMP/secret" \
	--port-file "$TMP/dport" 2>"$TMP/decode.log" &
PIDS+=($!)
wait_file "$TMP/pport"
wait_file "$TMP/dport"
"$KV" gateway --prefill "127.0.0.1:$(cat "$TMP/pport")" --decode "127.0.0.1:$(cat "$TMP/dport")" \
	--secret-file "$TMP/secret" --port 0 --port-file "$TMP/gport" --model-id "$MODELS" \
	"${KEYS[@]}" 2>"$TMP/gateway.log" &
PIDS+=($!)
wait_file "$TMP/gport"
node "$HERE/openai_client.mjs" "http://127.0.0.1:$(cat "$TMP/gport")/v1" kvfs-small 4096 disaggregated
