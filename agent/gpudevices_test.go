package agent

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// TestGPUDevicesStandIn runs the agent on a machine without any NVIDIA card,
// where gpu_devices makes QEMU's edu device stand in for a GPU, as
// tools/test/realkernel does under a real kernel.
func TestGPUDevicesStandIn(t *testing.T) {
	k, err := fakekernel.New(fakekernel.Config{Devices: []fakekernel.Function{
		{Address: "0000:00:03.0", Vendor: 0x1234, Device: 0x11e8, Class: 0x00ff00, IOMMUGroup: 3, NUMANode: -1},
		{Address: "0000:00:04.0", Vendor: 0x1b36, Device: 0x0005, Class: 0x00ff00, IOMMUGroup: 4, NUMANode: -1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := testConfig(t, t.TempDir())
	cfg.IdleDriver = "none"
	cfg.AllowDevices = []string{"1234:11e8", "1b36:0005"}

	// Without gpu_devices the machine has no GPU.
	a, err := New(ctx, cfg, quietLog(), WithSysfs(k, nil))
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GPUs) != 0 {
		t.Fatalf("GPUs without gpu_devices: %+v", st.GPUs)
	}
	a.Close()

	cfg.GPUDevices = []string{"1234:11e8"}
	a, err = New(ctx, cfg, quietLog(), WithSysfs(k, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, err = a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GPUs) != 1 || st.GPUs[0].PCIAddress != "0000:00:03.0" || st.GPUs[0].Model != "1234:11e8" || st.GPUs[0].State != api.StateFree {
		t.Fatalf("GPUs %+v, want the edu device, free, as model 1234:11e8", st.GPUs)
	}
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "1234:11e8", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.GPUs) != 1 || driverOf(t, k, "0000:00:03.0") != vfio.DriverVFIO || !k.Exists("/dev/vfio/3") {
		t.Fatalf("claim %+v: edu device not on vfio-pci", c)
	}
	if _, err := a.Release(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	if d := driverOf(t, k, "0000:00:03.0"); d != "" {
		t.Errorf("edu device on %q after release with idle driver none", d)
	}
	if d := driverOf(t, k, "0000:00:04.0"); d != "" {
		t.Errorf("pci-testdev, not in gpu_devices, was moved to %q", d)
	}
}

func TestValidateGPUDevices(t *testing.T) {
	for _, tc := range []struct {
		name  string
		allow []string
		ids   []string
		want  string // "" valid, else part of the error
	}{
		{"empty", []string{"10de:*"}, nil, ""},
		{"listed and allowed", []string{"10de:*", "1b36:0005"}, []string{"1b36:0005"}, ""},
		{"allowed by a vendor wildcard", []string{"1b36:*"}, []string{"1b36:0005"}, ""},
		{"not on the allow list", []string{"10de:*"}, []string{"1b36:0005"}, "not on allow_devices"},
		{"a whole vendor", []string{"1b36:*"}, []string{"1b36:*"}, "exact vendor:device"},
		{"not hex", []string{"10de:*"}, []string{"edu"}, "vendor:device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.NodeName = "n"
			cfg.AllowDevices, cfg.GPUDevices = tc.allow, tc.ids
			err := cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Key != "gpu_devices" || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want a gpu_devices error about %q", err, tc.want)
			}
		})
	}
}
