package vfio

import (
	"testing"
)

func TestAllowList(t *testing.T) {
	l, err := ParseAllowList([]string{"10de:*", "1b36:0005", " 8086:10FB "})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.String(); got != "10de:*,1b36:0005,8086:10fb" {
		t.Errorf("String() = %q", got)
	}
	tests := []struct {
		vendor, device uint16
		want           bool
	}{
		{0x10de, 0x2330, true},  // any NVIDIA device
		{0x10de, 0x1af1, true},  // NVSwitch too
		{0x1b36, 0x0005, true},  // exactly this QEMU device
		{0x1b36, 0x0001, false}, // not its siblings
		{0x8086, 0x10fb, true},
		{0x8086, 0x10fc, false},
		{0x1002, 0x740f, false},
	}
	for _, tt := range tests {
		if got := l.Allows(tt.vendor, tt.device); got != tt.want {
			t.Errorf("Allows(%04x:%04x) = %v, want %v", tt.vendor, tt.device, got, tt.want)
		}
	}
	if DefaultAllowList().Allows(0x1b36, 0x0005) || !DefaultAllowList().Allows(0x10de, 0x26b9) {
		t.Error("the default allow list must be NVIDIA and nothing else")
	}
	if (AllowList{}).Allows(0x10de, 0x26b9) {
		t.Error("an empty allow list allowed something")
	}
}

func TestParseAllowEntryRejects(t *testing.T) {
	for _, s := range []string{"", "10de", "*:*", "*:0005", "10de:", "10de:**", "10de:00050", "10d:*", "10de:zzzz", "10de:*:*", "0x10de:*", "10de:+005"} {
		if e, err := ParseAllowEntry(s); err == nil {
			t.Errorf("ParseAllowEntry(%q) = %v, want an error", s, e)
		}
	}
	var e AllowEntry
	if err := e.UnmarshalText([]byte("1b36:0005")); err != nil || e != (AllowEntry{Vendor: 0x1b36, Device: 0x0005}) {
		t.Errorf("UnmarshalText = %+v, %v", e, err)
	}
}
