package vfio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// ProcFS is the seam to /proc. Names are slash-separated and relative to the
// proc root ("1234/fd/7"); the root is configurable like the sysfs root
// (`proc_root`), and the fake kernel serves its own (fakekernel.Kernel.Proc).
type ProcFS interface {
	ReadDir(name string) ([]string, error)
	Readlink(name string) (string, error)
	ReadFile(name string) ([]byte, error)
}

// Opener is a process that holds a VFIO group open: the VMM (QEMU) of a
// running VM, or any other VFIO user.
type Opener struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm,omitempty"`
	// Domain is the VM's name when the process's command line shows it
	// (QEMU's `-name guest=NAME`, which libvirt always passes).
	Domain string `json:"domain,omitempty"`
}

// String names the opener for people: "pid 4242 (qemu-system-x86, domain vm-b)".
func (o Opener) String() string {
	s := "pid " + strconv.Itoa(o.PID)
	var in []string
	if o.Comm != "" {
		in = append(in, o.Comm)
	}
	if o.Domain != "" {
		in = append(in, "domain "+o.Domain)
	}
	if len(in) > 0 {
		s += " (" + strings.Join(in, ", ") + ")"
	}
	return s
}

// vfioGroupPrefix is what an open VFIO group's /proc/<pid>/fd link reads.
// The link shows the path the process opened, which on a host is always
// under /dev whatever the agent's dev_root.
const vfioGroupPrefix = "/dev/vfio/"

// DeniedError is a scan that could not read some processes' open files:
// the agent lacks CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE, which root needs
// to read the fd links of a process of another user (libvirt runs QEMU as
// libvirt-qemu). Whether those processes hold a group open is unknown.
type DeniedError struct {
	PIDs []int // the first few
	N    int
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("the open files of %d process(es) (pid %v) could not be read: the agent needs CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE (see the systemd unit)", e.N, e.PIDs)
}

// ScanOpeners reads every process's open files under proc and returns, by
// IOMMU group, the processes holding /dev/vfio/N open, each once, by PID.
// A process that exits during the scan is skipped. One whose open files
// may not be read makes the scan incomplete: the groups found are returned
// with a *DeniedError. An unreadable proc root is an error.
func ScanOpeners(proc ProcFS) (map[int][]Opener, error) {
	pids, err := proc.ReadDir(".")
	if err != nil {
		return nil, fmt.Errorf("reading the process list: %w", err)
	}
	out := map[int][]Opener{}
	denied := &DeniedError{}
	deny := func(pid int, err error) {
		if errors.Is(err, fs.ErrPermission) {
			denied.N++
			if len(denied.PIDs) < 5 {
				denied.PIDs = append(denied.PIDs, pid)
			}
		}
	}
	for _, p := range pids {
		pid, err := strconv.Atoi(p)
		if err != nil || pid <= 0 {
			continue
		}
		fds, err := proc.ReadDir(p + "/fd")
		if err != nil {
			deny(pid, err) // or gone
			continue
		}
		var groups []int
		for _, fd := range fds {
			target, err := proc.Readlink(p + "/fd/" + fd)
			if errors.Is(err, fs.ErrPermission) {
				deny(pid, err)
				break
			}
			if err != nil {
				continue // closed meanwhile
			}
			if !strings.HasPrefix(target, vfioGroupPrefix) {
				continue
			}
			g, err := strconv.Atoi(strings.TrimPrefix(target, vfioGroupPrefix))
			if err != nil || g < 0 {
				continue // /dev/vfio/vfio, the container
			}
			groups = append(groups, g)
		}
		if len(groups) == 0 {
			continue
		}
		o := Opener{PID: pid}
		if b, err := proc.ReadFile(p + "/comm"); err == nil {
			o.Comm = strings.TrimSpace(string(b))
		}
		if b, err := proc.ReadFile(p + "/cmdline"); err == nil {
			o.Domain = domainFromCmdline(b)
		}
		slices.Sort(groups)
		for _, g := range slices.Compact(groups) {
			out[g] = append(out[g], o)
		}
	}
	for _, list := range out {
		slices.SortFunc(list, func(x, y Opener) int { return x.PID - y.PID })
	}
	if denied.N > 0 {
		return out, denied
	}
	return out, nil
}

// domainFromCmdline finds QEMU's `-name [guest=]NAME[,opt=...]` in a
// NUL-separated command line. A comma inside the name is doubled, as
// QEMU's option syntax escapes it.
func domainFromCmdline(cmdline []byte) string {
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-name" && args[i] != "--name" {
			continue
		}
		v := strings.ReplaceAll(args[i+1], ",,", "\x00")
		parts := strings.Split(v, ",")
		name := parts[0]
		for _, p := range parts {
			if rest, ok := strings.CutPrefix(p, "guest="); ok {
				name = rest
			}
		}
		if strings.Contains(name, "=") {
			return "" // only options, no name
		}
		name = strings.ReplaceAll(name, "\x00", ",")
		if len(name) > 256 {
			name = name[:256]
		}
		return name
	}
	return ""
}

// osProc is ProcFS on a real /proc (or a copy of one in tests).
type osProc struct{ root string }

// NewOSProc returns the ProcFS of a machine, rooted at root ("/proc").
func NewOSProc(root string) ProcFS { return osProc{root: root} }

func (o osProc) name(op, name string) (string, error) {
	clean := path.Clean(name)
	if path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", &fs.PathError{Op: op, Path: name, Err: errors.New("name leaves the proc root")}
	}
	return o.root + "/" + clean, nil
}

func (o osProc) ReadDir(name string) ([]string, error) {
	p, err := o.name("readdir", name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

func (o osProc) Readlink(name string) (string, error) {
	p, err := o.name("readlink", name)
	if err != nil {
		return "", err
	}
	return os.Readlink(p)
}

func (o osProc) ReadFile(name string) ([]byte, error) {
	p, err := o.name("read", name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxReadSize))
}

// Accepts reports whether a free GPU on driver is where this policy leaves
// free GPUs: vfio-pci, any host driver or none for nvidia (the host driver
// may not be loaded), or no driver.
func (p IdlePolicy) Accepts(driver string) bool {
	return policyTarget(p).satisfiedBy(driver)
}
