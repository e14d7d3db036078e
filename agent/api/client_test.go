package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// socketPath returns a path for a unix socket in a temporary directory,
// short enough for sun_path (108 bytes) whatever the test's name.
func socketPath(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api.sock")
	if len(path) < 100 {
		return path
	}
	dir, err := os.MkdirTemp("", "gh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "api.sock")
}

// unixServer serves h on a unix socket and returns a client for it.
func unixServer(t *testing.T, h http.Handler) *api.Client {
	t.Helper()
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	c := api.NewClient(path)
	t.Cleanup(c.Close)
	return c
}

// TestClientRoundTrip runs every client method against the real handler on
// a fake service: each reaches its method with its arguments intact (IDs
// that need escaping included) and decodes the answer.
func TestClientRoundTrip(t *testing.T) {
	svc := &fakeService{}
	c := unixServer(t, api.NewHandler(svc, slog.New(slog.NewTextHandler(io.Discard, nil))))
	ctx := context.Background()
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 2}}, Labels: map[string]string{"k": "v"}}
	const oddID = "a/b c?d#e%f"

	tests := []struct {
		name string
		do   func() (any, error)
		want any
		call call
	}{
		{"Status", func() (any, error) { return c.Status(ctx) }, fakeStatus, call{Method: "Status"}},
		{"Claim", func() (any, error) { return c.Claim(ctx, "vm-1", req) }, fakeClaim("vm-1"), call{Method: "Claim", ID: "vm-1", Req: req}},
		{"Claim with an ID that needs escaping", func() (any, error) { return c.Claim(ctx, oddID, req) }, fakeClaim(oddID), call{Method: "Claim", ID: oddID, Req: req}},
		{"Get", func() (any, error) { return c.Get(ctx, "vm-1") }, fakeClaim("vm-1"), call{Method: "Get", ID: "vm-1"}},
		{"Get with an ID that needs escaping", func() (any, error) { return c.Get(ctx, "../x") }, fakeClaim("../x"), call{Method: "Get", ID: "../x"}},
		{"Claims", func() (any, error) { return c.Claims(ctx) }, fakeClaimList, call{Method: "ListClaims"}},
		{"Release", func() (any, error) { return c.Release(ctx, oddID) }, released(fakeClaim(oddID)), call{Method: "Release", ID: oddID}},
		{"Drain", func() (any, error) { return c.Drain(ctx, "0000:18:00.0", "RMA") },
			func() api.GPU { g := fakeGPU; g.State, g.DrainReason = api.StateDrained, "RMA"; return g }(),
			call{Method: "Drain", ID: "0000:18:00.0", Reason: "RMA"}},
		{"Drain without reason", func() (any, error) { return c.Drain(ctx, "0000:18:00.0", "") },
			func() api.GPU { g := fakeGPU; g.State = api.StateDrained; return g }(),
			call{Method: "Drain", ID: "0000:18:00.0"}},
		{"Undrain", func() (any, error) { return c.Undrain(ctx, "0000:18:00.0") },
			func() api.GPU { g := fakeGPU; g.State = api.StateFree; return g }(),
			call{Method: "Undrain", ID: "0000:18:00.0"}},
		{"Availability", func() (any, error) { return c.Availability(ctx) }, fakeAvail, call{Method: "Availability"}},
		{"Version", func() (any, error) { return c.Version(ctx) }, fakeVersion, call{Method: "Version"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(svc.Calls())
			got, err := tc.do()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if calls := svc.Calls()[before:]; !reflect.DeepEqual(calls, []call{tc.call}) {
				t.Errorf("service calls = %+v, want [%+v]", calls, tc.call)
			}
		})
	}
}

