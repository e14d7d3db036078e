package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

var fakeGroup = api.Group{
	GroupRecord: api.GroupRecord{Name: "pool", Nodes: 2, WithGPUs: true, Coordinator: "fake"},
	GPUs:        []api.Item{{Model: "NVIDIA H100 80GB", Count: 1}},
	Claims:      []api.Claim{fakeClaim("pool.node-0")},
	Missing:     []string{"pool.node-1"},
}

func (f *fakeService) RepairGroup(_ context.Context, name string) (api.Group, error) {
	return fakeGroup, f.record(call{Method: "RepairGroup", ID: name})
}

// POST /v1/groups/{name}/repair reaches RepairGroup; a group's missing
// node claims travel as "missing", and a group from the registry has no
// created_at.
func TestHandlerRepairsGroups(t *testing.T) {
	svc := &fakeService{}
	rec, _ := serve(t, svc, request{method: "POST", target: "/v1/groups/pool/repair"})
	if rec.Code != http.StatusOK {
		t.Fatalf("repair = %d %s", rec.Code, rec.Body)
	}
	if got := svc.Calls(); !reflect.DeepEqual(got, []call{{Method: "RepairGroup", ID: "pool"}}) {
		t.Fatalf("calls %+v", got)
	}
	var raw map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["created_at"]; ok {
		t.Errorf("created_at present without a time: %s", rec.Body)
	}
	var g api.Group
	if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil || !reflect.DeepEqual(g, fakeGroup) {
		t.Fatalf("body decodes to %+v (%v), want %+v", g, err, fakeGroup)
	}
}
