#!/usr/bin/env bash
# CI: gpuherd's libvirt hook under a real libvirtd. Runs as root on a clean
# Debian without systemd as PID 1: installs libvirt and QEMU, starts an agent
# on simulated hardware (l40s-4) and libvirtd by PID, and drives TCG guests
# (q35, 64 MiB, no disk) through virsh. The hook's prepare runs before
# libvirt checks the host for PCI passthrough, so refusals need no IOMMU; a
# guest that starts carries gpuherd's metadata but no hostdev.
#
# Proves: a domain naming GPUs that are not claimed for it is refused with
# the hook's message; a refused start releases nothing; a domain without
# GPUs starts while the agent is stopped; the claim is released at
# `virsh destroy` only for the domain that marked it; libvirtd restarted
# with a guest running calls reconnect and the guest survives; gpuherd's
# metadata re-serialised by Python's ElementTree (the namespace declared on
# <domain> as ns0) survives libvirt's define and dumpxml and is read by the
# hook, and a domain whose metadata libvirt does not hand over as gpuherd's
# is refused with the virsh metadata command that fixes it, which works.
#
# Set GPUHERD_LIBVIRT_NO_APT=1 to skip apt-get (tools already installed).
# Every missing tool is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

step() { printf '\n=== %s\n' "$*"; }
fail() {
	echo "libvirt.sh: FAIL: $*" >&2
	exit 1
}

[ "$(id -u)" -eq 0 ] || fail "run as root: libvirtd's QEMU driver runs privileged here"

step "tools"
if [ -z "${GPUHERD_LIBVIRT_NO_APT:-}" ]; then
	export DEBIAN_FRONTEND=noninteractive
	# No service of a package installed here may start: this is a build box.
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 0755 /usr/sbin/policy-rc.d
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends \
		libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 \
		libvirt-clients libxml2-utils python3 >/dev/null
	rm -f /usr/sbin/policy-rc.d
fi
for t in libvirtd virsh virt-xml-validate qemu-system-x86_64 python3; do
	command -v "$t" >/dev/null || fail "$t not found (Debian: libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 libvirt-clients libxml2-utils python3)"
done

step "golden XML against libvirt's schema and parser"
GPUHERD_LIBVIRT_TESTS=1 go test -count=1 -run 'TestGoldenDomainsValidate' ./agent/handoff

step "build"
make build >/dev/null
bin="$PWD/bin/gpuherd"

