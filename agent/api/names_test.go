package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
)

// fakeNameOwner is an owner whose agent serves the name registry: it
// records what reaches the registry.
type fakeNameOwner struct {
	api.Owner
	mu   sync.Mutex
	reqs []names.Request
}

func (f *fakeNameOwner) ServeNames(_ context.Context, body json.RawMessage) (any, error) {
	var req names.Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return names.Response{Result: &names.Result{Code: names.CodeOK}}, nil
}

func (f *fakeNameOwner) last() (names.Request, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		return names.Request{}, 0
	}
	return f.reqs[len(f.reqs)-1], len(f.reqs)
}

// postNames sends req to the route as caller ("" for a call the transport
// attached no identity to) and returns the status and the log.
func postNames(t *testing.T, o *fakeNameOwner, caller string, req names.Request) (int, string) {
	t.Helper()
	body, _ := json.Marshal(req)
	return postNamesBody(t, o, caller, body)
}

func postNamesBody(t *testing.T, o *fakeNameOwner, caller string, body []byte) (int, string) {
	t.Helper()
	var logBuf bytes.Buffer
	h := api.NewPeerHandler(&fakeService{}, o, slog.New(slog.NewTextHandler(&logBuf, nil)))
	r := httptest.NewRequest(http.MethodPost, "/v1/peer/names", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if caller != "" {
		r = r.WithContext(api.WithCaller(r.Context(), caller))
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	resp, _ := io.ReadAll(w.Result().Body)
	if w.Code == http.StatusOK {
		var out names.Response
		if err := json.Unmarshal(resp, &out); err != nil || out.Result == nil {
			t.Fatalf("answer %s: %v", resp, err)
		}
	}
	return w.Code, logBuf.String()
}

// TestNamesRouteActsAsTheCaller: whatever node names the body carries, an
// acquire is placed by, a confirm commits on, and a release frees as the
// node whose certificate made the call (issue 11, point 7).
func TestNamesRouteActsAsTheCaller(t *testing.T) {
	key := names.Claim("vm-1")
	for _, tc := range []struct {
		name string
		req  names.Request
		want func(names.Request) bool
	}{
		{"acquire as another caller", names.Request{Op: names.OpAcquire, Key: key, Caller: "gpu-victim", Owner: "gpu-b", Request: "d1"},
			func(r names.Request) bool { return r.Caller == "gpu-mallory" && r.Owner == "gpu-b" }},
		{"acquire with no caller", names.Request{Op: names.OpAcquire, Key: key, Request: "d1"},
			func(r names.Request) bool { return r.Caller == "gpu-mallory" }},
		// The registry refuses a confirm whose caller is not its owner,
		// unless the caller coordinates that name's move (fsm tests).
		{"confirm on another owner", names.Request{Op: names.OpConfirm, Key: key, Token: 7, Owner: "gpu-victim", Caller: "gpu-victim"},
			func(r names.Request) bool {
				return r.Caller == "gpu-mallory" && r.Owner == "gpu-victim" && r.Token == 7
			}},
		{"confirm with no owner", names.Request{Op: names.OpConfirm, Key: key, Token: 7},
			func(r names.Request) bool { return r.Caller == "gpu-mallory" && r.Owner == "gpu-mallory" }},
		{"release as another holder", names.Request{Op: names.OpRelease, Key: key, Token: 7, Node: "gpu-victim"},
			func(r names.Request) bool { return r.Node == "gpu-mallory" }},
		{"release by token alone", names.Request{Op: names.OpRelease, Key: key, Token: 7},
			func(r names.Request) bool { return r.Node == "gpu-mallory" && r.Token == 7 }},
		{"lookup untouched", names.Request{Op: names.OpLookup, Key: key},
			func(r names.Request) bool { return r.Caller == "" && r.Owner == "" && r.Node == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &fakeNameOwner{}
			if code, _ := postNames(t, o, "gpu-mallory", tc.req); code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			got, n := o.last()
			if n != 1 || !tc.want(got) {
				t.Errorf("the registry got %+v (%d calls)", got, n)
			}
		})
	}
}

// TestNamesRouteRefusesOtherSpellings: a field named in another case
// (which Go's JSON decoding would match) cannot carry another node past
// the one the route sets.
func TestNamesRouteRefusesOtherSpellings(t *testing.T) {
	o := &fakeNameOwner{}
	for _, body := range []string{
		`{"op":"acquire","key":{"kind":"claim","name":"vm-1"},"request":"d","Caller":"gpu-victim"}`,
		`{"op":"release","key":{"kind":"claim","name":"vm-1"},"NODE":"gpu-victim"}`,
		`{"OP":"lookup","op":"acquire","key":{"kind":"claim","name":"vm-1"},"request":"d"}`,
	} {
		if code, _ := postNamesBody(t, o, "gpu-mallory", []byte(body)); code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", body, code)
		}
	}
	if _, n := o.last(); n != 0 {
		t.Errorf("the registry was called %d times", n)
	}
}

// TestNamesRouteRefusesCallsWithoutIdentity: a call the transport attached
// no verified node to never reaches the registry.
func TestNamesRouteRefusesCallsWithoutIdentity(t *testing.T) {
	o := &fakeNameOwner{}
	code, _ := postNames(t, o, "", names.Request{Op: names.OpAcquire, Key: names.Claim("vm-1"), Caller: "gpu-a", Request: "d"})
	if code != http.StatusForbidden {
		t.Errorf("status %d, want 403", code)
	}
	if _, n := o.last(); n != 0 {
		t.Errorf("the registry was called %d times", n)
	}
}

// TestNamesRouteAuditsOperatorOps: operations an operator asks for
// (members remove, voter changes) are carried, with a warning that names
// the agent that relayed them.
func TestNamesRouteAuditsOperatorOps(t *testing.T) {
	o := &fakeNameOwner{}
	code, log := postNames(t, o, "gpu-c", names.Request{Op: names.OpRemoveMember, Node: "gpu-gone"})
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if got, _ := o.last(); got.Node != "gpu-gone" {
		t.Errorf("remove_member reached the registry as %+v", got)
	}
	if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "caller=gpu-c") || !strings.Contains(log, "op=remove_member") {
		t.Errorf("no audit line naming the relaying agent: %q", log)
	}
	if _, log := postNames(t, o, "gpu-c", names.Request{Op: names.OpLookup, Key: names.Claim("x")}); strings.Contains(log, "WARN") {
		t.Errorf("a lookup was audited: %q", log)
	}
}
