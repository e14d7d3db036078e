package names

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
)

// MemNetwork is an in-memory Forwarder for tests: it hands a Request to
// the named Registry's Serve, through a JSON round trip as the wire would,
// and can cut links between agents.
type MemNetwork struct {
	mu   sync.Mutex
	regs map[string]*Registry
	cut  map[[2]string]bool
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{regs: map[string]*Registry{}, cut: map[[2]string]bool{}}
}

// Attach makes reg reachable under its node name; nil detaches the node
// (a dead agent).
func (n *MemNetwork) Attach(node string, reg *Registry) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if reg == nil {
		delete(n.regs, node)
		return
	}
	n.regs[node] = reg
}

// Cut stops requests between a and b, both ways.
func (n *MemNetwork) Cut(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]string{a, b}], n.cut[[2]string{b, a}] = true, true
}

// Heal restores every link.
func (n *MemNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// From is the Forwarder of agent from.
func (n *MemNetwork) From(from string) Forwarder { return memForwarder{n, from} }

type memForwarder struct {
	n    *MemNetwork
	from string
}

func (f memForwarder) Forward(ctx context.Context, server string, req Request) (Response, error) {
	f.n.mu.Lock()
	reg, ok := f.n.regs[server]
	cut := f.n.cut[[2]string{f.from, server}]
	f.n.mu.Unlock()
	if !ok || cut {
		return Response{}, fmt.Errorf("%s does not answer: %w", server, ErrNotDelivered)
	}
	var wire Request
	if err := roundTrip(req, &wire); err != nil {
		return Response{}, err
	}
	resp := reg.Serve(ctx, wire)
	var out Response
	if err := roundTrip(resp, &out); err != nil {
		return Response{}, err
	}
	// The answer may be lost on the way back, too.
	f.n.mu.Lock()
	cut = f.n.cut[[2]string{server, f.from}]
	f.n.mu.Unlock()
	if cut {
		return Response{}, fmt.Errorf("%s does not answer", server)
	}
	return out, nil
}

func roundTrip(in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}
