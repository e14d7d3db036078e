package vfio_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// A /proc copy on disk: the scanner reads fd links, comm and cmdline the
// way it reads the host's.
func TestScanOpenersOnAProcTree(t *testing.T) {
	root := t.TempDir()
	proc := func(pid, comm string, cmdline string, links map[string]string) {
		t.Helper()
		fd := filepath.Join(root, pid, "fd")
		if err := os.MkdirAll(fd, 0o755); err != nil {
			t.Fatal(err)
		}
		for n, target := range links {
			if err := os.Symlink(target, filepath.Join(fd, n)); err != nil {
				t.Fatal(err)
			}
		}
		_ = os.WriteFile(filepath.Join(root, pid, "comm"), []byte(comm+"\n"), 0o644)
		_ = os.WriteFile(filepath.Join(root, pid, "cmdline"), []byte(cmdline), 0o644)
	}
	proc("4242", "qemu-system-x86", "/usr/bin/qemu-system-x86_64\x00-name\x00guest=vm-b,debug-threads=on\x00-S\x00",
		map[string]string{"0": "/dev/null", "17": "/dev/vfio/vfio", "18": "/dev/vfio/12", "19": "/dev/vfio/30", "20": "socket:[123]"})
	proc("77", "qemu-kvm", "qemu-kvm\x00-name\x00plain,,name,process=x\x00", map[string]string{"3": "/dev/vfio/7"})
	proc("90", "sshd", "sshd\x00", map[string]string{"3": "/dev/pts/0"})
	proc("91", "cloud-hypervisor", "cloud-hypervisor\x00", map[string]string{"3": "/dev/vfio/44", "4": "/dev/vfio/44"})
	if err := os.MkdirAll(filepath.Join(root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(root, "meminfo"), nil, 0o644)

	got, err := vfio.ScanOpeners(vfio.NewOSProc(root))
	if err != nil {
		t.Fatal(err)
	}
	vmB := vfio.Opener{PID: 4242, Comm: "qemu-system-x86", Domain: "vm-b"}
	want := map[int][]vfio.Opener{
		12: {vmB},
		30: {vmB},
		7:  {{PID: 77, Comm: "qemu-kvm", Domain: "plain,name"}},
		44: {{PID: 91, Comm: "cloud-hypervisor"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ScanOpeners = %+v\nwant %+v", got, want)
	}
	if s := vmB.String(); s != "pid 4242 (qemu-system-x86, domain vm-b)" {
		t.Errorf("String() = %q", s)
	}
	if _, err := vfio.ScanOpeners(vfio.NewOSProc(filepath.Join(root, "missing"))); err == nil {
		t.Error("a proc root that does not exist scanned without error")
	}
	if _, err := vfio.NewOSProc(root).ReadFile("../etc/passwd"); err == nil {
		t.Error("a name leaving the proc root was read")
	}
}

func TestDomainFromCmdline(t *testing.T) {
	for cmdline, want := range map[string]string{
		"qemu\x00-name\x00guest=vm-1,debug-threads=on\x00": "vm-1",
		"qemu\x00-name\x00vm-2\x00":                        "vm-2",
		"qemu\x00-name\x00debug-threads=on\x00":            "",
		"qemu\x00-name\x00":                                "",
		"qemu\x00-machine\x00q35\x00":                      "",
		"qemu\x00--name\x00a,,b\x00":                       "a,b",
	} {
		if got := vfio.DomainFromCmdline([]byte(cmdline)); got != want {
			t.Errorf("domainFromCmdline(%q) = %q, want %q", cmdline, got, want)
		}
	}
}

// The fake kernel's /dev/vfio/N opens obey open(2) on the real node, and
// an unbind from vfio-pci under an open group waits for it to close, as
// vfio-pci's remove waits for the device's user.
func TestKernelOpenGroup(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, ""), audio(audioA, 12, ""), gpu(gpuB, 30, "nvidia"))
	qemu := fakekernel.Process{PID: 4242, Comm: "qemu-system-x86", Cmdline: []string{"qemu", "-name", "guest=vm-b"}}
	if _, err := k.OpenGroup(30, qemu); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open of a group on nvidia: %v, want ENOENT (no node)", err)
	}
	b := vfio.NewBinder(vfio.New(k))
	if _, err := b.Bind(testCtx(t), gpuA); err != nil {
		t.Fatal(err)
	}
	closeGroup, err := k.OpenGroup(12, qemu)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.OpenGroup(12, fakekernel.Process{PID: 5}); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("second open of group 12: %v, want EBUSY", err)
	}
	got, err := vfio.ScanOpeners(k.Proc())
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int][]vfio.Opener{12: {{PID: 4242, Comm: "qemu-system-x86", Domain: "vm-b"}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("ScanOpeners(k.Proc()) = %+v, want %+v", got, want)
	}

	done := make(chan error, 1)
	go func() {
		_, err := b.Release(testCtx(t), gpuA, vfio.IdleNVIDIA)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("release under an open group returned (%v) before the group closed", err)
	case <-time.After(50 * time.Millisecond):
	}
	closeGroup()
	closeGroup() // twice is harmless
	if err := <-done; err != nil {
		t.Fatalf("release once the group closed: %v", err)
	}
	if d, _ := driverOf(t, k, gpuA); d != "nvidia" {
		t.Errorf("after release: %q", d)
	}
	if n := k.UnbindsWhileOpen(); n != 1 {
		t.Errorf("UnbindsWhileOpen = %d, want 1", n)
	}
	if got, _ := vfio.ScanOpeners(k.Proc()); len(got) != 0 {
		t.Errorf("after close: %+v", got)
	}
}

// A process whose open files may not be read (another user's, without
// CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE) makes the scan incomplete, and
// says so: the agent must not take "not found" for "not open".
func TestScanOpenersReportsUnreadableProcesses(t *testing.T) {
	p := deniedProc{pids: []string{"10", "11"}, deny: "11"}
	got, err := vfio.ScanOpeners(p)
	var de *vfio.DeniedError
	if !errors.As(err, &de) || de.N != 1 || de.PIDs[0] != 11 || !strings.Contains(err.Error(), "CAP_SYS_PTRACE") {
		t.Fatalf("err = %v, want a DeniedError naming pid 11 and the capabilities", err)
	}
	if len(got[3]) != 1 || got[3][0].PID != 10 {
		t.Errorf("what could be read is still returned: %+v", got)
	}
}

type deniedProc struct {
	pids []string
	deny string
}

func (d deniedProc) ReadDir(name string) ([]string, error) {
	if name == "." {
		return d.pids, nil
	}
	if name == d.deny+"/fd" {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}
	return []string{"3"}, nil
}

func (d deniedProc) Readlink(string) (string, error) { return "/dev/vfio/3", nil }
func (d deniedProc) ReadFile(string) ([]byte, error) { return nil, syscall.ENOENT }
