package vfio

// FS is the seam through which this package touches the kernel. Names are
// slash-separated and relative to the sysfs root ("bus/pci/devices/0000:3b:00.0/vendor"),
// except names that start with "/dev/", which are relative to the device root
// ("/dev/vfio/12").
//
// WriteFile is one write(2) of data to an existing file, as `echo -n data > file`
// does: it never creates a file, and it may block for as long as the kernel does.
type FS interface {
	ReadFile(name string) ([]byte, error)
	WriteFile(name string, data []byte) error
	Readlink(name string) (string, error)
	ReadDir(name string) ([]string, error)
	Exists(name string) bool
}
