package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/gossip"
)

// A member whose gossip summary does not decode is listed with the error
// in summary_error; nothing of the summary is shown as data (it was the
// agent_version before).
func TestMemberViewKeepsSummaryErrorApart(t *testing.T) {
	bad := gossip.Member{Name: "gpu-9", Addr: "10.0.0.9:7946", State: gossip.StateAlive,
		SummaryErr: errors.New("gossip: summary format 9 is newer than this agent's"),
		// What a partial decode may leave behind must not show.
		Summary: gossip.Summary{AgentVersion: "v9", Drained: true, Models: []gossip.ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: 4}}}}
	v := memberView(bad)
	if v.SummaryError != bad.SummaryErr.Error() || v.AgentVersion != "" || v.Drained || len(v.Models) != 0 || v.NamesRole != "" {
		t.Fatalf("member view %+v: want the error in SummaryError and no data from the summary", v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"summary_error":"gossip: summary format 9`) || strings.Contains(string(b), "agent_version") {
		t.Fatalf("JSON %s: want summary_error and no agent_version", b)
	}

	good := gossip.Member{Name: "gpu-1", State: gossip.StateAlive,
		Summary: gossip.Summary{AgentVersion: "v1.2.3", Models: []gossip.ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: 3, Healthy: 4}}}}
	v = memberView(good)
	if v.SummaryError != "" || v.AgentVersion != "v1.2.3" || len(v.Models) != 1 || v.Models[0].Free != 3 {
		t.Fatalf("member view of a readable summary %+v", v)
	}
	b, _ = json.Marshal(v)
	if strings.Contains(string(b), "summary_error") {
		t.Fatalf("JSON of a readable member has summary_error: %s", b)
	}
}

// failingProc is a /proc that cannot be listed.
type failingProc struct{}

func (failingProc) ReadDir(string) ([]string, error) { return nil, errors.New("permission denied") }
func (failingProc) Readlink(string) (string, error)  { return "", errors.New("permission denied") }
func (failingProc) ReadFile(string) ([]byte, error)  { return nil, errors.New("permission denied") }

// Status says in its own fields what it could not read: the processes
// holding VFIO groups open (in_use_error), and a GPU's device
// (driver_error, driver empty).
func TestStatusReportsWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "l40s-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()

	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.InUseError != "" {
		t.Fatalf("in_use_error %q on a readable /proc", st.InUseError)
	}
	for _, g := range st.GPUs {
		if g.DriverError != "" {
			t.Fatalf("GPU %s: driver_error %q on a readable device", g.PCIAddress, g.DriverError)
		}
	}

	a.host.SetProc(failingProc{})
	gone := st.GPUs[0].PCIAddress
	if err := m.Kernel.Remove(gone); err != nil {
		t.Fatal(err)
	}
	st, err = a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.InUseError, "permission denied") || !strings.Contains(st.InUseError, "finding the VMs that use GPUs") {
		t.Errorf("in_use_error %q: want why /proc could not be read", st.InUseError)
	}
	for _, g := range st.GPUs {
		switch {
		case g.PCIAddress == gone && (g.DriverError == "" || g.Driver != ""):
			t.Errorf("removed GPU %s: driver %q, driver_error %q; want the read error and no driver", g.PCIAddress, g.Driver, g.DriverError)
		case g.PCIAddress != gone && g.DriverError != "":
			t.Errorf("GPU %s: driver_error %q", g.PCIAddress, g.DriverError)
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"in_use_error":"finding the VMs`) || !strings.Contains(string(b), `"driver_error":`) {
		t.Errorf("status JSON lacks in_use_error or driver_error: %s", b)
	}
}
