package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// A claim that names its GPUs gets exactly them, bound to vfio-pci; a
// retry is the same claim; the same ID with other GPUs, a GPU held by
// another claim, a GPU this server does not have and a pin through another
// server are refused with the field and the reason.
func TestClaimPinnedDevices(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, cfg, m, nil)
	defer a.Close()
	ctx := context.Background()

	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{st.GPUs[5].PCIAddress, st.GPUs[2].PCIAddress}
	c, err := a.Claim(ctx, "k8s.pinned", api.ClaimRequest{Devices: want, Labels: map[string]string{"for": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(c.GPUs))
	for i, g := range c.GPUs {
		got[i] = g.PCIAddress
		if d := driverOf(t, m.Kernel, g.PCIAddress); d != vfio.DriverVFIO {
			t.Errorf("%s on %q, want vfio-pci", g.PCIAddress, d)
		}
	}
	if sorted := slices.Sorted(slices.Values(want)); !slices.Equal(got, sorted) {
		t.Fatalf("pinned claim holds %v, want %v", got, sorted)
	}
	if len(c.Items) != 1 || c.Items[0] != (api.Item{Model: "NVIDIA H100 80GB", Count: 2}) {
		t.Fatalf("items = %v, want 2x NVIDIA H100 80GB", c.Items)
	}
	again, err := a.Claim(ctx, "k8s.pinned", api.ClaimRequest{Devices: want, Labels: map[string]string{"for": "test"}})
	if err != nil || again.CreatedAt != c.CreatedAt {
		t.Fatalf("retry = %+v, %v; want the same claim", again, err)
	}

	for _, tc := range []struct {
		name  string
		id    string
		req   api.ClaimRequest
		code  string
		field string
	}{
		{"same ID, other GPUs", "k8s.pinned", api.ClaimRequest{Devices: []string{st.GPUs[0].PCIAddress, st.GPUs[1].PCIAddress}, Labels: map[string]string{"for": "test"}}, api.CodeConflict, ""},
		{"held by another claim", "k8s.other", api.ClaimRequest{Devices: []string{want[0]}}, api.CodeNotAvailable, ""},
		{"not on this server", "k8s.unknown", api.ClaimRequest{Devices: []string{"0000:ee:00.0"}}, api.CodeNotFound, "devices[0]"},
		{"not an address", "k8s.bad", api.ClaimRequest{Devices: []string{"../../bind"}}, api.CodeInvalid, "devices[0]"},
		{"named twice", "k8s.twice", api.ClaimRequest{Devices: []string{st.GPUs[0].PCIAddress, st.GPUs[0].PCIAddress}}, api.CodeInvalid, "devices[1]"},
		{"through another server", "k8s.far", api.ClaimRequest{Devices: []string{st.GPUs[0].PCIAddress}, PreferNode: "elsewhere"}, api.CodeInvalid, "devices"},
		{"items that do not match", "k8s.items", api.ClaimRequest{Devices: []string{st.GPUs[0].PCIAddress}, GPUs: []api.Item{{Model: "H100 80GB", Count: 2}}}, api.CodeInvalid, "gpus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Claim(ctx, tc.id, tc.req)
			e := apiErr(t, err)
			if e.Code != tc.code || e.Field != tc.field {
				t.Fatalf("claim = %s (field %q) %q; want %s on %q", e.Code, e.Field, e.Message, tc.code, tc.field)
			}
		})
	}
	// Nothing refused above took a GPU.
	st2, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, g := range st2.GPUs {
		if g.Claim != "" {
			held++
			if g.Claim != "k8s.pinned" || g.ClaimLabels["for"] != "test" {
				t.Errorf("%s held by %q with labels %v", g.PCIAddress, g.Claim, g.ClaimLabels)
			}
		}
	}
	if held != 2 {
		t.Fatalf("%d GPUs held, want 2", held)
	}
}

// A watcher is woken by the next change and told its generation; one that
// waits past the last change sees the same generation again when its wait
// ends.
func TestWatchWakesOnChange(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, cfg, m, nil)
	defer a.Close()
	ctx := context.Background()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan uint64, 1)
	go func() { woke <- a.WaitChange(ctx, st.Generation) }()
	if _, err := a.Claim(ctx, "vm-w", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	g := <-woke
	if g <= st.Generation {
		t.Fatalf("woken at generation %d, want past %d", g, st.Generation)
	}
	after, err := a.Status(ctx)
	if err != nil || after.Generation < g {
		t.Fatalf("status generation %d (%v), want at least %d", after.Generation, err, g)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if same := a.WaitChange(short, after.Generation); same != after.Generation {
		t.Fatalf("a wait with no change ended at %d, want %d", same, after.Generation)
	}
}
