#!/usr/bin/env bash
# CI: build the deb and rpm for amd64 and arm64, check what is inside, and
# install, run and remove the amd64 deb on this machine. Runs as root on a
# clean Debian without systemd as PID 1 (a container), so it installs its own
# tools and checks the maintainer scripts cope with that.
set -euo pipefail
# No `producer | grep -q`: grep -q exits at the first match, the producer
# may then die of SIGPIPE, and pipefail turns a match into a failure (an
# rpm query failed CI that way once). Match on the whole output instead:
# grep -q pattern <<<"$(producer)".
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

step() { printf '\n=== %s\n' "$*"; }
fail() {
	echo "packages.sh: $*" >&2
	exit 1
}

# The Makefile includes packaging.mk; until it does, name both.
mk=(make)
grep -Eq '^-?include +packaging\.mk' Makefile || mk=(make -f Makefile -f packaging.mk)

step "tools"
export DEBIAN_FRONTEND=noninteractive
# No service of a package installed here may start: this is a build box.
printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
chmod 0755 /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get update -qq
# gcc-aarch64-linux-gnu: go-nvml is cgo, so arm64 needs a cross C compiler.
# rpm: rpm -qp checks. systemd: systemd-analyze verify. prometheus: promtool.
# lintian, rpmlint: what Debian and Fedora check packages with.
apt-get install -y -qq --no-install-recommends \
	gcc libc6-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
	rpm systemd prometheus shellcheck binutils lintian rpmlint man-db >/dev/null

