#!/usr/bin/env bash
# CI: faults across servers. gpuherd agents as separate processes, each in its
# own network namespace (veth pairs to a bridge in a "hub" namespace,
# 10.77.0.0/24), concurrent clients that retry like real ones (the same ID and
# request through other agents, another request under a held ID, releases,
# IDs that never existed, node groups), and faults from fixed seeds: kill -9
# and restart, SIGSTOP, hub link down, split partitions, packet loss
# (nftables), and faults aimed at a claim's owner while clients retry it
# elsewhere (killed, frozen past a lease, cut off, partitioned with the name
# authority, a release sent to it frozen). Then the invariants are checked,
# once healed and with one member dead (tools/cmd/gpuherd-chaos,
# docs/testing.md). Runs as root on Linux; touches only the namespaces it
# creates; bounded: each run is killed after 120 s, the whole script takes
# about three and a half minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export CGO_CFLAGS=-Wno-deprecated-declarations

if [ "$(id -u)" -ne 0 ]; then
	echo "faults.sh: must run as root (network namespaces)" >&2
	exit 2
fi
if ! command -v ip >/dev/null || ! command -v nft >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends iproute2 nftables >/dev/null
fi

make build
(cd tools && go build -o ../bin/gpuherd-chaos ./cmd/gpuherd-chaos)
# FAULTS_NETNS_PREFIX names this run's namespaces, so that two runs on one
# machine (two checkouts) never remove each other's.
prefix="${FAULTS_NETNS_PREFIX:-ghc}"
# Whatever happens, leave no namespace (or agent in one) behind.
trap 'bin/gpuherd-chaos --cleanup --netns-prefix "$prefix" || true' EXIT

# Fixed seeds: a failure prints its seed, and the same command line replays
# the same schedule of faults and requests (timing still varies).
status=0
run() {
	timeout --signal=TERM --kill-after=15 120 bin/gpuherd-chaos --netns-prefix "$prefix" "$@" || status=1
}
run --seed 1 --agents 5 --duration 35s
run --seed 2 --agents 7 --duration 35s --claimers 12
run --seed 3 --agents 5 --duration 35s --fault-lanes 3 --owner-lanes 3
exit $status
