package fakekernel_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// The simulated machine outlives its agent: a restart (a second fakekernel.Open
// on the same file) finds drivers, overrides and faults as they were.
func TestOpenKernelKeepsStateAcrossRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "machine.json")
	cfg := fakekernel.Config{Drivers: hostDrivers, Devices: []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"), gpu(gpuB, 30, "nvidia")}}

	k, err := fakekernel.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vfio.NewBinder(vfio.New(k)).Bind(testCtx(t), gpuA); err != nil {
		t.Fatal(err)
	}
	if err := k.SetConfigAllOnes(gpuB); err != nil {
		t.Fatal(err)
	}

	// Restart with a different config: the file wins.
	k2, err := fakekernel.Open(path, fakekernel.Config{Drivers: []string{"nvidia"}, Devices: []fakekernel.Function{gpu("0000:01:00.0", 1, "")}})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{gpuA: vfio.DriverVFIO, audioA: vfio.DriverVFIO, gpuB: "nvidia"} {
		if d, o := driverOf(t, k2, addr); d != want || (want == vfio.DriverVFIO && o != vfio.DriverVFIO) {
			t.Errorf("after restart %s on %q override %q, want %q", addr, d, o, want)
		}
	}
	if !k2.Exists("/dev/vfio/12") {
		t.Error("after restart /dev/vfio/12 is gone")
	}
	if err := vfio.New(k2).Health(gpuB); err == nil {
		t.Error("after restart the card that fell off the bus is healthy again")
	}
	// Loaded drivers were kept too: Release can reprobe to the host drivers.
	if _, err := vfio.NewBinder(vfio.New(k2)).Release(testCtx(t), gpuA, vfio.IdleNVIDIA); err != nil {
		t.Fatal(err)
	}
	k3, err := fakekernel.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := driverOf(t, k3, audioA); d != "snd_hda_intel" {
		t.Errorf("after a second restart the audio function is on %q", d)
	}

	// Every save replaced the file whole; no temporary file is left.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("state directory holds %d entries, want only the state file", len(entries))
	}
	var st struct {
		Version int `json:"version"`
	}
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &st); err != nil || st.Version != 1 {
		t.Errorf("state file version %d, %v", st.Version, err)
	}
}

func TestOpenKernelRefusesBadState(t *testing.T) {
	tests := map[string]string{
		"torn file":      `{"version":1,"drivers":["nvidia"],"devi`,
		"future version": `{"version":2,"drivers":[],"devices":[]}`,
		"hostile device": `{"version":1,"drivers":[],"devices":[{"address":"../../etc","iommu_group":1}]}`,
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "machine.json")
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := fakekernel.Open(path, fakekernel.Config{})
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("fakekernel.Open = %v, want an error naming %s", err, path)
			}
			if b, _ := os.ReadFile(path); string(b) != content {
				t.Error("a refused state file was overwritten")
			}
		})
	}
}

func TestOpenKernelCleansStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "machine.json")
	// What a kill -9 between CreateTemp and Rename leaves behind.
	if err := os.WriteFile(path+".tmp123", []byte(`{"version":1,"dev`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fakekernel.Open(path, fakekernel.Config{Devices: []fakekernel.Function{gpu(gpuA, 12, "")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".tmp123"); !os.IsNotExist(err) {
		t.Errorf("stale temporary file still there: %v", err)
	}
}
