package fakekernel

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuherd/gpuherd/vfio"
)

// Process is a simulated process that opens VFIO groups: the QEMU of a
// running VM. Cmdline is its argv (QEMU's `-name guest=NAME` names the VM).
type Process struct {
	PID     int
	Comm    string
	Cmdline []string
}

// fakeOpen is one open /dev/vfio/N of a simulated process.
type fakeOpen struct {
	proc  Process
	group int
	fd    int
}

// OpenGroup makes p hold /dev/vfio/group open, as QEMU does from a VM's
// start to its end, until the returned close function runs. Like open(2)
// on the real node it fails with ENOENT while no member of the group is on
// vfio-pci (the node does not exist) and with EBUSY while another process
// holds the group. While the group is open, an unbind of a member from
// vfio-pci blocks until it is closed, as vfio-pci's remove waits for the
// device's user; UnbindsWhileOpen counts such unbinds.
func (k *Kernel) OpenGroup(group int, p Process) (closeGroup func(), err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	name := fmt.Sprintf("/dev/vfio/%d", group)
	if !slices.Contains(k.groups(func(d *kdev) bool { return d.Driver == vfio.DriverVFIO }), strconv.Itoa(group)) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	if p.PID <= 0 {
		return nil, fmt.Errorf("vfio: simulated kernel: open %s: pid %d is not a process ID", name, p.PID)
	}
	for _, o := range k.opens {
		if o.group == group {
			return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EBUSY}
		}
	}
	k.nextFD++
	o := &fakeOpen{proc: p, group: group, fd: 100 + k.nextFD}
	k.opens = append(k.opens, o)
	var once bool
	return func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if once {
			return
		}
		once = true
		k.opens = slices.DeleteFunc(k.opens, func(x *fakeOpen) bool { return x == o })
		if k.closed != nil {
			close(k.closed)
			k.closed = nil
		}
	}, nil
}

// UnbindsWhileOpen is how many unbinds from vfio-pci found their device's
// group open: each is a VM's GPU pulled from under it. gpuherd must never
// cause one.
func (k *Kernel) UnbindsWhileOpen() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.unbindsOpen
}

// waitGroupClosed blocks an unbind from vfio-pci of the device at addr
// while its group is open. The caller holds the device's lock, not k.mu.
func (k *Kernel) waitGroupClosed(addr string) {
	counted := false
	for {
		k.mu.Lock()
		d, ok := k.devs[addr]
		if !ok || d.Driver != vfio.DriverVFIO || !k.groupOpenLocked(d.IOMMUGroup) {
			k.mu.Unlock()
			return
		}
		if !counted {
			k.unbindsOpen++
			counted = true
		}
		if k.closed == nil {
			k.closed = make(chan struct{})
		}
		ch := k.closed
		k.mu.Unlock()
		<-ch
	}
}

func (k *Kernel) groupOpenLocked(group int) bool {
	for _, o := range k.opens {
		if o.group == group {
			return true
		}
	}
	return false
}

// Proc is the simulated machine's /proc: a directory per process holding a
// VFIO group open (OpenGroup), with fd links to /dev/vfio/N, comm and
// cmdline. The agent scans it instead of the host's /proc when it runs on
// this kernel.
func (k *Kernel) Proc() vfio.ProcFS { return kernelProc{k} }

type kernelProc struct{ k *Kernel }

func (p kernelProc) procs() map[int][]*fakeOpen {
	out := map[int][]*fakeOpen{}
	for _, o := range p.k.opens {
		out[o.proc.PID] = append(out[o.proc.PID], o)
	}
	return out
}

func (p kernelProc) split(op, name string) (int, []string, error) {
	parts := strings.Split(name, "/")
	pid, err := strconv.Atoi(parts[0])
	if err != nil {
		return 0, nil, &fs.PathError{Op: op, Path: name, Err: syscall.ENOENT}
	}
	if _, ok := p.procs()[pid]; !ok {
		return 0, nil, &fs.PathError{Op: op, Path: name, Err: syscall.ENOENT}
	}
	return pid, parts[1:], nil
}

func (p kernelProc) ReadDir(name string) ([]string, error) {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	if name == "." || name == "" {
		var out []string
		for pid := range p.procs() {
			out = append(out, strconv.Itoa(pid))
		}
		slices.Sort(out)
		return append(out, "self", "meminfo"), nil
	}
	pid, rest, err := p.split("readdir", name)
	if err != nil {
		return nil, err
	}
	if len(rest) == 1 && rest[0] == "fd" {
		out := []string{"0", "1", "2"}
		for _, o := range p.procs()[pid] {
			out = append(out, strconv.Itoa(o.fd))
		}
		return out, nil
	}
	return nil, &fs.PathError{Op: "readdir", Path: name, Err: syscall.ENOTDIR}
}

func (p kernelProc) Readlink(name string) (string, error) {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	pid, rest, err := p.split("readlink", name)
	if err != nil {
		return "", err
	}
	if len(rest) == 2 && rest[0] == "fd" {
		switch rest[1] {
		case "0", "1", "2":
			return "/dev/null", nil
		}
		for _, o := range p.procs()[pid] {
			if strconv.Itoa(o.fd) == rest[1] {
				return fmt.Sprintf("/dev/vfio/%d", o.group), nil
			}
		}
	}
	return "", &fs.PathError{Op: "readlink", Path: name, Err: syscall.ENOENT}
}

func (p kernelProc) ReadFile(name string) ([]byte, error) {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	pid, rest, err := p.split("read", name)
	if err != nil {
		return nil, err
	}
	proc := p.procs()[pid][0].proc
	if len(rest) == 1 {
		switch rest[0] {
		case "comm":
			return []byte(proc.Comm + "\n"), nil
		case "cmdline":
			return []byte(strings.Join(proc.Cmdline, "\x00") + "\x00"), nil
		}
	}
	return nil, &fs.PathError{Op: "read", Path: name, Err: syscall.ENOENT}
}