hookdir=/etc/libvirt/hooks/qemu.d
hook=$hookdir/50-gpuherd-ci
virsh() { command virsh -q -c qemu:///system "$@"; }
if virsh version >/dev/null 2>&1; then
	fail "a libvirtd already answers on qemu:///system: stop it first"
fi
# libvirtd runs every hook in the directory: another one (an installed
# gpuherd package's 50-gpuherd, say) would answer for this test's guests.
others=$(find "$hookdir" -mindepth 1 -maxdepth 1 ! -name "$(basename "$hook")" 2>/dev/null || true)
if [ -n "$others" ]; then
	fail "libvirt hooks already installed, which libvirtd would run for this test's guests too: $(echo "$others" | tr '\n' ' ')- remove them first"
fi

work=$(mktemp -d /tmp/gpuherd-libvirt.XXXXXX)
libvirtd_pid=""
agent_pid=""
qemu_conf_saved=""
cleanup() {
	set +e
	for d in guest-a guest-c plain vm-b bare guest-et guest-other; do
		virsh destroy "$d" >/dev/null 2>&1
		virsh undefine "$d" >/dev/null 2>&1
	done
	[ -n "$libvirtd_pid" ] && kill "$libvirtd_pid" 2>/dev/null && wait "$libvirtd_pid" 2>/dev/null
	[ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
	# A guest QEMU outlives libvirtd by design; this test's go with it.
	pkill -F "$work/guest-a.qemu.pid" 2>/dev/null
	rm -f "$hook"
	if [ -n "$qemu_conf_saved" ]; then
		mv "$qemu_conf_saved" /etc/libvirt/qemu.conf
	else
		rm -f /etc/libvirt/qemu.conf
	fi
	if [ "${status:-1}" -ne 0 ]; then
		echo "--- agent log"; tail -n 40 "$work/agent.log"
		echo "--- libvirtd log"; tail -n 40 "$work"/libvirtd*.log
		echo "--- hook calls"; cat "$work/hook.log"
	fi
	rm -rf "$work"
}
trap 'status=$?; cleanup; exit $status' EXIT

step "libvirtd as root without systemd"
# The QEMU driver refuses to start without these (FACTS: "Failed to parse
# group 'libvirt-qemu'").
getent group kvm >/dev/null || groupadd -r kvm
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
id libvirt-qemu >/dev/null 2>&1 || useradd -r -g libvirt-qemu -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
if [ -e /etc/libvirt/qemu.conf ]; then
	qemu_conf_saved="$work/qemu.conf.saved"
	cp -p /etc/libvirt/qemu.conf "$qemu_conf_saved"
fi
# No security driver, cgroups or namespaces in a container; QEMU's output
# to files, or a start needs virtlogd.
cat >/etc/libvirt/qemu.conf <<'EOF'
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
EOF

# The hook as the package installs it, pointed at this build and at the
# simulated agent's config; it logs each call so reconnect can be seen.
mkdir -p "$hookdir"
cat >"$hook" <<EOF
#!/bin/sh
echo "\$*" >>$work/hook.log
exec $bin libvirt-hook --config $work/gpuherd.yaml -- "\$@"
EOF
chmod 0755 "$hook"
: >"$work/hook.log"

cat >"$work/gpuherd.yaml" <<EOF
node_name: ci-gpu
simulate: l40s-4
data_dir: $work/data
socket: $work/gpuherd.sock
EOF
export GPUHERD_SOCKET="$work/gpuherd.sock"

start_agent() {
	"$bin" agent --config "$work/gpuherd.yaml" >>"$work/agent.log" 2>&1 &
	agent_pid=$!
	for _ in $(seq 100); do
		"$bin" status >/dev/null 2>&1 && return 0
		kill -0 "$agent_pid" 2>/dev/null || fail "the agent exited at start"
		sleep 0.1
	done
	fail "the agent did not answer within 10 s"
}
stop_agent() {
	kill "$agent_pid"
	wait "$agent_pid" || true
	agent_pid=""
}
start_libvirtd() {
	libvirtd --timeout 900 >>"$work/libvirtd.log" 2>&1 &
	libvirtd_pid=$!
	for _ in $(seq 150); do
		virsh version >/dev/null 2>&1 && return 0
		kill -0 "$libvirtd_pid" 2>/dev/null || fail "libvirtd exited at start"
		sleep 0.1
	done
	fail "libvirtd did not answer within 15 s"
}
stop_libvirtd() {
	kill "$libvirtd_pid"
	wait "$libvirtd_pid" || true
	libvirtd_pid=""
}

start_agent
start_libvirtd

# domain NAME CLAIM|- RELEASE(yes|no) GPUS(yes|no): a TCG q35 guest, 64 MiB,
# no disk; built from gpuherd's own -o libvirt-domain of vm-a.
domain() {
	local name=$1 claim=$2 release=$3 gpus=$4 edits=()
	edits=(-e 's#<domain type="kvm">#<domain type="qemu">#'
		-e 's#<memory unit="GiB">[0-9]*</memory>#<memory unit="MiB">64</memory>#'
		-e 's#<vcpu>[0-9]*</vcpu>#<vcpu>1</vcpu>#'
		-e '/<cpu mode="host-passthrough">/d'
		-e "s#<name>vm-a</name>#<name>$name</name>#")
	if [ "$claim" = - ]; then
		edits+=(-e '/<metadata>/d')
	else
		edits+=(-e "s#id=\"vm-a\"#id=\"$claim\"#")
	fi
	[ "$gpus" = no ] && edits+=(-e '/<hostdev/,/<\/hostdev>/d')
	sed "${edits[@]}" "$work/vm-a.release-$release.xml" >"$work/$name.xml"
	virsh define "$work/$name.xml" >/dev/null
}
held_by() { # the domain vm-a is in use by, "none", or "gone" when vm-a is not held
	local out
	out=$("$bin" get vm-a) || { echo gone; return; }
	out=$(sed -n 's/^In use by libvirt domain \([^ ]*\) .*/\1/p' <<<"$out")
	echo "${out:-none}"
}

step "claim vm-a on the simulated server"
"$bin" claim vm-a --gpu L40S
gpu=$("$bin" get vm-a | awk 'NR == 3 { print $1 }')
[[ "$gpu" =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0$ ]] || fail "no GPU address in gpuherd get vm-a: '$gpu'"
audio=${gpu%.0}.1
# What domain() builds on, made while the agent runs.
"$bin" get vm-a -o libvirt-domain >"$work/vm-a.release-no.xml"
"$bin" get vm-a -o libvirt-domain --release-on-stop >"$work/vm-a.release-yes.xml"

step "a domain naming GPUs not claimed for it is refused"
domain vm-b vm-b no yes
if out=$(virsh start vm-b 2>&1); then fail "vm-b started on vm-a's GPU"; fi
echo "$out"
want="The following GPUs are not claimed by vm-b: $gpu, $audio"
grep -qF "$want" <<<"$out" || fail "virsh start vm-b did not say: $want"
domain bare - no yes
if out=$(virsh start bare 2>&1); then fail "a domain without metadata started on vm-a's GPU"; fi
grep -qF "The following GPUs are not claimed by bare: $gpu" <<<"$out" || fail "virsh start bare: $out"
grep -q '^vm-b release end' "$work/hook.log" || fail "libvirt did not call release after the refused start"
[ "$(held_by)" = none ] || fail "a refused start changed vm-a: in use by $(held_by)"

step "ElementTree's metadata through libvirt's define/dumpxml round trip"
# hook_call NAME OP SUBOP FILE: the hook as libvirtd runs it, on FILE.
hook_call() { "$bin" libvirt-hook --config "$work/gpuherd.yaml" -- "$1" "$2" "$3" - <"$4"; }
ns=https://github.com/gpuherd/gpuherd/xmlns/libvirt/1
domain guest-et vm-a no yes
virsh undefine guest-et >/dev/null
# A script that edits domains with ElementTree writes them back so: the
# declaration moves to <domain>, the prefix becomes ns0.
python3 - "$work/guest-et.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
t = ET.parse(sys.argv[1])
t.write(sys.argv[1], encoding="unicode")
PY
grep -qF "<domain xmlns:ns0=\"$ns\"" "$work/guest-et.xml" || fail "ElementTree did not move the declaration: $(head -c 300 "$work/guest-et.xml")"
virsh define "$work/guest-et.xml" >/dev/null
virsh dumpxml guest-et >"$work/guest-et.dumped.xml"
grep -qF "id=\"vm-a\"" "$work/guest-et.dumped.xml" || fail "libvirt dropped gpuherd's metadata at define: $(sed -n '/<metadata/,/<\/metadata>/p' "$work/guest-et.dumped.xml")"
sed -n '/<metadata/,/<\/metadata>/p' "$work/guest-et.dumped.xml"
out=$(hook_call guest-et prepare begin "$work/guest-et.dumped.xml" 2>&1) || fail "the hook refused the dumped domain of vm-a: $out"
[ "$(held_by)" = guest-et ] || fail "the hook did not mark vm-a in use by guest-et: $(held_by)"
hook_call guest-et release end "$work/guest-et.dumped.xml" || fail "release end failed"
[ "$(held_by)" = none ] || fail "guest-et's release left vm-a in use by $(held_by)"
# Through virsh start: the hook lets it through, libvirt's own host checks
# stop it (the simulated GPU is not on this host's bus), and release follows.
if out=$(virsh start guest-et 2>&1); then fail "guest-et started on a simulated GPU"; fi
grep -qF "Hook script execution failed" <<<"$out" && fail "the hook refused guest-et under libvirtd: $out"
grep -q '^guest-et prepare begin' "$work/hook.log" || fail "libvirtd did not call the hook for guest-et"
[ "$(held_by)" = none ] || fail "the failed start left vm-a in use by $(held_by)"

# The same element in another namespace is not gpuherd's: the domain is
# judged by its name and the refusal says how to add the metadata.
sed -e "s#<name>guest-et</name>#<name>guest-other</name>#" -e "s#$ns#urn:example:other#" \
	-e '/<uuid>/d' "$work/guest-et.xml" >"$work/guest-other.xml"
virsh define "$work/guest-other.xml" >/dev/null
if out=$(virsh start guest-other 2>&1); then fail "guest-other started on vm-a's GPU"; fi
echo "$out"
grep -qF "guest-other passes this server's GPUs $gpu, $audio without gpuherd metadata" <<<"$out" || fail "the refusal does not say the metadata is missing: $out"
fix=$(grep -o "virsh metadata guest-other [^']*'<claim id=\"vm-a\"/>'" <<<"$out") || fail "the refusal names no virsh metadata command for vm-a: $out"
# The command as printed, through this script's virsh (qemu:///system).
echo "+ $fix"
eval "$fix" || fail "the printed fix failed: $fix"
virsh dumpxml guest-other >"$work/guest-other.dumped.xml"
out=$(hook_call guest-other prepare begin "$work/guest-other.dumped.xml" 2>&1) || fail "after the printed fix the hook still refuses: $out"
[ "$(held_by)" = guest-other ] || fail "after the fix vm-a is in use by $(held_by), want guest-other"
hook_call guest-other release end "$work/guest-other.dumped.xml" || fail "release end failed"
[ "$(held_by)" = none ] || fail "guest-other's release left vm-a in use by $(held_by)"

step "a domain without GPUs starts while the agent is stopped"
stop_agent
domain plain - no no
virsh start plain >/dev/null || fail "plain did not start without the agent"
[ "$(virsh domstate plain)" = running ] || fail "plain is $(virsh domstate plain)"
virsh destroy plain >/dev/null
# A gpuherd domain fails closed, saying why.
domain guest-c vm-a yes no
if out=$(virsh start guest-c 2>&1); then fail "guest-c started without the agent"; fi
grep -qF "the agent is not running" <<<"$out" || fail "virsh start guest-c: $out"
start_agent

step "the marking domain runs; another on the same claim is refused"
domain guest-a vm-a yes no
virsh start guest-a >/dev/null
[ "$(held_by)" = guest-a ] || fail "vm-a in use by $(held_by), want guest-a"
cp "/run/libvirt/qemu/guest-a.pid" "$work/guest-a.qemu.pid"
qemu_pid=$(cat "$work/guest-a.qemu.pid")
if out=$(virsh start guest-c 2>&1); then fail "guest-c started on vm-a while guest-a runs"; fi
grep -qF "claim vm-a is in use by domain guest-a" <<<"$out" || fail "virsh start guest-c: $out"
# guest-c's release after its refused start asks for release-on-stop: the
# claim stays, guest-a's.
"$bin" get vm-a >/dev/null || fail "guest-c's refused start released vm-a"
[ "$(held_by)" = guest-a ] || fail "guest-c's refused start changed vm-a: in use by $(held_by)"

step "libvirtd restarted with the guest running: reconnect, the guest survives"
stop_libvirtd
kill -0 "$qemu_pid" || fail "guest-a's QEMU died with libvirtd"
start_libvirtd
for _ in $(seq 50); do grep -q '^guest-a reconnect begin' "$work/hook.log" && break; sleep 0.1; done
grep -q '^guest-a reconnect begin' "$work/hook.log" || fail "libvirtd did not call reconnect for guest-a"
[ "$(virsh domstate guest-a)" = running ] || fail "guest-a is $(virsh domstate guest-a) after the restart"
kill -0 "$qemu_pid" || fail "guest-a's QEMU died at reconnect"
[ "$(held_by)" = guest-a ] || fail "after reconnect vm-a in use by $(held_by)"

step "virsh destroy of the marking domain releases the claim"
virsh destroy guest-a >/dev/null
for _ in $(seq 50); do "$bin" get vm-a >/dev/null 2>&1 || break; sleep 0.1; done
if "$bin" get vm-a >/dev/null 2>&1; then fail "vm-a still held after guest-a (release-on-stop) was destroyed"; fi
grep -q "$gpu .* free" <<<"$("$bin" status)" || fail "$gpu is not free after the release"

echo
echo "hook calls:"
cat "$work/hook.log"
echo
echo "libvirt.sh: ok"
