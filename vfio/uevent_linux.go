package vfio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ueventGroupKernel is the multicast group of the kernel's own uevents
// (udev re-broadcasts processed ones on group 2, which we do not want: it
// may not run, and it lags).
const ueventGroupKernel = 1

// ueventPollMillis bounds how long a read waits before looking at ctx again.
const ueventPollMillis = 500

// NetlinkUevents is the real PCIEventSource: the kernel's kobject-uevent
// netlink socket, opened with vishvananda/netlink's nl.Subscribe. It needs
// no privilege to listen. Events lost to a full socket buffer (ENOBUFS)
// are reported as one UeventResync.
type NetlinkUevents struct {
	Log *slog.Logger // may be nil
}

// WatchPCI implements PCIEventSource.
func (n NetlinkUevents) WatchPCI(ctx context.Context) (<-chan PCIEvent, error) {
	s, err := nl.Subscribe(unix.NETLINK_KOBJECT_UEVENT, ueventGroupKernel)
	if err != nil {
		return nil, fmt.Errorf("vfio: open the kernel's uevent netlink socket: %w", err)
	}
	// A burst (a card's functions rebinding, a hot-plug) must not overflow
	// the default buffer; force needs CAP_NET_ADMIN, so fall back.
	if err := s.SetReceiveBufferSize(4<<20, true); err != nil {
		_ = s.SetReceiveBufferSize(4<<20, false)
	}
	log := n.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := make(chan PCIEvent, 256)
	go func() {
		defer close(out)
		defer s.Close()
		fd := s.GetFd()
		buf := make([]byte, 64<<10)
		send := func(ev PCIEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for ctx.Err() == nil {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, ueventPollMillis); err != nil {
				if errors.Is(err, unix.EINTR) {
					continue
				}
				log.Error("PCI uevents: poll failed; no longer watching", "err", err)
				return
			}
			if pfd[0].Revents&unix.POLLIN == 0 {
				continue
			}
			nr, from, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
			switch {
			case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.ENOBUFS):
				log.Warn("PCI uevents lost (socket buffer full); re-reading every IOMMU group")
				if !send(PCIEvent{Action: UeventResync}) {
					return
				}
				continue
			case err != nil:
				log.Error("PCI uevents: read failed; no longer watching", "err", err)
				return
			}
			// Only the kernel (port 0) sends on this group; anything else
			// is not to be believed.
			if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
				continue
			}
			if ev, ok := parseUevent(buf[:nr]); ok && !send(ev) {
				return
			}
		}
	}()
	return out, nil
}