step "maintainer scripts (shellcheck)"
shellcheck -s sh packaging/scripts/deb/* packaging/scripts/rpm/* packaging/libvirt-hook

step "unit file (systemd-analyze verify)"
# verify wants ExecStart's binary to exist: check a copy of the unit that
# points at a freshly built one.
make build
unitdir=$(mktemp -d)
sed "s#^ExecStart=/usr/bin/gpuherd #ExecStart=$PWD/bin/gpuherd #" systemd/gpuherd.service >"$unitdir/gpuherd.service"
grep -q "^ExecStart=$PWD/bin/gpuherd agent" "$unitdir/gpuherd.service" || fail "ExecStart not rewritten"
out=$(systemd-analyze verify "$unitdir/gpuherd.service" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
systemd-analyze security --offline=yes --threshold=40 "$unitdir/gpuherd.service" | tail -1
sed "s#^ExecStart=/usr/bin/gpuherd-kubelet-plugin #ExecStart=$PWD/bin/gpuherd-kubelet-plugin #" systemd/gpuherd-kubelet-plugin.service >"$unitdir/gpuherd-kubelet-plugin.service"
grep -q "^ExecStart=$PWD/bin/gpuherd-kubelet-plugin --config" "$unitdir/gpuherd-kubelet-plugin.service" || fail "ExecStart not rewritten"
out=$(systemd-analyze verify "$unitdir/gpuherd-kubelet-plugin.service" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
systemd-analyze security --offline=yes --threshold=30 "$unitdir/gpuherd-kubelet-plugin.service" | tail -1

step "alert rules (promtool)"
promtool check rules packaging/prometheus/gpuherd-alerts.yml packaging/prometheus/gpuherd-dcgm.rules.yml
(cd packaging/prometheus && promtool test rules gpuherd-alerts_test.yml gpuherd-dcgm.rules_test.yml)

step "packages"
rm -rf dist # a stale build would be checked along with this one
"${mk[@]}" packages
"${mk[@]}" check-packages
[ "$(find dist -maxdepth 1 \( -name '*.deb' -o -name '*.rpm' \) | wc -l)" -eq 4 ] || fail "want 4 packages in dist/"
# The binaries must start without libnvidia-ml: NVML is dlopened, never linked.
for bin in dist/gpuherd-linux-amd64 dist/gpuherd-linux-arm64 dist/gpuherd-kubelet-plugin-linux-amd64 dist/gpuherd-kubelet-plugin-linux-arm64; do
	if grep -q 'NEEDED.*libnvidia-ml' <<<"$(readelf -d "$bin")"; then
		fail "$bin links libnvidia-ml"
	fi
done
for bin in dist/gpuherd-linux-arm64 dist/gpuherd-kubelet-plugin-linux-arm64; do
	grep -q 'AArch64' <<<"$(readelf -h "$bin")" || fail "$bin is not an arm64 binary"
done
# Distributions ship stripped binaries: no symbol table, no DWARF.
for bin in dist/gpuherd-linux-amd64 dist/gpuherd-linux-arm64 dist/gpuherd-kubelet-plugin-linux-amd64 dist/gpuherd-kubelet-plugin-linux-arm64; do
	if grep -Eq ' \.(symtab|debug_info|zdebug_info) ' <<<"$(readelf -S "$bin")"; then
		fail "$bin is not stripped"
	fi
done

step "lintian and rpmlint: no errors"
# Warnings that stay, on purpose: /var/lib/gpuherd is 0700 (the ledger is
# root's), the maintainer scripts call systemctl (like debhelper's).
lintian --fail-on error --tag-display-limit 0 dist/*.deb
rpmlint -c packaging/rpmlint.toml dist/*.rpm
# The license is stated, not a placeholder.
grep -qx 'License: Apache-2.0' packaging/deb/copyright || fail "packaging/deb/copyright names no license"
for p in dist/*.rpm; do
	[ "$(rpm -qp --qf '%{LICENSE}' "$p")" = Apache-2.0 ] || fail "$p: license field is not Apache-2.0"
	grep -q . <<<"$(rpm -qp --changelog "$p")" || fail "$p has no %changelog"
	grep -qx /usr/share/man/man1/gpuherd-claim.1.gz <<<"$(rpm -qdp "$p")" || fail "$p: man pages not marked as docs"
	grep -qx /usr/share/licenses/gpuherd/LICENSE <<<"$(rpm -qLp "$p")" || fail "$p: LICENSE not marked as a license"
	if grep -Eqi 'invalid|example|todo|changeme' <<<"$(rpm -qp --qf '%{PACKAGER}' "$p")"; then fail "$p: placeholder packager"; fi
done
for p in dist/*.deb; do
	if grep -Eqi 'invalid|example|todo|changeme' <<<"$(dpkg-deb -f "$p" Maintainer)"; then fail "$p: placeholder maintainer"; fi
done

step "install the amd64 deb"
deb=$(ls dist/gpuherd_*_amd64.deb)
dpkg -i "$deb"
/usr/bin/gpuherd version
/usr/bin/gpuherd --help >/dev/null
/usr/bin/gpuherd-kubelet-plugin --version
# The command of the plugin's former home runs the plugin's binary.
grep -q -- '--metrics-addr' <<<"$(/usr/bin/gpuherd kubelet-plugin --help)" || fail "gpuherd kubelet-plugin does not run gpuherd-kubelet-plugin"
# A man page for every command the help lists, rendered by man(1). Read
# from the package, not the file system: container images often tell dpkg
# to skip /usr/share/man.
mandir=$(mktemp -d)
dpkg-deb -x "$deb" "$mandir"
grep -q 'one server of the cluster' <<<"$(man -l "$mandir/usr/share/man/man1/gpuherd-claim.1.gz" 2>/dev/null | col -b | tr -s ' \n' '  ')" ||
	fail "man gpuherd-claim does not render the command's help"
for cmd in $(/usr/bin/gpuherd --help | awk '/^Available Commands:/ {on=1; next} on && /^$/ {on=0} on {print $1}'); do
	[ "$cmd" = help ] && continue
	[ -f "$mandir/usr/share/man/man1/gpuherd-$cmd.1.gz" ] || fail "no man page for gpuherd $cmd"
done
grep -q 'Dynamic Resource Allocation' <<<"$(man -l "$mandir/usr/share/man/man1/gpuherd-kubelet-plugin.1.gz" 2>/dev/null | col -b | tr -s ' \n' '  ')" ||
	fail "man gpuherd-kubelet-plugin does not render the plugin's help"
rm -rf "$mandir"
[ -f /etc/gpuherd/gpuherd.yaml ] || fail "no /etc/gpuherd/gpuherd.yaml"
[ -f /lib/systemd/system/gpuherd.service ] || fail "no unit file"
[ "$(stat -c %a /var/lib/gpuherd)" = 700 ] || fail "/var/lib/gpuherd is not 0700"
grep -qx vfio-pci /etc/modules-load.d/gpuherd-vfio.conf || fail "modules-load.d does not load vfio-pci"
hook=/etc/libvirt/hooks/qemu.d/50-gpuherd
[ "$(stat -c %a "$hook")" = 755 ] || fail "$hook is not an executable 0755"
# The installed hook runs gpuherd: a domain that is not gpuherd's passes
# without an agent.
echo "<domain type='kvm'><name>plain</name><uuid>00000000-0000-0000-0000-000000000001</uuid></domain>" |
	"$hook" plain prepare begin - || fail "$hook refused a domain without GPUs"
# README's socket_group: gpuherd must work on a fresh install.
getent group gpuherd >/dev/null || fail "the package did not create the group gpuherd"
# The installed unit itself verifies too.
systemd-analyze verify /lib/systemd/system/gpuherd.service /lib/systemd/system/gpuherd-kubelet-plugin.service
[ -f /usr/share/doc/gpuherd/kubevirt.md ] || fail "no /usr/share/doc/gpuherd/kubevirt.md"

step "not enabled, not running after install"
# is-enabled reads the unit files, so it answers without a running systemd.
state=$(systemctl is-enabled gpuherd.service 2>/dev/null || true)
[ "$state" = disabled ] || fail "after install gpuherd.service is '$state', want disabled"
state=$(systemctl is-enabled gpuherd-kubelet-plugin.service 2>/dev/null || true)
[ "$state" = disabled ] || fail "after install gpuherd-kubelet-plugin.service is '$state', want disabled"
if compgen -G '/etc/systemd/system/*.wants/gpuherd.service' >/dev/null; then
	fail "the package enabled gpuherd.service"
fi
if [ -d /run/systemd/system ]; then
	if systemctl is-active --quiet gpuherd.service; then fail "the package started gpuherd.service"; fi
fi
if grep -qx gpuherd /proc/[0-9]*/comm 2>/dev/null; then fail "a gpuherd process runs after install"; fi

