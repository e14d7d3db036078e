package main

import (
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// A member whose gossip summary cannot be read shows "-" where its data
// would be, and its error on a line under the table.
func TestMembersTableShowsSummaryError(t *testing.T) {
	var b strings.Builder
	w := newTable(&b)
	printMembers(w, []api.Member{
		{Name: "gpu-1", State: "alive", Self: true, AgentVersion: "v1.2.3",
			Models: []api.ModelAvailability{{Model: "NVIDIA L40S", Free: 3, Total: 4}}},
		{Name: "gpu-9", State: "alive", Models: []api.ModelAvailability{}, SummaryError: "gossip: summary format 9 is newer"},
	}, false)
	w.Flush()
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("members table:\n%s\nwant a header, two rows and one warning", out)
	}
	if f := strings.Fields(lines[2]); len(f) != 6 || f[0] != "gpu-9" || f[2] != "-" || f[3] != "-" || f[4] != "-" {
		t.Errorf("row of gpu-9 %q: want - for drained, capacity and version", lines[2])
	}
	if !strings.HasPrefix(lines[3], "warning: gpu-9: its gossip summary cannot be read (gossip: summary format 9 is newer)") {
		t.Errorf("line under the table %q", lines[3])
	}
	if strings.Contains(lines[1], "warning") || !strings.Contains(lines[1], "v1.2.3") {
		t.Errorf("row of gpu-1 %q", lines[1])
	}
}

func TestStatusTableShowsReadErrors(t *testing.T) {
	var b strings.Builder
	printStatusErrors(&b, api.Status{InUseError: "finding the VMs that use GPUs (proc_root /proc): permission denied",
		GPUs: []api.GPU{{PCIAddress: "0000:18:00.0", Driver: "vfio-pci"}, {PCIAddress: "0000:2a:00.0", DriverError: "device vanished"}}})
	want := "warning: 0000:2a:00.0: driver unknown, the device cannot be read: device vanished\n" +
		"warning: which VMs hold GPUs open is not known for every GPU: finding the VMs that use GPUs (proc_root /proc): permission denied; check proc_root and the agent's permissions\n"
	if b.String() != want {
		t.Errorf("under the status table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	printStatusErrors(&b, api.Status{GPUs: []api.GPU{{PCIAddress: "0000:18:00.0", Driver: "vfio-pci"}}})
	if b.String() != "" {
		t.Errorf("a status without errors printed %q", b.String())
	}
}
