#!/usr/bin/env bash
# kvfs-cluster.sh — a local kvfs cluster on loopback: three kvfs-meta replicas (Raft) and N
# kvfs-node, each with its own directory under DIR and a 127.0.0.1 port, stopped by the PIDs it
# recorded.
#
#   tools/kvfs-cluster.sh start DIR [N=11] [extra kvfs-node args...]
#   tools/kvfs-cluster.sh stop DIR
#   tools/kvfs-cluster.sh status DIR
#   tools/kvfs-cluster.sh stop-node DIR I        SIGTERM node I (as named in DIR: nodeI/)
#   tools/kvfs-cluster.sh start-node DIR I       start node I again (same dir, same port); an
#                                                I not started before is a new node joining
#   tools/kvfs-cluster.sh restart-node DIR I     stop-node + start-node
#
# DIR gets: secret (random, 0600), meta.addr, nodeI/ + nodeI.addr, *.log, pids ("name pid"
# lines), node.args (the extra node args, reused by start-node). Binaries: $KVFS_BIN, else
# <repo>/build/bin. Extra meta args: $KVFS_META_ARGS. With KVFS_METRICS=1 every daemon also
# serves Prometheus /metrics on an ephemeral loopback port, its HOST:PORT in metaR.metrics
# (meta.metrics with one meta) and nodeI.metrics. `kvfs --cluster DIR ...` talks to the
# cluster.
#
# Meta is replicated by default (docs/meta.md, "Replicated metadata"): KVFS_META_REPLICAS
# replicas (any odd number up to 9; default 3). Replica R has metaR/ (RocksDB), raftR/ (its
# Raft log), metaR.log and a pids line "metaR PID"; meta.addr lists every replica's address,
# one per line (the first line is a valid address alone, for a tool that reads one; clients
# should be given them all: `paste -sd, DIR/meta.addr`). Ports are fixed at start so a replica
# restarted by hand (the command line is in metaR.cmd) keeps its address. KVFS_META_REPLICAS=1
# starts one unreplicated meta instead: meta/ (RocksDB), meta.log, pids line "meta PID".
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${KVFS_BIN:-$here/../build/bin}

die() { echo "kvfs-cluster: $*" >&2; exit 1; }

wait_file() { # path timeout_s
	local i
	for ((i = 0; i < $2 * 20; i++)); do
		[ -s "$1" ] && return 0
		sleep 0.05
	done
	return 1
}