step "upgrade in place (same version) keeps an edited config"
echo "log_level: debug" >>/etc/gpuherd/gpuherd.yaml
dpkg -i "$deb"
grep -qx "log_level: debug" /etc/gpuherd/gpuherd.yaml || fail "reinstall replaced the edited config"

step "remove keeps config and state; purge keeps the ledger and keys, and says so"
mkdir -p /var/lib/gpuherd && echo ledger >/var/lib/gpuherd/ledger.db
mkdir -p /etc/gpuherd/tls && echo key >/etc/gpuherd/gossip.key && echo cert >/etc/gpuherd/tls/node.crt
dpkg -r gpuherd
[ ! -e /usr/bin/gpuherd ] || fail "/usr/bin/gpuherd left after remove"
[ ! -e /usr/bin/gpuherd-kubelet-plugin ] || fail "/usr/bin/gpuherd-kubelet-plugin left after remove"
[ ! -e /lib/systemd/system/gpuherd.service ] || fail "unit left after remove"
[ ! -e /lib/systemd/system/gpuherd-kubelet-plugin.service ] || fail "plugin unit left after remove"
[ -f /etc/gpuherd/gpuherd.yaml ] || fail "remove deleted the config (only purge may)"
[ -f /var/lib/gpuherd/ledger.db ] || fail "remove deleted the ledger (only purge may)"
# The hook is a conffile, kept until purge: without the binary it must let
# every domain start, or removing gpuherd would stop a hypervisor's VMs.
echo "<domain type='kvm'><name>vm-1</name><metadata><g:claim xmlns:g='https://github.com/gpuherd/gpuherd/xmlns/libvirt/1' id='vm-1'/></metadata></domain>" |
	"$hook" vm-1 prepare begin - || fail "$hook refuses domains after gpuherd was removed"
out=$(dpkg -P gpuherd 2>&1) || fail "purge failed: $out"
echo "$out"
# A ledger deleted under running VMs loses every claim; keys cannot be
# downloaded again: purge keeps both and names them.
[ -f /var/lib/gpuherd/ledger.db ] || fail "purge deleted the claims ledger"
if [ ! -f /etc/gpuherd/gossip.key ] || [ ! -f /etc/gpuherd/tls/node.crt ]; then fail "purge deleted the operator's keys"; fi
echo "$out" | grep -q 'kept /var/lib/gpuherd' || fail "purge did not say where the ledger stays"
echo "$out" | grep -q 'kept /etc/gpuherd' || fail "purge did not say where the keys stay"
for p in /etc/gpuherd/gpuherd.yaml /etc/modules-load.d/gpuherd-vfio.conf /usr/share/doc/gpuherd /usr/share/gpuherd /usr/share/man/man1/gpuherd.1.gz "$hook"; do
	[ ! -e "$p" ] || fail "$p left after purge"
done
if dpkg -s gpuherd >/dev/null 2>&1; then fail "dpkg still knows gpuherd after purge"; fi
rm -rf /var/lib/gpuherd /etc/gpuherd
# With nothing of the operator's left, purge leaves nothing behind.
dpkg -i "$deb" >/dev/null
dpkg -P gpuherd >/dev/null 2>&1
for p in /etc/gpuherd /var/lib/gpuherd; do
	[ ! -e "$p" ] || fail "$p left after purging a package that holds nothing of the operator's"
done

echo
echo "packages.sh: ok"
