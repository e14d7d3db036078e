package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuherd/gpuherd/vfio"
)

// toVFIO moves a card to vfio-pci the way the agent does, through the kernel.
func toVFIO(t *testing.T, k vfio.FS, addr string) {
	t.Helper()
	dev := "bus/pci/devices/" + addr + "/"
	writes := []struct{ name, data string }{{dev + "driver_override", vfio.DriverVFIO}}
	if _, err := k.Readlink(dev + "driver"); err == nil {
		writes = append(writes, struct{ name, data string }{dev + "driver/unbind", addr})
	}
	writes = append(writes, struct{ name, data string }{"bus/pci/drivers_probe", addr})
	for _, w := range writes {
		if err := k.WriteFile(w.name, []byte(w.data)); err != nil {
			t.Fatalf("write %s: %v", w.name, err)
		}
	}
	link, err := k.Readlink(dev + "driver")
	if err != nil || filepath.Base(link) != vfio.DriverVFIO {
		t.Fatalf("%s: driver link %q, %v after the bind", addr, link, err)
	}
}

func deviceCount(t *testing.T, lib nvml.Interface) int {
	t.Helper()
	if r := lib.Init(); r != nvml.SUCCESS {
		t.Fatalf("Init: %v", r)
	}
	defer lib.Shutdown()
	n, r := lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		t.Fatalf("DeviceGetCount: %v", r)
	}
	return n
}

func TestStartBootsAndResumes(t *testing.T) {
	dir := t.TempDir()
	p, err := Builtin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Start(p, dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := deviceCount(t, m.NVML); n != 8 {
		t.Fatalf("NVML sees %d cards at boot, want 8", n)
	}
	moved := p.GPUs()[5].Address
	toVFIO(t, m.Kernel, moved)
	if n := deviceCount(t, m.NVML); n != 7 {
		t.Errorf("NVML sees %d cards with one on vfio-pci, want 7", n)
	}
	if b, err := os.ReadFile(filepath.Join(dir, ProfileStateFile)); err != nil || string(b) != "dgx-h100\n" {
		t.Errorf("%s: %q, %v", ProfileStateFile, b, err)
	}

	// The agent restarts; the machine kept running.
	again, err := Start(p, dir)
	if err != nil {
		t.Fatal(err)
	}
	if link, err := again.Kernel.Readlink("bus/pci/devices/" + moved + "/driver"); err != nil || filepath.Base(link) != vfio.DriverVFIO {
		t.Errorf("after a restart %s is on %q, %v; want vfio-pci still", moved, link, err)
	}
	if n := deviceCount(t, again.NVML); n != 7 {
		t.Errorf("after a restart NVML sees %d cards, want 7", n)
	}
}

func TestStartNoNVML(t *testing.T) {
	p, err := Builtin("l40s-4")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Start(p, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if m.NVML != nil {
		t.Error("NVML on a host without the nvidia driver")
	}
	for _, g := range p.GPUs() {
		if _, err := m.Kernel.Readlink("bus/pci/devices/" + g.Address + "/driver"); err == nil {
			t.Errorf("%s has a driver at boot", g.Address)
		}
	}
	toVFIO(t, m.Kernel, p.GPUs()[0].Address) // an unbound card binds straight away
}

func TestStartRefusesAnotherProfilesState(t *testing.T) {
	dir := t.TempDir()
	dgx, _ := Builtin("dgx-h100")
	l40s, _ := Builtin("l40s-4")
	if _, err := Start(dgx, dir); err != nil {
		t.Fatal(err)
	}
	_, err := Start(l40s, dir)
	if err == nil {
		t.Fatal("started l40s-4 on the state of dgx-h100")
	}
	for _, want := range []string{`"dgx-h100"`, `"l40s-4"`, "fresh data dir", dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	// Same name, different machine: a profile file edited since.
	edited, err := Parse([]byte("name: dgx-h100\nhost_drivers: [nvidia]\ngpus: [{device: \"2330\", count: 2}]\n"), "edited.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Start(edited, dir)
	if err == nil || !strings.Contains(err.Error(), "no longer matches") || !strings.Contains(err.Error(), "0000:ab:00.0 is not in the profile") {
		t.Errorf("edited profile: %v", err)
	}

	// A state without its sidecar is checked by its devices, then adopted.
	if err := os.Remove(filepath.Join(dir, ProfileStateFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(l40s, dir); err == nil || !strings.Contains(err.Error(), "no longer matches") {
		t.Errorf("l40s-4 on an unnamed dgx-h100 state: %v", err)
	}
	if _, err := Start(dgx, dir); err != nil {
		t.Errorf("dgx-h100 on its unnamed state: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ProfileStateFile)); string(b) != "dgx-h100\n" {
		t.Errorf("sidecar after adoption: %q", b)
	}
}

func TestEveryBuiltinBoots(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p, err := Builtin(name)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Start(p, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if err := sameDevices(m.Kernel, p); err != nil {
				t.Error(err)
			}
			for _, d := range p.KernelConfig().Devices {
				link, err := m.Kernel.Readlink("bus/pci/devices/" + d.Address + "/driver")
				if got := filepath.Base(link); (err == nil) != (d.Driver != "") || err == nil && got != d.Driver {
					t.Errorf("%s: driver %q (%v), want %q", d.Address, got, err, d.Driver)
				}
			}
			if m.NVML != nil {
				want := 0
				for _, g := range p.GPUs() {
					if g.Driver == vfio.DriverNVIDIA {
						want++
					}
				}
				if n := deviceCount(t, m.NVML); n != want {
					t.Errorf("NVML sees %d cards, want %d", n, want)
				}
			}
		})
	}
}
