package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// watchService is a Service whose change feed the test moves.
type watchService struct {
	*fakeService
	gen    uint64
	waited []uint64
}

func (w *watchService) Generation() uint64 { return w.gen }
func (w *watchService) WaitChange(_ context.Context, after uint64) uint64 {
	w.waited = append(w.waited, after)
	return w.gen
}
func (w *watchService) Status(context.Context) (api.Status, error) {
	return api.Status{Node: "n", Generation: w.gen}, nil
}

func TestStatusWatchParameters(t *testing.T) {
	for _, tc := range []struct {
		target string
		field  string
	}{
		{"/v1/status?after=x", "after"},
		{"/v1/status?after=-1", "after"},
		{"/v1/status?after=1&wait=forever", "wait"},
		{"/v1/status?after=1&wait=10m", "wait"},
		{"/v1/status?after=1&wait=0s", "wait"},
		{"/v1/status?wait=1s", "wait"},
	} {
		w := &watchService{fakeService: &fakeService{}, gen: 5}
		rec, _ := serve(t, w, request{method: http.MethodGet, target: tc.target})
		e := errorOf(t, rec)
		if e.Status != http.StatusBadRequest || e.Code != api.CodeInvalid || e.Field != tc.field {
			t.Errorf("%s: %d %s field %q (%s), want 400 on %s", tc.target, e.Status, e.Code, e.Field, e.Message, tc.field)
		}
		if len(w.waited) != 0 {
			t.Errorf("%s: waited for %v on a bad request", tc.target, w.waited)
		}
	}
	w := &watchService{fakeService: &fakeService{}, gen: 7}
	rec, _ := serve(t, w, request{method: http.MethodGet, target: "/v1/status?after=3&wait=2s"})
	if rec.Code != http.StatusOK || len(w.waited) != 1 || w.waited[0] != 3 {
		t.Fatalf("watch: %d, waited %v; want 200 after waiting past 3", rec.Code, w.waited)
	}
	// A plain status does not wait.
	rec, _ = serve(t, w, request{method: http.MethodGet, target: "/v1/status"})
	if rec.Code != http.StatusOK || len(w.waited) != 1 {
		t.Fatalf("plain status: %d, waited %v", rec.Code, w.waited)
	}
}
