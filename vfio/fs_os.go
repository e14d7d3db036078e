package vfio

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
)

// maxReadSize bounds one ReadFile. The largest attribute read here is PCI
// config space (4 KiB); a regular file in a test tree could be anything.
const maxReadSize = 1 << 16

// osFS is FS on real directories: /sys and /dev on a host, or a tree written
// by fakekernel.Kernel.WriteTree in tests.
type osFS struct {
	sysRoot string
	devRoot string
}

// NewOSFS returns the FS of a real machine: names are relative to sysRoot
// ("/sys" on a host), names under "/dev/" relative to devRoot ("/dev").
// Every access goes through os.Root, so neither a ".." in a name nor a
// symlink in the tree can reach a file outside its root.
func NewOSFS(sysRoot, devRoot string) FS {
	return &osFS{sysRoot: sysRoot, devRoot: devRoot}
}

// open resolves name to its root. The root is opened per call: these calls
// are rare, and a long-lived descriptor would pin a /sys or /dev that the
// operator may remount under a running agent.
func (o *osFS) open(op, name string) (*os.Root, string, error) {
	dev, rel, err := CleanName(op, name)
	if err != nil {
		return nil, "", err
	}
	dir := o.sysRoot
	if dev {
		dir = o.devRoot
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("open root %s: %w", dir, err)}
	}
	return r, rel, nil
}

func (o *osFS) ReadFile(name string) ([]byte, error) {
	r, rel, err := o.open("read", name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, io.LimitReader(f, maxReadSize+1)); err != nil {
		return nil, err
	}
	if buf.Len() > maxReadSize {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("%w: larger than %d bytes", ErrMalformed, maxReadSize)}
	}
	return buf.Bytes(), nil
}

// WriteFile issues exactly one write(2): sysfs stores act on each write, and
// splitting "0000:3b:00.0" over two would hand the kernel two bad addresses.
func (o *osFS) WriteFile(name string, data []byte) error {
	r, rel, err := o.open("write", name)
	if err != nil {
		return err
	}
	defer r.Close()
	// No O_CREATE: a missing attribute means the device or driver is gone,
	// and creating a plain file in its place would hide that.
	f, err := r.OpenFile(rel, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	n, werr := writeOnce(f, data)
	if werr != nil {
		werr = &fs.PathError{Op: "write", Path: name, Err: werr}
	}
	cerr := f.Close()
	switch {
	case werr != nil:
		return werr
	case n != len(data):
		return &fs.PathError{Op: "write", Path: name, Err: io.ErrShortWrite}
	}
	return cerr
}

func (o *osFS) Readlink(name string) (string, error) {
	r, rel, err := o.open("readlink", name)
	if err != nil {
		return "", err
	}
	defer r.Close()
	return r.Readlink(rel)
}

func (o *osFS) ReadDir(name string) ([]string, error) {
	r, rel, err := o.open("readdir", name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

func (o *osFS) Exists(name string) bool {
	r, rel, err := o.open("stat", name)
	if err != nil {
		return false
	}
	defer r.Close()
	_, err = r.Stat(rel)
	return err == nil
}