alive() { # pid: running and one of ours (a kvfs daemon), not a reused pid
	[ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q 'kvfs-'
}

stop_cluster() {
	local dir=$1 name pid n
	[ -f "$dir/pids" ] || die "$dir/pids not found: no cluster started there"
	local pids=()
	while read -r name pid; do
		if alive "$pid"; then
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
	done <"$dir/pids"
	for ((n = 0; n < 100; n++)); do # 10 s, then KILL
		local left=0
		for pid in "${pids[@]}"; do alive "$pid" && left=1; done
		[ $left = 0 ] && break
		sleep 0.1
	done
	for pid in "${pids[@]}"; do
		if alive "$pid"; then
			echo "kvfs-cluster: pid $pid ignored SIGTERM: SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	rm -f "$dir/pids"
	echo "kvfs-cluster: stopped ${#pids[@]} processes of $dir"
}

metrics_args() { # name: the flags that serve its /metrics when KVFS_METRICS=1
	[ "${KVFS_METRICS:-0}" = 1 ] || return 0
	rm -f "$dir/$1.metrics"
	echo "--metrics-listen 127.0.0.1:0 --metrics-addr-file $dir/$1.metrics"
}

# Starts node i of $dir with the extra args in node_args; listens on its old port when it had
# one (clients and meta know that address).
spawn_node() { # i meta
	local i=$1 listen=127.0.0.1:0
	[ -s "$dir/node$i.addr" ] && listen=$(head -n1 "$dir/node$i.addr")
	rm -f "$dir/node$i.addr"
	# shellcheck disable=SC2046
	"$bin/kvfs-node" --dir "$dir/node$i" --secret-file "$dir/secret" --meta "$2" \
		--listen "$listen" --addr-file "$dir/node$i.addr" $(metrics_args "node$i") \
		"${node_args[@]}" </dev/null >>"$dir/node$i.log" 2>&1 &
	local pid=$!
	if grep -q "^node$i " "$dir/pids"; then
		sed -i "s/^node$i .*/node$i $pid/" "$dir/pids"
	else
		echo "node$i $pid" >>"$dir/pids"
	fi
}

node_pid() { # i: the pid of node i if it runs, else nothing
	local pid
	pid=$(awk -v n="node$1" '$1 == n { print $2 }' "$dir/pids")
	[ -n "$pid" ] && alive "$pid" && echo "$pid"
	return 0
}

meta_id() { # i: the id meta gave node i (kvfs status, by its address), or "?"
	local addr id
	addr=$(head -n1 "$dir/node$1.addr" 2>/dev/null) || true
	id=$("$bin/kvfs" --cluster "$dir" status 2>/dev/null | awk -v a="$addr" '$3 == a { print $1 }')
	echo "${id:-?}"
}

load_cluster() { # dir: sets dir, meta and node_args of a started cluster
	dir=$(cd "$1" && pwd)
	[ -f "$dir/pids" ] || die "$dir/pids not found: no cluster started there"
	meta=$(paste -sd, "$dir/meta.addr")
	node_args=()
	[ -f "$dir/node.args" ] && mapfile -d '' -t node_args <"$dir/node.args"
	return 0
}

stop_node() { # dir i
	load_cluster "$1"
	local i=$2 pid n
	[[ $i =~ ^[0-9]+$ ]] || die "node index must be a number, got '$i'"
	pid=$(node_pid "$i")
	[ -n "$pid" ] || { echo "kvfs-cluster: node$i is not running"; return 0; }
	local id
	id=$(meta_id "$i")
	kill -TERM "$pid" 2>/dev/null || true
	for ((n = 0; n < 100; n++)); do # 10 s, then KILL
		alive "$pid" || break
		sleep 0.1
	done
	if alive "$pid"; then
		echo "kvfs-cluster: pid $pid ignored SIGTERM: SIGKILL" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	echo "kvfs-cluster: stopped node$i (pid $pid, meta's node $id); meta marks it down after its --node-timeout"
}

start_node() { # dir i
	load_cluster "$1"
	local i=$2 addr t
	[[ $i =~ ^[0-9]+$ ]] || die "node index must be a number, got '$i'"
	[ -z "$(node_pid "$i")" ] || die "node$i already runs (pid $(node_pid "$i"))"
	spawn_node "$i" "$meta"
	wait_file "$dir/node$i.addr" 15 || die "node$i did not start: see $dir/node$i.log"
	addr=$(head -n1 "$dir/node$i.addr")
	for ((t = 0; t < 150; t++)); do # meta lists it up (its heartbeat arrived)
		"$bin/kvfs" --cluster "$dir" status 2>/dev/null | grep -q " up  *$addr " && break
		sleep 0.1
	done
	"$bin/kvfs" --cluster "$dir" status 2>/dev/null | grep -q " up  *$addr " ||
		die "node$i started but meta does not list it up: see $dir/node$i.log"
	echo "kvfs-cluster: node$i up at $addr (meta's node $(meta_id "$i"))"
}

free_port() { # a loopback TCP port nothing listens on now, below the ephemeral range (an
	# outgoing connection, Raft's own ones included, could take one from inside it)
	local p
	while :; do
		p=$((20000 + RANDOM % 12000))
		ss -Htln "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return 0; }
	done
}

start_replicas() { # n: n Raft replicas of meta, meta.addr one address a line
	local n=$1 r peers="" addrs=()
	for ((r = 1; r <= n; r++)); do
		addrs+=("127.0.0.1:$(free_port)")
		peers+="${peers:+,}$r=127.0.0.1:$(free_port)"
	done
	: >"$dir/meta.addr"
	for ((r = 1; r <= n; r++)); do
		echo "${addrs[r - 1]}" >>"$dir/meta.addr"
		# shellcheck disable=SC2086,SC2046
		local cmd=("$bin/kvfs-meta" --db "$dir/meta$r" --secret-file "$dir/secret"
			--listen "${addrs[r - 1]}" --addr-file "$dir/meta$r.addr" --raft-id "$r"
			--raft-peers "$peers" --raft-dir "$dir/raft$r" $(metrics_args "meta$r")
			${KVFS_META_ARGS:-})
		printf '%q ' "${cmd[@]}" >"$dir/meta$r.cmd"
		"${cmd[@]}" </dev/null >>"$dir/meta$r.log" 2>&1 &
		echo "meta$r $!" >>"$dir/pids"
	done
	for ((r = 1; r <= n; r++)); do
		wait_file "$dir/meta$r.addr" 15 ||
			{ stop_cluster "$dir"; die "meta$r did not start: see $dir/meta$r.log"; }
	done
	for ((t = 0; t < 150; t++)); do # a leader serves
		"$bin/kvfs" --cluster "$dir" meta status 2>/dev/null | grep -q " leader  *yes " && return 0
		sleep 0.1
	done
	stop_cluster "$dir"
	die "no meta replica became leader: see $dir/meta*.log"
}

start_cluster() {
	local dir=$1 n=${2:-11}
	shift $(($# < 2 ? $# : 2))
	[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "N must be a positive number, got '$n'"
	for b in kvfs-meta kvfs-node kvfs; do
		[ -x "$bin/$b" ] || die "$bin/$b not found: build first (make build) or set KVFS_BIN"
	done
	if [ -f "$dir/pids" ]; then
		while read -r _ pid; do
			alive "$pid" && die "$dir already runs a cluster (pid $pid): stop it first"
		done <"$dir/pids"
	fi
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ ! -s "$dir/secret" ]; then
		(umask 077 && head -c 24 /dev/urandom | base64 >"$dir/secret")
	fi
	chmod 600 "$dir/secret"
	: >"$dir/pids"
	rm -f "$dir"/meta*.addr "$dir"/node*.addr
	node_args=("$@")
	: >"$dir/node.args"
	[ $# -eq 0 ] || printf '%s\0' "$@" >"$dir/node.args"
	local meta reps=${KVFS_META_REPLICAS:-3}
	[[ $reps =~ ^[1-9]$ ]] && [ $((reps % 2)) = 1 ] ||
		die "KVFS_META_REPLICAS must be an odd number from 1 to 9, got '$reps'"
	if [ "$reps" = 1 ]; then
		# shellcheck disable=SC2086,SC2046
		"$bin/kvfs-meta" --db "$dir/meta" --secret-file "$dir/secret" --listen 127.0.0.1:0 \
			--addr-file "$dir/meta.addr" $(metrics_args meta) ${KVFS_META_ARGS:-} \
			</dev/null >>"$dir/meta.log" 2>&1 &
		echo "meta $!" >>"$dir/pids"
		wait_file "$dir/meta.addr" 15 || { stop_cluster "$dir"; die "meta did not start: see $dir/meta.log"; }
		meta=$(head -n1 "$dir/meta.addr")
	else
		start_replicas "$reps"
		meta=$(paste -sd, "$dir/meta.addr")
	fi
	for ((i = 0; i < n; i++)); do
		spawn_node "$i" "$meta"
	done
	for ((i = 0; i < n; i++)); do
		wait_file "$dir/node$i.addr" 15 ||
			{ stop_cluster "$dir"; die "node$i did not start: see $dir/node$i.log"; }
	done
	local up=""
	for ((t = 0; t < 150; t++)); do
		up=$("$bin/kvfs" --cluster "$dir" status 2>/dev/null | sed -n 's/^nodes: \([0-9]*\) up.*/\1/p')
		[ "$up" = "$n" ] && break
		sleep 0.1
	done
	[ "$up" = "$n" ] || { stop_cluster "$dir"; die "only ${up:-0} of $n nodes came up: see $dir/*.log"; }
	[ "$reps" = 1 ] || "$bin/kvfs" --cluster "$dir" meta status
	echo "kvfs-cluster: meta $meta + $n nodes up in $dir"
	echo "  use:  $bin/kvfs --cluster $dir status"
	echo "  stop: $0 stop $dir"
}

status_cluster() {
	local dir=$1 name pid
	[ -f "$dir/pids" ] || die "$dir/pids not found: no cluster started there"
	while read -r name pid; do
		if alive "$pid"; then echo "$name pid $pid running"; else echo "$name pid $pid NOT running"; fi
	done <"$dir/pids"
	"$bin/kvfs" --cluster "$dir" status
}

usage="usage: $0 start DIR [N=11] [node args...] | stop DIR | status DIR | stop-node DIR I | start-node DIR I | restart-node DIR I"
[ $# -ge 2 ] || die "$usage"
cmd=$1
shift
case $cmd in
start) start_cluster "$@" ;;
stop) stop_cluster "$1" ;;
status) status_cluster "$1" ;;
stop-node | start-node | restart-node)
	[ $# -eq 2 ] || die "$usage"
	[ "$cmd" = start-node ] || stop_node "$1" "$2"
	[ "$cmd" = stop-node ] || start_node "$1" "$2"
	;;
*) die "unknown command '$cmd' (start, stop, status, stop-node, start-node, restart-node)" ;;
esac
