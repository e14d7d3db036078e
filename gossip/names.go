package gossip

import (
	"encoding/binary"
	"fmt"
)

// NamesInfo is what a server tells the others about its part in the name
// registry (agent/names): where its raft listens, its role, whether it
// leads, and which registry it belongs to. Agents resolve a registry
// server's node name to its raft address through it, and find a registry
// to join before they would found one.
type NamesInfo struct {
	Addr     string // host:port of its raft listener; "" when it runs no raft
	Role     string // NamesVoter, NamesNonVoter, NamesStandby, NamesClient, or "" (none)
	Leader   bool   // it leads the registry now
	Registry string // ID of the registry it belongs to, "" when none
}

// Registry roles as NamesInfo.Role names them.
const (
	NamesClient   = "client"
	NamesStandby  = "standby"
	NamesNonVoter = "non-voter"
	NamesVoter    = "voter"
)

const (
	fieldNamesAddr     byte = 8  // string
	fieldNamesRole     byte = 9  // uvarint: role code | namesLeaderBit
	fieldNamesRegistry byte = 10 // string

	namesLeaderBit uint64 = 1 << 4
	maxRegistryLen        = 96
)

var namesRoles = []string{"", NamesClient, NamesStandby, NamesNonVoter, NamesVoter}

func (n NamesInfo) validate() error {
	if len(n.Addr) > maxPeerAddrLen {
		return fmt.Errorf("gossip: names address %q is longer than %d bytes", n.Addr, maxPeerAddrLen)
	}
	if len(n.Registry) > maxRegistryLen {
		return fmt.Errorf("gossip: registry ID %q is longer than %d bytes", n.Registry, maxRegistryLen)
	}
	if n.roleCode() < 0 {
		return fmt.Errorf("gossip: unknown name registry role %q", n.Role)
	}
	return nil
}

func (n NamesInfo) roleCode() int {
	for i, r := range namesRoles {
		if r == n.Role {
			return i
		}
	}
	return -1
}

func (n NamesInfo) append(b []byte) []byte {
	if n.Addr != "" {
		b = appendTLV(b, fieldNamesAddr, []byte(n.Addr))
	}
	if c := uint64(n.roleCode()); c != 0 || n.Leader {
		if n.Leader {
			c |= namesLeaderBit
		}
		b = appendTLV(b, fieldNamesRole, binary.AppendUvarint(nil, c))
	}
	if n.Registry != "" {
		b = appendTLV(b, fieldNamesRegistry, []byte(n.Registry))
	}
	return b
}

// decodeNamesField reads one of the names fields; false when typ is not one.
func (s *Summary) decodeNamesField(typ byte, v []byte) (bool, error) {
	switch typ {
	case fieldNamesAddr:
		s.Names.Addr = string(v)
	case fieldNamesRole:
		c, err := fullUvarint(v)
		if err != nil {
			return true, fmt.Errorf("gossip: names role: %w", err)
		}
		// A role code this agent does not know is a newer agent's: none.
		if i := c &^ namesLeaderBit; i < uint64(len(namesRoles)) {
			s.Names.Role = namesRoles[i]
		}
		s.Names.Leader = c&namesLeaderBit != 0
	case fieldNamesRegistry:
		s.Names.Registry = string(v)
	default:
		return false, nil
	}
	return true, nil
}
