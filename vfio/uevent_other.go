//go:build !linux

package vfio

import (
	"context"
	"errors"
	"log/slog"
)

// NetlinkUevents is the real PCIEventSource on Linux; elsewhere WatchPCI
// fails and the agent re-reads groups on reload only.
type NetlinkUevents struct {
	Log *slog.Logger
}

// WatchPCI implements PCIEventSource.
func (NetlinkUevents) WatchPCI(context.Context) (<-chan PCIEvent, error) {
	return nil, errors.New("vfio: PCI uevents need Linux")
}
