package agent

import (
	"context"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
)

func TestFabricRefusesClaimsThatAreNotAPartition(t *testing.T) {
	ctx := context.Background()
	claim := func(a *Agent, id string, n int) error {
		_, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: n}}})
		return err
	}
	t.Run("stated", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t, dir)
		cfg.FabricMode = host.FabricShared
		a := startAgent(t, cfg, machine(t, "dgx-h100", dir), nil)
		defer a.Close()
		if st, _ := a.Status(ctx); st.Fabric != host.FabricShared {
			t.Errorf("status says fabric %q", st.Fabric)
		}
		err := claim(a, "vm-3", 3)
		if ae := apiErr(t, err); ae.Code != api.CodeNotAvailable {
			t.Errorf("3 GPUs: %v", err)
		}
		if err := claim(a, "vm-4", 4); err != nil {
			t.Errorf("4 GPUs, one partition: %v", err)
		}
		if err := claim(a, "vm-2", 2); err != nil {
			t.Errorf("2 GPUs, one partition: %v", err)
		}
	})
	t.Run("detected", func(t *testing.T) {
		dir := t.TempDir()
		a := startAgent(t, testConfig(t, dir), machine(t, "dgx-h100", dir), nil)
		defer a.Close()
		if f := a.host.Fabric(); f.Mode != host.FabricShared || f.Stated {
			t.Errorf("fabric %+v, want shared-nvswitch detected", f)
		}
		if err := claim(a, "vm-3", 3); err != nil {
			t.Errorf("3 GPUs on a detected fabric: %v (only a warning)", err)
		}
	})
}
