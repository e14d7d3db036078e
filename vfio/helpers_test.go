package vfio_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Addresses of the simulated machine used across the tests.
const (
	gpuA   = "0000:3b:00.0" // H100 SXM5, group 12
	audioA = "0000:3b:00.1" // its HD audio function, group 12
	gpuB   = "0000:5e:00.0" // L40S, group 30
	nic    = "0000:3b:00.2" // Intel NIC, added to group 12 by some tests
	bridge = "0000:3a:00.0" // PCIe switch port, added to group 12 by some tests
)

func gpu(addr string, group int, driver string) fakekernel.Function {
	return fakekernel.Function{Address: addr, Vendor: vfio.VendorNVIDIA, Device: 0x2330, SubsystemVendor: vfio.VendorNVIDIA, SubsystemDevice: 0x16c1,
		Class: vfio.Class3D, IOMMUGroup: group, NUMANode: 0, Driver: driver}
}

func audio(addr string, group int, driver string) fakekernel.Function {
	return fakekernel.Function{Address: addr, Vendor: vfio.VendorNVIDIA, Device: 0x22ba, Class: vfio.ClassAudio, IOMMUGroup: group, NUMANode: 0, Driver: driver}
}

func nicDev(addr string, group int, driver string) fakekernel.Function {
	return fakekernel.Function{Address: addr, Vendor: 0x8086, Device: 0x10fb, Class: 0x020000, IOMMUGroup: group, NUMANode: 0, Driver: driver}
}

func bridgeDev(addr string, group int, driver string) fakekernel.Function {
	return fakekernel.Function{Address: addr, Vendor: 0x10b5, Device: 0x8747, Class: vfio.ClassBridge, IOMMUGroup: group, NUMANode: 0, Driver: driver}
}

// hostDrivers are loaded on the simulated hosts unless a test says otherwise.
var hostDrivers = []string{"nvidia", "snd_hda_intel", "xhci_hcd", "ixgbe", "pcieport"}

func bootKernel(t *testing.T, devs ...fakekernel.Function) *fakekernel.Kernel {
	t.Helper()
	k, err := fakekernel.New(fakekernel.Config{Drivers: hostDrivers, Devices: devs})
	if err != nil {
		t.Fatalf("fakekernel.New: %v", err)
	}
	return k
}

// driverOf reads where a device is bound through the same FS the code uses.
func driverOf(t *testing.T, f vfio.FS, addr string) (driver, override string) {
	t.Helper()
	d, err := vfio.New(f).Device(addr)
	if err != nil {
		t.Fatalf("Device(%s): %v", addr, err)
	}
	return d.Driver, d.DriverOverride
}

// testCtx is a context that ends before the test binary's own timeout, so a
// hang fails one test with a message instead of killing the run.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantWrites compares the writes a kernel received after index from.
func wantWrites(t *testing.T, k *fakekernel.Kernel, from int, want ...string) {
	t.Helper()
	got := k.Writes()[from:]
	var gs []string
	for _, w := range got {
		gs = append(gs, w.Name+" <- "+strings.TrimSuffix(w.Data, "\n")+errSuffix(w.Err))
	}
	if strings.Join(gs, "\n") != strings.Join(want, "\n") {
		t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(gs, "\n  "), strings.Join(want, "\n  "))
	}
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return " !" + err.Error()
}

// spyFS records every call that reaches it, to prove that nothing was
// read or written.
type spyFS struct {
	vfio.FS
	mu    sync.Mutex
	calls []string
}

func (s *spyFS) note(op, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, op+" "+name)
}

func (s *spyFS) ReadFile(name string) ([]byte, error) {
	s.note("read", name)
	return s.FS.ReadFile(name)
}

func (s *spyFS) WriteFile(name string, data []byte) error {
	s.note("write", name)
	return s.FS.WriteFile(name, data)
}

func (s *spyFS) Readlink(name string) (string, error) {
	s.note("readlink", name)
	return s.FS.Readlink(name)
}

func (s *spyFS) ReadDir(name string) ([]string, error) {
	s.note("readdir", name)
	return s.FS.ReadDir(name)
}

func (s *spyFS) Exists(name string) bool {
	s.note("exists", name)
	return s.FS.Exists(name)
}

func (s *spyFS) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// faultFS wraps an FS and changes what chosen writes and lookups do.
type faultFS struct {
	vfio.FS
	// write, when it returns handled, replaces the write.
	write func(name string, data []byte) (handled bool, err error)
	// hide makes Exists report false for these names.
	hide map[string]bool
}

func (f *faultFS) WriteFile(name string, data []byte) error {
	if f.write != nil {
		if handled, err := f.write(name, data); handled {
			return err
		}
	}
	return f.FS.WriteFile(name, data)
}

func (f *faultFS) Exists(name string) bool {
	if f.hide[name] {
		return false
	}
	return f.FS.Exists(name)
}

var errInjected = errors.New("injected failure")

func itoa(i int) string { return strconv.Itoa(i) }