// TestClientWire pins what goes over the socket: method, escaped path,
// content type and body.
func TestClientWire(t *testing.T) {
	type seen struct{ method, path, contentType, body string }
	var (
		mu   sync.Mutex
		last seen
	)
	c := unixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = seen{r.Method, r.URL.EscapedPath(), r.Header.Get("Content-Type"), string(b)}
		mu.Unlock()
		io.WriteString(w, "{}")
	}))
	ctx := context.Background()
	tests := []struct {
		name string
		do   func() error
		want seen
	}{
		{"claim", func() error {
			_, err := c.Claim(ctx, "vm 1/2", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
			return err
		}, seen{"PUT", "/v1/claims/vm%201%2F2", "application/json", `{"gpus":[{"model":"L40S","count":1}]}`}},
		{"get", func() error { _, err := c.Get(ctx, "vm-1"); return err }, seen{"GET", "/v1/claims/vm-1", "", ""}},
		{"release", func() error { _, err := c.Release(ctx, "vm-1"); return err }, seen{"DELETE", "/v1/claims/vm-1", "", ""}},
		{"drain", func() error { _, err := c.Drain(ctx, "0000:18:00.0", "RMA"); return err },
			seen{"PUT", "/v1/gpus/0000:18:00.0/drain", "application/json", `{"reason":"RMA"}`}},
		{"undrain", func() error { _, err := c.Undrain(ctx, "0000:18:00.0"); return err },
			seen{"DELETE", "/v1/gpus/0000:18:00.0/drain", "", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			got := last
			mu.Unlock()
			if got != tc.want {
				t.Errorf("on the wire %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestClientDecodesErrors(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		want    *api.Error // nil: a plain error
		wantMsg []string   // substrings of a plain error
	}{
		{"not available", 409,
			`{"error":{"code":"not_available","message":"The following GPUs are not available: 2x NVIDIA H100 80GB","missing":[{"model":"NVIDIA H100 80GB","count":2}]}}`,
			&api.Error{Status: 409, Code: api.CodeNotAvailable, Message: "The following GPUs are not available: 2x NVIDIA H100 80GB",
				Missing: []api.Item{{Model: "NVIDIA H100 80GB", Count: 2}}}, nil},
		{"unknown model", 400,
			`{"error":{"code":"unknown_model","message":"unknown GPU model \"V100\"","field":"gpus[0].model","known_models":["NVIDIA L40S"]}}`,
			&api.Error{Status: 400, Code: api.CodeUnknownModel, Message: `unknown GPU model "V100"`, Field: "gpus[0].model",
				KnownModels: []string{"NVIDIA L40S"}}, nil},
		{"not found", 404, `{"error":{"code":"not_found","message":"claim \"x\": not found"}}`,
			&api.Error{Status: 404, Code: api.CodeNotFound, Message: `claim "x": not found`}, nil},
		{"status wins over a status in the body", 503, `{"error":{"code":"unavailable","message":"starting","Status":200}}`,
			&api.Error{Status: 503, Code: api.CodeUnavailable, Message: "starting"}, nil},
		{"not JSON", 502, "bad gateway", nil, []string{"502", "bad gateway"}},
		{"JSON without error", 500, `{"error":null}`, nil, []string{"500", `{"error":null}`}},
		{"long HTML page", 500, "<html>" + strings.Repeat("x", 10000) + "</html>", nil, []string{"500", "<html>xxx"}},
		{"2xx that is not JSON", 200, "not json", nil, []string{"decoding the agent's answer"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := unixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			_, err := c.Status(context.Background())
			if err == nil {
				t.Fatal("Status() = nil error")
			}
			var ae *api.Error
			if tc.want != nil {
				if !errors.As(err, &ae) {
					t.Fatalf("error %v (%T), want *api.Error", err, err)
				}
				if !reflect.DeepEqual(ae, tc.want) {
					t.Errorf("error = %+v, want %+v", ae, tc.want)
				}
				if err.Error() != tc.want.Message {
					t.Errorf("Error() = %q, want the message", err.Error())
				}
				return
			}
			if errors.As(err, &ae) {
				t.Errorf("error %v is an *api.Error, want a plain one", err)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long: the body must be truncated", len(err.Error()))
			}
		})
	}
}

func TestClientAgentDown(t *testing.T) {
	// A socket file whose listener is gone answers ECONNREFUSED, as after a
	// crash of the agent.
	stale := socketPath(t)
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	for name, path := range map[string]string{
		"no socket file":    filepath.Join(t.TempDir(), "missing.sock"),
		"stale socket":      stale,
		"missing directory": filepath.Join(t.TempDir(), "no", "such", "dir", "api.sock"),
	} {
		t.Run(name, func(t *testing.T) {
			c := api.NewClient(path)
			defer c.Close()
			_, err := c.Version(context.Background())
			if !errors.Is(err, api.ErrAgentDown) {
				t.Fatalf("Version() = %v, want ErrAgentDown", err)
			}
			for _, w := range []string{path, "GPUHERD_SOCKET", "--socket", "gpuherd agent"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestClientHonoursContext: a cancelled request returns at once with the
// context's error, not as "agent down".
func TestClientHonoursContext(t *testing.T) {
	entered := make(chan struct{})
	c := unixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Status(ctx)
		errc <- err
	}()
	<-entered
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || errors.Is(err, api.ErrAgentDown) {
		t.Fatalf("Status() after cancel = %v, want context.Canceled", err)
	}
}

func TestNotAvailableMessage(t *testing.T) {
	tests := []struct {
		missing []api.Item
		want    string
	}{
		{[]api.Item{{Model: "NVIDIA L40S", Count: 1}}, "The following GPUs are not available: 1x NVIDIA L40S"},
		{[]api.Item{{Model: "NVIDIA H100 80GB", Count: 2}, {Model: "NVIDIA L40S", Count: 4}},
			"The following GPUs are not available: 2x NVIDIA H100 80GB, 4x NVIDIA L40S"},
		{[]api.Item{{Model: "10de:2bb5", Count: 16}}, "The following GPUs are not available: 16x 10de:2bb5"},
	}
	for _, tc := range tests {
		if got := api.NotAvailableMessage(tc.missing); got != tc.want {
			t.Errorf("NotAvailableMessage(%v) = %q, want %q", tc.missing, got, tc.want)
		}
	}
}

// TestErrorWireShape pins the JSON of an error body: Status travels as the
// HTTP status, never in the body.
func TestErrorWireShape(t *testing.T) {
	b, err := json.Marshal(api.ErrorBody{Error: &api.Error{Status: 409, Code: api.CodeConflict, Message: "taken"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"error":{"code":"conflict","message":"taken"}}`; string(b) != want {
		t.Errorf("wire form %s, want %s", b, want)
	}
}
