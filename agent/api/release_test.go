package api_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// A release's optional body: {"force": true} reaches the service as a
// forced release; a bad body is a 400 naming the field; no body is a plain
// release.
func TestReleaseForce(t *testing.T) {
	var forced []bool
	svc := &releaseSpy{forced: &forced}
	for _, tc := range []struct {
		body   string
		status int
	}{{"", 200}, {`{"force":true}`, 200}, {`{"force":false}`, 200}, {`{"force":"yes"}`, 400}, {`{"forse":true}`, 400}} {
		r := httptest.NewRequest(http.MethodDelete, "/v1/claims/vm-1", strings.NewReader(tc.body))
		if tc.body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		api.NewHandler(svc, slog.New(slog.DiscardHandler)).ServeHTTP(rec, r)
		if rec.Code != tc.status {
			t.Errorf("DELETE with %q: %d %s, want %d", tc.body, rec.Code, rec.Body, tc.status)
		}
	}
	if want := []bool{false, true, false}; !reflect.DeepEqual(forced, want) {
		t.Errorf("forced = %v, want %v", forced, want)
	}
}

type releaseSpy struct {
	api.Service
	forced *[]bool
}

func (s *releaseSpy) Release(ctx context.Context, id string) (api.Claim, error) {
	*s.forced = append(*s.forced, api.Forced(ctx))
	return api.Claim{ID: id}, nil
}
