#!/usr/bin/env bash
# kvinfer-vision-bench.sh — what a repeated image saves (issue 26's bar; docs/benchmarks.md,
# "Vision: a repeated image"): `kvinfer serve --mmproj` with a synthetic Qwen2-0.5B-shaped
# model and a CLIP ViT-B/16-shaped tower (224², 196 image tokens), a kv dir on local disk.
# Each round sends a new picture (cold: encoded, prefilled) and then the same request again
# (warm: embeddings and KV blocks from the kv dir); prints the time to the first token of both
# (max_tokens 1, non-streaming, so the whole request), the tower's encodes and time from
# /metrics, and checks the two answers' log-probabilities are equal. Starts and stops its own
# server.
#
# MODE=disagg runs the same requests through `kvinfer gateway --encode` over one encode, one
# prefill and one decode worker (shared kv dir; the tower's figures from the encoder's own
# /metrics).
#
#   tools/kvinfer-vision-bench.sh [BUILD]
#   env: ROUNDS=5 THREADS=2 TYPE=q8_0 PRESET=qwen2-0.5b MODE=embedded|disagg
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
rounds=${ROUNDS:-5} threads=${THREADS:-2} type=${TYPE:-q8_0} preset=${PRESET:-qwen2-0.5b}
mode=${MODE:-embedded}
dir=$(mktemp -d /var/tmp/kvinfer-vision-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done || true
	rm -rf "$dir"
}
trap cleanup EXIT
"$build/tools/kvinfer-synth" --preset "$preset" --type "$type" -o "$dir/m.gguf" \
	--mmproj "$dir/mmproj.gguf" --vit vit-b16 >/dev/null
mkdir "$dir/kv"
waitfile() {
	for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done
	cat "$dir"/*.log >&2
	return 1
}
k=$build/bin/kvinfer
if [ "$mode" = disagg ]; then
	head -c 32 /dev/urandom | base64 >"$dir/secret"
	chmod 600 "$dir/secret"
	"$k" encode --mmproj "$dir/mmproj.gguf" --kv-dir "$dir/kv" --secret-file "$dir/secret" \
		-t "$threads" --port-file "$dir/enc.port" --metrics-listen 127.0.0.1:0 \
		--metrics-addr-file "$dir/enc.maddr" >"$dir/enc.log" 2>&1 &
	pids+=($!)
	for r in prefill decode; do
		"$k" "$r" -m "$dir/m.gguf" --kv-dir "$dir/kv" --secret-file "$dir/secret" \
			-t "$threads" --port-file "$dir/$r.port" >"$dir/$r.log" 2>&1 &
		pids+=($!)
	done
	waitfile "$dir/enc.port" && waitfile "$dir/enc.maddr"
	waitfile "$dir/prefill.port" && waitfile "$dir/decode.port"
	"$k" gateway --open-gateway --prefill "127.0.0.1:$(cat "$dir/prefill.port")" \
		--decode "127.0.0.1:$(cat "$dir/decode.port")" \
		--encode "127.0.0.1:$(cat "$dir/enc.port")" --secret-file "$dir/secret" \
		--port 0 --port-file "$dir/port" >"$dir/gateway.log" 2>&1 &
	pids+=($!)
	waitfile "$dir/port"
	sleep 0.5 # the gateway's first health round
	metrics="http://$(cat "$dir/enc.maddr")/metrics"
	names="encoder_encodes_total encoder_encode_seconds_sum"
else
	"$k" serve -m "$dir/m.gguf" --mmproj "$dir/mmproj.gguf" --kv-dir "$dir/kv" \
		-t "$threads" --port 0 --port-file "$dir/port" --open-gateway >"$dir/serve.log" 2>&1 &
	pids+=($!)
	waitfile "$dir/port"
	metrics="http://127.0.0.1:$(cat "$dir/port")/metrics"
	names="vision_encodes_total vision_encode_seconds_total"
fi
echo "mode $mode, $preset $type, tower vit-b16, $threads threads"
python3 - "$(cat "$dir/port")" "$rounds" "$metrics" $names <<'PY'
import base64, json, statistics, struct, sys, time, urllib.request, zlib
port, rounds, murl, m_enc, m_sec = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6]
def png(seed, w=320, h=240):
    raw = b''.join(b'\0' + bytes(((x * 7 + y * 13 + seed * 101) * (seed | 1)) % 256
                                 for x in range(w * 3)) for y in range(h))
    ck = lambda t, d: struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
    return (b'\x89PNG\r\n\x1a\n' + ck(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
            + ck(b'IDAT', zlib.compress(raw)) + ck(b'IEND', b''))
def ask(seed):
    url = 'data:image/png;base64,' + base64.b64encode(png(seed)).decode()
    body = {'max_tokens': 1, 'temperature': 0, 'logprobs': True, 'messages': [{'role': 'user',
            'content': [{'type': 'text', 'text': 'What is in this picture? '},
                        {'type': 'image_url', 'image_url': {'url': url}},
                        {'type': 'text', 'text': ' Answer in one word.'}]}]}
    req = urllib.request.Request(f'http://127.0.0.1:{port}/v1/chat/completions',
                                 json.dumps(body).encode(), {'content-type': 'application/json'})
    t0 = time.monotonic()
    d = json.load(urllib.request.urlopen(req, timeout=600))
    dt = time.monotonic() - t0
    lp = [c['logprob'] for c in d['choices'][0]['logprobs']['content']]
    return dt, d['usage'], lp
def metric(name):
    for l in urllib.request.urlopen(murl).read().decode().split('\n'):
        if l.startswith(name + ' '):
            return float(l.split()[1])
    return 0.0
ask(1000)  # warm-up: page in the weights
cold, warm, enc_cold, enc_warm = [], [], [], []
for r in range(rounds):
    e0, s0 = metric(m_enc), metric(m_sec)
    t1, u1, lp1 = ask(r)
    e1, s1 = metric(m_enc), metric(m_sec)
    t2, u2, lp2 = ask(r)
    e2, s2 = metric(m_enc), metric(m_sec)
    same = lp1 == lp2
    print(f'round {r}: cold {t1*1000:7.1f} ms (encodes {e1-e0:.0f}, tower {1000*(s1-s0):6.1f} ms, '
          f'{u1["prompt_tokens"]} prompt, {u1["prompt_tokens_details"]["cached_tokens"]} cached)  '
          f'repeat {t2*1000:6.1f} ms (encodes {e2-e1:.0f}, tower {1000*(s2-s1):.1f} ms, '
          f'{u2["prompt_tokens_details"]["cached_tokens"]} cached)  same logprobs: {same}')
    if not same or e2 != e1:
        sys.exit('FAIL: the repeat differs or was encoded')
    cold.append(t1); warm.append(t2); enc_cold.append(s1 - s0); enc_warm.append(s2 - s1)
mc, mw = statistics.median(cold), statistics.median(warm)
print(f'median: cold {mc*1000:.1f} ms (tower {1000*statistics.median(enc_cold):.1f} ms), '
      f'repeat {mw*1000:.1f} ms (tower {1000*statistics.median(enc_warm):.1f} ms); '
      f'cold / repeat = {mc/mw:.1f}x')
PY
