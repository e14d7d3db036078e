package inventory

import "fmt"

// PCIID is a PCI vendor or device ID. In JSON it is the four lower-case hex
// digits people read in lspci and in gpuherd's model names ("10de",
// "26b9"), never a decimal number (no String method: %04x must keep
// formatting the number).
type PCIID uint16

// MarshalJSON writes the ID as a hex string.
func (id PCIID) MarshalJSON() ([]byte, error) { return fmt.Appendf(nil, `"%04x"`, uint16(id)), nil }
