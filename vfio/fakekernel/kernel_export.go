package fakekernel

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteTree writes the simulated sysfs, as it is now, to dir as a real
// directory tree: directories, attribute files and relative symlinks laid
// out as the kernel lays them out, so that vfio.NewOSFS(dir, ...) reads the
// same devices as the Kernel and an operator can point `--sysfs-root` at it.
// Attributes get the kernel's modes (0444 read-only, 0644 driver_override,
// 0200 bind, unbind and drivers_probe). dir must be empty or absent.
func (k *Kernel) WriteTree(dir string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("vfio: write simulated sysfs tree: %w", err)
	}
	if err := k.writeNode(dir, nil); err != nil {
		return fmt.Errorf("vfio: write simulated sysfs tree to %s: %w", dir, err)
	}
	return nil
}

// WriteDevTree writes the simulated /dev/vfio into dir (dir/vfio/vfio,
// dir/vfio/N) as empty regular files: enough for vfio.NewOSFS's existence
// checks without the privileges mknod needs.
func (k *Kernel) WriteDevTree(dir string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	n, _ := k.devNode([]string{"vfio"})
	vfio := filepath.Join(dir, "vfio")
	if err := os.MkdirAll(vfio, 0o755); err != nil {
		return fmt.Errorf("vfio: write simulated /dev tree: %w", err)
	}
	for _, c := range n.entries() {
		if err := os.WriteFile(filepath.Join(vfio, c), nil, 0o600); err != nil {
			return fmt.Errorf("vfio: write simulated /dev tree: %w", err)
		}
	}
	return nil
}

func (k *Kernel) writeNode(root string, parts []string) error {
	n, ok := k.node(parts)
	if !ok {
		return fmt.Errorf("internal: no node at %q", strings.Join(parts, "/"))
	}
	p := filepath.Join(append([]string{root}, parts...)...)
	switch n.kind {
	case kindDir:
		if len(parts) > 0 {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
		}
		for _, c := range n.entries() {
			if err := k.writeNode(root, append(parts[:len(parts):len(parts)], c)); err != nil {
				return err
			}
		}
		return nil
	case kindLink:
		return os.Symlink(n.link, p)
	}
	mode := os.FileMode(0o444)
	switch {
	case n.readable && n.writable:
		mode = 0o644
	case n.writable:
		mode = 0o200
	}
	return os.WriteFile(p, n.content, mode)
}
