package host

import (
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
)

// An adopted VM's claim is named by its domain, or by its PID without one;
// bytes a claim ID may not hold become '-'.
func TestAdoptedID(t *testing.T) {
	if id := adoptedID("gpu-7", vfio.Opener{PID: 99}); id != "adopted-gpu-7-pid99" {
		t.Errorf("adoptedID without a domain = %q", id)
	}
	if id := adoptedID("gpu-7", vfio.Opener{PID: 99, Domain: "vm b/ü"}); id != "adopted-gpu-7-vm-b---" {
		t.Errorf("adoptedID of an odd domain = %q", id)
	}
}
