#!/bin/busybox sh
# shellcheck shell=dash
# /init of the test-kernel guest (see run.sh): mount the kernel's
# filesystems, load vfio and virtio-pci, run the test binary. The test binary
# reports pass or fail to QEMU itself (isa-debug-exit); reaching the end of
# this script means it did not, and QEMU exits 0, which run.sh counts as a
# failure.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
echo "init: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime)s"
while read -r ko; do
	insmod "/modules/$ko" || echo "init: insmod $ko failed"
done < /modules/order
echo "init: modules loaded, up $(cut -d' ' -f1 /proc/uptime)s"
GPUHERD_REAL_KERNEL=1 GPUHERD_REAL_KERNEL_EXIT=1 GPUHERD_BIN=/bin/gpuherd \
	/realkernel.test -test.v -test.count=1 -test.timeout=180s
echo "init: the test binary exited $? without reporting to QEMU"
poweroff -f
