package api_test

import (
	"context"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
)

// call is one method call the fake service received.
type call struct {
	Method string
	ID     string // claim ID or PCI address
	Reason string
	Req    api.ClaimRequest
}

// fakeService records every call and answers with canned values, or with
// err when it is set. The embedded interface is nil: a method the tests do
// not exercise panics, and the fake keeps compiling as Service grows.
type fakeService struct {
	api.Service
	mu    sync.Mutex
	calls []call
	err   error
}

func (f *fakeService) record(c call) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	return f.err
}

// Calls returns what the service was asked, in order.
func (f *fakeService) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

var (
	fakeGPU = api.GPU{
		PCIAddress: "0000:18:00.0", Model: "NVIDIA H100 80GB", MemoryBytes: 80 << 30,
		NUMANode: 0, IOMMUGroup: 20, Driver: "vfio-pci", State: api.StateClaimed, Claim: "vm-1",
	}
	fakeStatus = api.Status{Node: "fake", Version: "v-test", GPUs: []api.GPU{fakeGPU}}
	fakeAvail  = api.Availability{Node: "fake", Models: []api.ModelAvailability{
		{Model: "NVIDIA H100 80GB", Available: true, Free: 7, Total: 8, Healthy: 8},
		{Model: "NVIDIA L40S"},
	}}
	fakeVersion = api.VersionInfo{Version: "v-test", Commit: "abc", Go: "go-test"}
)

func fakeClaim(id string) api.Claim {
	return api.Claim{
		ID: id, Node: "fake", State: api.StateClaimed,
		Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 1}},
		GPUs:  []api.ClaimGPU{{PCIAddress: "0000:18:00.0", Model: "NVIDIA H100 80GB", IOMMUGroup: 20, VFIODevice: "/dev/vfio/20"}},
	}
}

func (f *fakeService) Status(context.Context) (api.Status, error) {
	return fakeStatus, f.record(call{Method: "Status"})
}

func (f *fakeService) Claim(_ context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	return fakeClaim(id), f.record(call{Method: "Claim", ID: id, Req: req})
}

func (f *fakeService) Get(_ context.Context, id string) (api.Claim, error) {
	return fakeClaim(id), f.record(call{Method: "Get", ID: id})
}

func (f *fakeService) ListClaims(context.Context) (api.ClaimList, error) {
	return fakeClaimList, f.record(call{Method: "ListClaims"})
}

func (f *fakeService) Release(_ context.Context, id string) (api.Claim, error) {
	return fakeClaim(id), f.record(call{Method: "Release", ID: id})
}

func (f *fakeService) Drain(_ context.Context, addr, reason string) (api.GPU, error) {
	g := fakeGPU
	g.PCIAddress, g.State, g.DrainReason = addr, api.StateDrained, reason
	return g, f.record(call{Method: "Drain", ID: addr, Reason: reason})
}

func (f *fakeService) Undrain(_ context.Context, addr string) (api.GPU, error) {
	g := fakeGPU
	g.PCIAddress, g.State = addr, api.StateFree
	return g, f.record(call{Method: "Undrain", ID: addr})
}

func (f *fakeService) Availability(context.Context) (api.Availability, error) {
	return fakeAvail, f.record(call{Method: "Availability"})
}

func (f *fakeService) Version() api.VersionInfo {
	_ = f.record(call{Method: "Version"})
	return fakeVersion
}

// fakeClaimList is a partial list: one server did not answer.
var fakeClaimList = api.ClaimList{
	Claims:     []api.Claim{fakeClaim("vm-1"), fakeClaim("vm-2")},
	Partial:    true,
	Unanswered: []api.Unanswered{{Node: "gpu-9", Reason: "agent not reachable"}},
}
