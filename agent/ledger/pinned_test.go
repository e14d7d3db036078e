package ledger

import (
	"errors"
	"slices"
	"testing"
)

// A pinned request takes exactly the GPUs it names, or nothing, and a
// retry naming other GPUs under the same ID is a conflict, not a second
// placement: a Kubernetes claim prepared twice with other devices.
func TestReservePinnedDevices(t *testing.T) {
	l := newLedger(t)
	pinned := Request{Items: []Item{{Model: h100, Count: 2}}, Devices: []string{"0000:9a:00.0", "0000:db:00.0"}}
	c := mustReserve(t, l, "k8s.a", pinned, t0)
	if !slices.Equal(c.GPUs, pinned.Devices) {
		t.Fatalf("pinned reserve took %v, want %v", c.GPUs, pinned.Devices)
	}
	if again := mustReserve(t, l, "k8s.a", pinned, t0); !slices.Equal(again.GPUs, c.GPUs) {
		t.Fatalf("retry took %v, want %v", again.GPUs, c.GPUs)
	}
	other := Request{Items: []Item{{Model: h100, Count: 2}}, Devices: []string{"0000:18:00.0", "0000:db:00.0"}}
	if _, err := l.Reserve("k8s.a", other, "coord-1", t0, lease); !errors.Is(err, ErrConflict) {
		t.Fatalf("same ID, other devices: %v, want a conflict", err)
	}

	// A GPU held by another claim is not available to a pinned request,
	// even when other GPUs of its model are free.
	_, err := l.Reserve("k8s.b", Request{Items: []Item{{Model: h100, Count: 1}}, Devices: []string{"0000:9a:00.0"}}, "coord-1", t0, lease)
	var na *NotAvailableError
	if !errors.As(err, &na) || len(na.Missing) != 1 || na.Missing[0] != (Item{Model: h100, Count: 1}) {
		t.Fatalf("pinned to a held GPU: %v, want not available 1x %s", err, h100)
	}
	// A GPU of another model than the item asks for is not taken.
	_, err = l.Reserve("k8s.c", Request{Items: []Item{{Model: h100, Count: 1}}, Devices: []string{"0000:61:00.0"}}, "coord-1", t0, lease)
	if !errors.As(err, &na) {
		t.Fatalf("pinned to an L40S for an H100: %v, want not available", err)
	}
	// A drained GPU is not free either.
	if err := l.Drain("0000:18:00.0", "maintenance", t0); err != nil {
		t.Fatal(err)
	}
	_, err = l.Reserve("k8s.d", Request{Items: []Item{{Model: h100, Count: 1}}, Devices: []string{"0000:18:00.0"}}, "coord-1", t0, lease)
	if !errors.As(err, &na) {
		t.Fatalf("pinned to a drained GPU: %v, want not available", err)
	}
}

func TestValidatePinnedDevices(t *testing.T) {
	for _, tc := range []struct {
		name    string
		devices []string
		field   string
	}{
		{"fewer than asked", []string{"0000:18:00.0"}, "devices"},
		{"not an address", []string{"0000:18:00.0", "../../x"}, "devices[1]"},
		{"unsorted", []string{"0000:2a:00.0", "0000:18:00.0"}, "devices[1]"},
		{"twice", []string{"0000:18:00.0", "0000:18:00.0"}, "devices[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRequest(Request{Items: []Item{{Model: h100, Count: 2}}, Devices: tc.devices}, 0)
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Fatalf("ValidateRequest(%v) = %v, want an error on %s", tc.devices, err, tc.field)
			}
		})
	}
}
