#!/usr/bin/env bash
# make test-kernel: prove gpuherd's vfio binding on a real Linux kernel.
#
# Boots Debian's cloud kernel under QEMU (TCG, q35, an emulated Intel IOMMU
# with interrupt remapping) with emulated PCI devices standing in for GPUs,
# and runs, inside, this package's static test binary: it binds and unbinds
# the devices through real sysfs with the vfio package, opens the groups
# through VFIO, then drives the gpuherd agent itself (static binary, its CLI)
# through claim, kill -9, restart, reconcile and release, checking the
# kernel's driver links after each step. The guest reports pass or fail
# through QEMU's isa-debug-exit device.
#
# Needs: Debian (apt-get), Go, gcc and libc6-dev (the agent links go-nvml
# with cgo, so it is linked statically with glibc). Installs qemu-system-x86,
# busybox-static, cpio and kmod when missing (as root). Downloads the kernel
# package with `apt-get download` into .cache/realkernel/ (never installs
# it). Touches nothing of this machine's own PCI devices: every sysfs write
# happens inside the guest.
#
# Environment:
#   GPUHERD_KERNEL_PACKAGE  kernel meta package (default linux-image-cloud-amd64)
#   GPUHERD_KERNEL_TIMEOUT  seconds QEMU may run (default 240)
#   GPUHERD_KERNEL_CACHE    cache directory (default <repo>/.cache/realkernel)
#   GO                      go command (default go)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
cache=${GPUHERD_KERNEL_CACHE:-$repo/.cache/realkernel}
kpkg=${GPUHERD_KERNEL_PACKAGE:-linux-image-cloud-amd64}
timeout_s=${GPUHERD_KERNEL_TIMEOUT:-240}
GO=${GO:-go}
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}

