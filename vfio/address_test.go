package vfio_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
)

var hostileAddresses = []struct {
	name string
	addr string
}{
	{"empty", ""},
	{"parent directory", "../"},
	{"traversal after a valid address", "0000:3b:00.0/../../x"},
	{"traversal to the drivers", "../drivers/nvidia"},
	{"absolute path", "/etc/passwd"},
	{"upper case", "0000:3B:00.0"},
	{"no domain", "3b:00.0"},
	{"NVML form", "00000000:3b:00.0"},
	{"function 8", "0000:3b:00.8"},
	{"wrong separators", "0000-3b-00-0"},
	{"trailing newline", "0000:3b:00.0\n"},
	{"leading space", " 0000:3b:00.0"},
	{"NUL byte inside", "0000:3b:00.0\x00"},
	{"NUL byte in place of a digit", "0000:3b:0\x00.0"},
	{"glob", "0000:3b:00.*"},
	{"too long", strings.Repeat("0000:3b:00.0", 100000)},
	{"non-ASCII digit", "0000:3b:00.٠"},
}

func TestValidateAddress(t *testing.T) {
	for _, a := range []string{"0000:3b:00.0", "0000:00:00.7", "ffff:ff:1f.0", "0001:c1:00.1"} {
		if err := vfio.ValidateAddress(a); err != nil {
			t.Errorf("ValidateAddress(%q) = %v, want nil", a, err)
		}
	}
	for _, tt := range hostileAddresses {
		t.Run(tt.name, func(t *testing.T) {
			err := vfio.ValidateAddress(tt.addr)
			var ae *vfio.AddressError
			if !errors.Is(err, vfio.ErrInvalidAddress) || !errors.As(err, &ae) || ae.Value != tt.addr {
				t.Fatalf("ValidateAddress = %v, want an *AddressError for the value", err)
			}
			msg := err.Error()
			if len(msg) > 400 || strings.ContainsRune(msg, 0) || strings.Contains(msg, "\n") {
				t.Errorf("error message is unsafe to log (%d bytes): %q", len(msg), msg)
			}
		})
	}
}

// Every entry point that takes an address checks it before touching the
// FS, so a hostile address never becomes a path, not even for a read.
func TestHostileAddressesTouchNothing(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"))
	spy := &spyFS{FS: k}
	p := vfio.New(spy)
	b := vfio.NewBinder(p)
	for _, tt := range hostileAddresses {
		t.Run(tt.name, func(t *testing.T) {
			calls := map[string]error{}
			_, calls["Device"] = p.Device(tt.addr)
			calls["Health"] = p.Health(tt.addr)
			_, calls["Bind"] = b.Bind(testCtx(t), tt.addr)
			for _, pol := range []vfio.IdlePolicy{vfio.IdleVFIO, vfio.IdleNVIDIA, vfio.IdleNone} {
				_, calls["Release "+string(pol)] = b.Release(testCtx(t), tt.addr, pol)
			}
			for name, err := range calls {
				if !errors.Is(err, vfio.ErrInvalidAddress) {
					t.Errorf("%s: error %v, want ErrInvalidAddress", name, err)
				}
			}
		})
	}
	if c := spy.Calls(); len(c) != 0 {
		t.Errorf("FS calls made for hostile addresses: %q", c)
	}
}

func TestAddressFromNVMLBusID(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"00000000:3B:00.0", "0000:3b:00.0"},
		{"00000001:C1:00.1", "0001:c1:00.1"},
		{"0000:3B:00.0", "0000:3b:00.0"},                 // NVML's legacy 4-digit form
		{"00000000:3B:00.0\x00\x00\x00", "0000:3b:00.0"}, // C string padding
		{"", ""},
		{"00010000:3B:00.0", ""}, // domain above 0xffff
		{"0000000:3B:00.0", ""},
		{"00000000:3B:00.8", ""},
		{"00000000:3B:00.0/../x", ""},
		{"GPU-6ea2d3c7-3dd7-4b87-8b07-1b4e9d7e4a0c", ""},
		{"00000000:3b:00.0\x00x", ""},
	}
	for _, tt := range tests {
		got, err := vfio.AddressFromNVMLBusID(tt.in)
		if got != tt.want || (tt.want == "") != errors.Is(err, vfio.ErrInvalidAddress) {
			t.Errorf("AddressFromNVMLBusID(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}
