package names

import (
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

func TestOpenRefusesBadConfig(t *testing.T) {
	three := []Server{{"node-a", "a:1"}, {"node-b", "b:1"}, {"node-c", "c:1"}}
	_, trans := raft.NewInmemTransport("")
	fwd := NewMemNetwork().From("node-a")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no node", Config{Servers: three, Forwarder: fwd}, "node name is empty"},
		{"no servers", Config{Node: "node-x", Forwarder: fwd}, "no registry voters"},
		{"even", Config{Node: "node-x", Servers: three[:2], Forwarder: fwd}, "odd number"},
		{"twice", Config{Node: "node-x", Servers: []Server{three[0], three[0], three[1]}, Forwarder: fwd}, "listed twice"},
		{"no address", Config{Node: "node-x", Servers: []Server{{"node-a", ""}}, Forwarder: fwd}, "no address"},
		{"bad server", Config{Node: "node-x", Servers: []Server{{"Node A", "a:1"}}, Forwarder: fwd}, "names server"},
		{"voter without transport", Config{Node: "node-a", Role: RoleVoter, Servers: three, Forwarder: fwd}, "raft transport"},
		{"voter not configured", Config{Node: "node-x", Role: RoleVoter, Servers: three, Transport: trans, Forwarder: fwd}, "not among the configured servers"},
		{"client without forwarder", Config{Node: "node-x", Servers: three}, "no forwarder"},
	} {
		_, err := Open(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}