log() { printf 'test-kernel: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "needs an x86_64 host (qemu-system-x86_64, an amd64 kernel)"
t_start=$(date +%s)

# --- host packages -----------------------------------------------------------
apt_updated=
apt_update() {
	if [ -z "$apt_updated" ]; then
		apt-get update -qq >&2
		apt_updated=1
	fi
}
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx insmod && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v file >/dev/null || need+=(file)
if [ ${#need[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || die "missing ${need[*]}: run as root or install them (apt-get install ${need[*]})"
	log "installing ${need[*]}"
	apt_update
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
busybox=$(command -v busybox)
file -L "$busybox" | grep -q 'statically linked' || die "$busybox is not static (install busybox-static)"

# --- the kernel: downloaded and unpacked, never installed -----------------------
mkdir -p "$cache/debs"
kroot=$cache/kernel
if [ ! -f "$kroot/.complete" ]; then
	log "fetching $kpkg"
	rm -rf "$kroot" "$cache/debs"/*.deb
	(cd "$cache/debs" && { apt-get download "$kpkg" 2>/dev/null || { apt_update; apt-get download "$kpkg"; }; }) >&2
	debs=("$cache/debs"/*.deb)
	meta=${debs[0]}
	img=$(dpkg-deb -f "$meta" Depends | tr ',' '\n' | sed -n 's/^ *\(linux-image-[^ ]*\).*/\1/p' | head -n1)
	if [ -n "$img" ]; then
		(cd "$cache/debs" && apt-get download "$img") >&2
		debs=("$cache/debs/$img"_*.deb)
		deb=${debs[0]}
	else
		deb=$meta # not a meta package: the image itself
	fi
	dpkg-deb -x "$deb" "$kroot"
	touch "$kroot/.complete"
fi
kvers=("$kroot"/lib/modules/*)
kver=$(basename "${kvers[0]}")
vmlinuz=$kroot/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "no kernel image in $kroot/boot"
depmod -b "$kroot" "$kver"
log "kernel $kver"

# --- the initramfs ---------------------------------------------------------------
work=$cache/work
rm -rf "$work"
mkdir -p "$work/root"/{bin,dev,proc,sys,tmp,run,modules}
ir=$work/root

log "building the test binary and a static gpuherd"
(cd "$repo/tools" && CGO_ENABLED=0 "$GO" test -c -trimpath -o "$ir/realkernel.test" ./test/realkernel)
# go-nvml needs cgo, so the agent is linked statically against glibc;
# osusergo,netgo keep glibc's NSS (which would dlopen) out. NVML is off in
# the guest, so go-nvml's dlopen is never called.
# The linker warns that dlopen in a static binary needs the build's glibc
# at run time; that warning alone is filtered out.
if ! (cd "$repo" && "$GO" build -trimpath -tags osusergo,netgo \
	-ldflags '-s -w -linkmode external -extldflags "-static"' \
	-o "$ir/bin/gpuherd" ./cmd/gpuherd) 2> "$work/build.log"; then
	cat "$work/build.log" >&2
	die "building a static gpuherd failed"
fi
grep -v -e 'dlopen' -e 'dl.cgo2.c' -e '^# github.com/gpuherd' "$work/build.log" >&2 || true
file "$ir/bin/gpuherd" | grep -q 'statically linked' || die "bin/gpuherd is not static"

cp "$busybox" "$ir/bin/busybox"
# Modules in load order, each once; vfio_virqfd is gone from newer kernels
# (folded into vfio), so a missing optional module is skipped.
mods=(irqbypass vfio vfio_iommu_type1 vfio_virqfd vfio_pci_core vfio_pci virtio_pci virtio_net)
: > "$ir/modules/order"
for m in "${mods[@]}"; do
	if ! out=$(modprobe -d "$kroot" -S "$kver" --show-depends "$m" 2>/dev/null); then
		case $m in vfio_virqfd) log "no $m in $kver (folded into vfio): skipped"; continue ;; esac
		die "module $m not found in $kver"
	fi
	printf '%s\n' "$out" | awk '$1 == "insmod" { print $2 }' >> "$ir/modules/order"
done
awk '!seen[$0]++' "$ir/modules/order" > "$work/order"
: > "$ir/modules/order"
while read -r ko; do
	case $ko in *.ko) ;; *) die "compressed module $ko: unpack it first (not needed for bookworm)";; esac
	cp "$ko" "$ir/modules/"
	basename "$ko" >> "$ir/modules/order"
done < "$work/order"
cp "$here/init.sh" "$ir/init"
chmod +x "$ir/init"
(cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$work/initramfs.cpio"
t_built=$(date +%s)
log "initramfs $(du -h "$work/initramfs.cpio" | cut -f1) with $(wc -l < "$ir/modules/order") modules, built in $((t_built - t_start))s"

# --- the machine ------------------------------------------------------------------
# Groups (each device alone unless said otherwise):
#   00:03.0 edu             1234:11e8  no host driver
#   00:04.0 pci-testdev     1b36:0005  no host driver
#   00:05.0 virtio-rng      1af4:1005  host driver virtio-pci
#   00:06.0 pcie-pci-bridge, and behind it, one group (a PCIe-to-PCI bridge
#           takes the requester IDs of everything behind it):
#     edu            1234:11e8  allow-listed, no driver
#     virtio-balloon 1af4:1002  not allow-listed, on virtio-pci: the group is refused
#   00:07.0 a second pcie-pci-bridge, and behind it, one group:
#     edu            1234:11e8  allow-listed, no driver: a GPU that shares its
#                               group with the guest's own network card
#     virtio-net     1af4:1000  the guest's NIC on QEMU's user network
#                               (10.0.2.15, pings the gateway 10.0.2.2)
# intel-iommu first (it must precede the PCI devices), with interrupt
# remapping: without it VFIO_SET_IOMMU fails with EPERM.
log "booting (TCG, timeout ${timeout_s}s)"
set +e
timeout --foreground -k 5 "$timeout_s" qemu-system-x86_64 \
	-machine q35,accel=tcg,kernel-irqchip=split -cpu max -smp 2 -m 1024 \
	-nodefaults -display none -monitor none -serial stdio -no-reboot \
	-device intel-iommu,intremap=on \
	-device isa-debug-exit,iobase=0xf4,iosize=0x04 \
	-device edu,addr=03.0 \
	-device pci-testdev,addr=04.0 \
	-device virtio-rng-pci,addr=05.0,disable-legacy=off \
	-device pcie-pci-bridge,id=pcibr,addr=06.0 \
	-device edu,bus=pcibr,addr=01.0 \
	-device virtio-balloon-pci,bus=pcibr,addr=02.0 \
	-netdev user,id=net0,ipv6=off \
	-device pcie-pci-bridge,id=pcibr2,addr=07.0 \
	-device edu,bus=pcibr2,addr=01.0 \
	-device virtio-net-pci,netdev=net0,bus=pcibr2,addr=02.0,disable-legacy=off \
	-kernel "$vmlinuz" -initrd "$work/initramfs.cpio" \
	-append "console=ttyS0 intel_iommu=on panic=-1 quiet loglevel=4" \
	</dev/null | tee "$work/console.log"
rc=${PIPESTATUS[0]}
set -e
t_end=$(date +%s)
log "guest ran $((t_end - t_built))s; total $((t_end - t_start))s"
# isa-debug-exit: QEMU exits with (value << 1) | 1; the guest writes 0 on
# success, 1 on failure. 0 means the guest powered off without reporting.
case $rc in
1) grep -q '^REALKERNEL: PASS' "$work/console.log" || die "the guest reported success without its PASS line"
   log "PASS" ;;
3) die "the guest reported failures (console: $work/console.log)" ;;
124 | 137) die "QEMU ran past ${timeout_s}s (console: $work/console.log)" ;;
0) die "the guest powered off without reporting: the test binary did not run to the end (console: $work/console.log)" ;;
*) die "QEMU exited $rc (console: $work/console.log)" ;;
esac
