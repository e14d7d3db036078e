#!/usr/bin/env bash
# Fuzz every target for a few seconds, one at a time. `make test` already
# runs each target's seed corpus (the f.Add seeds and testdata/fuzz/<Name>/);
# this explores beyond it. A crash writes the failing input to
# testdata/fuzz/<Name>/ in the package: commit it as a regression seed once
# the bug is fixed.
#
#   .ci/fuzz.sh            # every target, FUZZTIME each (default 10s)
#   FUZZTIME=1m .ci/fuzz.sh FuzzDecodeRequest FuzzMatch   # only these
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
FUZZTIME="${FUZZTIME:-10s}"

# package target
targets=(
	"./agent/api FuzzDecodeRequest"   # API request bodies, every request type
	"./agent FuzzDecodeConfig"        # the YAML config loader and validation
	"./agent/ledger FuzzDecodeClaim"  # ledger records as read at start
	"./agent/ledger FuzzJournal"      # the ledger's journal as read at start
	"./gossip FuzzDecodeSummary"      # the capacity summary other servers send
	"./vfio FuzzParsers"              # sysfs value parsers
	"./vfio FuzzValidateAddress"      # PCI addresses before any path is built
	"./vfio FuzzCleanName"            # sysfs names
	"./vfio FuzzKernelFS"             # the fake kernel's file system
	"./agent/inventory FuzzMatch"     # the model-name matcher
	"./agent/handoff FuzzParseDomain" # domain XML libvirt hands the hook
	"./agent/dra FuzzClaimFromTheAPIServer" # ResourceClaims the API server hands the DRA driver
)

only=" $* "
failed=0
for t in "${targets[@]}"; do
	read -r pkg name _ <<<"$t"
	if [ "$#" -gt 0 ] && [[ "$only" != *" $name "* ]]; then continue; fi
	corpus="$pkg/testdata/fuzz/$name"
	before=$(ls "$corpus" 2>/dev/null | sort)
	echo "== $name ($pkg, $FUZZTIME)"
	out=$(go test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -parallel 2 2>&1)
	rc=$?
	after=$(ls "$corpus" 2>/dev/null | sort)
	echo "$out" | tail -n 3
	if [ $rc -ne 0 ]; then
		if [ "$before" = "$after" ] && echo "$out" | grep -q '^    context deadline exceeded$' && ! echo "$out" | grep -q 'Failing input written'; then
			# golang/go#75804 (fixed in Go 1.27): the fuzz coordinator can
			# report its own -fuzztime deadline as a failure. No input
			# failed and none was written: not a finding.
			echo "   (the Go 1.26 fuzztime-deadline race, no failing input: ignored)"
			continue
		fi
		# What failed, without the progress lines: the tail alone can hide it.
		echo "$out" | grep -v '^fuzz: elapsed' | tail -n 40 | sed 's/^/   | /'
		echo "FAIL: $name; new inputs in $corpus:"
		comm -13 <(echo "$before") <(echo "$after") | sed 's/^/   /'
		failed=1
	fi
done
exit $failed
