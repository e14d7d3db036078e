package registry

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/gossip"
)

// oneMember is a gossip view holding one other member, in state.
type oneMember struct {
	node, state string
	forgot      []string
}

func (c *oneMember) State(node string) string {
	if node == c.node {
		return c.state
	}
	return ""
}

func (c *oneMember) Forget(node string)      { c.forgot = append(c.forgot, "gossip:"+node) }
func (c *oneMember) ForgetKnown(node string) { c.forgot = append(c.forgot, "known:"+node) }

// noNames holds no names on anyone.
type noNames struct{ removed []string }

func (n *noNames) RemoveMember(_ context.Context, node string) ([]names.Key, error) {
	n.removed = append(n.removed, node)
	return nil, nil
}

func (n *noNames) List(context.Context, names.Filter, names.ReadMode) (names.Listing, error) {
	return names.Listing{}, nil
}

func service(c Cluster, n Authority) *Service {
	return NewService(ServiceDeps{Node: "gpu-a",
		Names:    func() Authority { return n },
		Registry: func() *Registry { return nil },
		Cluster:  func() Cluster { return c },
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func TestRemoveMemberRefuses(t *testing.T) {
	alive := &oneMember{node: "gpu-b", state: gossip.StateAlive}
	for _, tt := range []struct {
		name    string
		s       *Service
		node    string
		code    string
		message string
	}{
		{"not a server name", service(alive, &noNames{}), "gpu b", api.CodeInvalid, "not a server name"},
		{"this server", service(alive, &noNames{}), "gpu-a", api.CodeInvalid, "is this server"},
		{"alone", service(nil, &noNames{}), "gpu-b", api.CodeInvalid, "runs alone"},
		{"no registry", service(alive, nil), "gpu-b", api.CodeInvalid, "without the name registry"},
		{"alive", service(alive, &noNames{}), "gpu-b", api.CodeConflict, "--force"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.s.RemoveMember(context.Background(), tt.node, false)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != tt.code || !strings.Contains(ae.Message, tt.message) {
				t.Fatalf("RemoveMember(%s) = %v; want %s saying %q", tt.node, err, tt.code, tt.message)
			}
		})
	}
}

func TestRemoveMemberForgetsADeadServer(t *testing.T) {
	dead, n := &oneMember{node: "gpu-b", state: gossip.StateDead}, &noNames{}
	out, err := service(dead, n).RemoveMember(context.Background(), "gpu-b", false)
	if err != nil || out.Node != "gpu-b" || out.State != gossip.StateDead || out.RegistryServer {
		t.Fatalf("RemoveMember = %+v, %v", out, err)
	}
	if len(n.removed) != 1 || strings.Join(dead.forgot, " ") != "gossip:gpu-b known:gpu-b" {
		t.Fatalf("registry removals %v, forgotten %v; want one removal, then forgotten by gossip and the known list", n.removed, dead.forgot)
	}
}

func TestServeNamesWithoutARegistry(t *testing.T) {
	s := service(nil, nil)
	if _, err := s.ServeNames(context.Background(), json.RawMessage(`{"op":"ping","extra":1}`)); err == nil {
		t.Fatal("a request with an unknown field was served")
	}
	resp, err := s.ServeNames(context.Background(), json.RawMessage(`{}`))
	r, ok := resp.(names.Response)
	if err != nil || !ok || r.Error == nil || r.Error.Code != names.WireNotLeader {
		t.Fatalf("ServeNames = %+v, %v; want not leader", resp, err)
	}
}

func TestAdvertisedAddr(t *testing.T) {
	for _, tt := range []struct{ ln, peer, want string }{
		{"10.0.0.5:7950", "10.0.0.9:7947", "10.0.0.5:7950"},
		{"0.0.0.0:7950", "10.0.0.9:7947", "10.0.0.9:7950"},
		{"[::]:7950", "10.0.0.9:7947", "10.0.0.9:7950"},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tt.ln)
		if err != nil {
			t.Fatal(err)
		}
		if got := advertisedAddr(addr, tt.peer); got != tt.want {
			t.Errorf("advertisedAddr(%s, %s) = %s; want %s", tt.ln, tt.peer, got, tt.want)
		}
	}
}
