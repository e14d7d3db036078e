package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/sim"
)

// serveAgent runs a real agent on the simulated DGX H100 with its API on a
// unix socket, and stops it when the test ends.
func serveAgent(t *testing.T) (*Agent, *sim.Machine, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, cfg, m, nil)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
		a.Close()
	})
	return a, m, cfg.Socket
}

// rawRequest writes req as bytes on a fresh connection to the socket and
// reads one response.
func rawRequest(t *testing.T, socket string, req []byte) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// The server may answer (413, 431) before it has read everything.
	go func() { _, _ = c.Write(req) }()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, body
}

func httpReq(method, path, contentType, body string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: gpuherd\r\nConnection: close\r\n", method, path)
	if contentType != "" {
		fmt.Fprintf(&b, "Content-Type: %s\r\n", contentType)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return []byte(b.String())
}

// TestHostileRequests sends the real agent requests crafted to break it,
// as raw bytes on its socket. Each gets a 4xx that says what is wrong, in
// bounded size; none changes the ledger or writes to sysfs.
func TestHostileRequests(t *testing.T) {
	a, m, socket := serveAgent(t)
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-0", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	rev, claims, writes := a.ledger.Revision(), a.ledger.List(), len(m.Kernel.Writes())

	const J = "application/json"
	claim := func(body string) []byte { return httpReq("PUT", "/v1/claims/vm-1", J, body) }
	labels := func(n, klen, vlen int) string {
		var parts []string
		for i := range n {
			k := fmt.Sprintf("k%0*d", max(klen-1, 1), i)
			parts = append(parts, fmt.Sprintf("%q:%q", k, strings.Repeat("v", vlen)))
		}
		return `{"gpus":[{"model":"H100 80GB","count":1}],"labels":{` + strings.Join(parts, ",") + `}}`
	}
	many := `{"gpus":[` + strings.TrimSuffix(strings.Repeat(`{"model":"H100 80GB","count":1},`, 1000), ",") + `]}`
	cases := []struct {
		name   string
		req    []byte
		status int
		want   string // in the answer's body
	}{
		{"oversized body", claim(`{"gpus":[],"labels":{"k":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}}`), 413, "larger than"},
		{"deep JSON", claim(strings.Repeat("[", 100000)), 413, "larger than"},
		{"deep JSON within the size limit", claim(strings.Repeat("[", 60000)), 400, "malformed"},
		{"deep objects", claim(strings.Repeat(`{"gpus":`, 7000)), 400, ""},
		{"unknown field", claim(`{"gpus":[{"model":"H100 80GB","count":1}],"priority":9}`), 400, `unknown field \"priority\"`},
		{"wrong type count", claim(`{"gpus":[{"model":"H100 80GB","count":"2"}]}`), 400, "count"},
		{"wrong type gpus", claim(`{"gpus":{"model":"H100 80GB"}}`), 400, "gpus"},
		{"float count", claim(`{"gpus":[{"model":"H100 80GB","count":1.5}]}`), 400, "count"},
		{"huge count", claim(`{"gpus":[{"model":"H100 80GB","count":1000000000000}]}`), 400, "between 1 and 16"},
		{"overflowing count", claim(`{"gpus":[{"model":"H100 80GB","count":99999999999999999999}]}`), 400, "count"},
		{"negative count", claim(`{"gpus":[{"model":"H100 80GB","count":-1}]}`), 400, "count"},
		{"1000 items", claim(many), 400, "at most 16"},
		{"two values", claim(`{"gpus":[{"model":"H100 80GB","count":1}]}{}`), 400, "more than one JSON value"},
		{"empty body", claim(``), 400, "empty request body"},
		{"not JSON", claim("\x00\x01\x02"), 400, "malformed"},
		{"text content type", httpReq("PUT", "/v1/claims/vm-1", "text/plain", `{"gpus":[{"model":"H100 80GB","count":1}]}`), 415, "application/json"},
		{"no content type", httpReq("PUT", "/v1/claims/vm-1", "", `{"gpus":[{"model":"H100 80GB","count":1}]}`), 415, "no content type"},
		{"json-like content type", httpReq("PUT", "/v1/claims/vm-1", "application/json-patch+json", `{"gpus":[{"model":"H100 80GB","count":1}]}`), 415, "application/json"},
		{"field name in capitals", claim(`{"GPUS":[{"model":"H100 80GB","count":1}]}`), 400, `did you mean \"gpus\"`},
		{"nested field in capitals", claim(`{"gpus":[{"MODEL":"H100 80GB","count":1}]}`), 400, `did you mean \"model\"`},
		{"duplicate key", claim(`{"gpus":[{"model":"H100 80GB","count":1}],"gpus":[{"model":"H100 80GB","count":8}]}`), 400, "appears twice"},
		{"duplicate count", claim(`{"gpus":[{"model":"H100 80GB","count":1,"count":8}]}`), 400, "appears twice"},
		{"duplicate label", claim(`{"gpus":[{"model":"H100 80GB","count":1}],"labels":{"t":"a","t":"b"}}`), 400, "appears twice"},
		{"drain reason in capitals", httpReq("PUT", "/v1/gpus/0000:18:00.0/drain", J, `{"REASON":"x"}`), 400, `did you mean \"reason\"`},
		{"NUL in model", claim(`{"gpus":[{"model":"H100\u000080GB","count":1}]}`), 400, "unknown_model"},
		{"NUL in label", claim(`{"gpus":[{"model":"H100 80GB","count":1}],"labels":{"a":"b\u0000c"}}`), 400, "printable"},
		{"too many labels", claim(labels(33, 4, 4)), 400, "at most 32"},
		{"huge label key", claim(labels(1, 4000, 4)), 400, "at most 63"},
		{"huge label value", claim(labels(1, 4, 40000)), 400, "at most 256"},
		{"huge model name", claim(`{"gpus":[{"model":"` + strings.Repeat("H", 60000) + `","count":1}]}`), 400, "unknown_model"},
		{"ID with dot-dot", httpReq("PUT", "/v1/claims/..%2F..%2Fetc", J, `{"gpus":[{"model":"H100 80GB","count":1}]}`), 400, "id"},
		{"ID with NUL", httpReq("PUT", "/v1/claims/vm%00-1", J, `{"gpus":[{"model":"H100 80GB","count":1}]}`), 400, "id"},
		{"ID with slash", httpReq("PUT", "/v1/claims/vm%2F1", J, `{"gpus":[{"model":"H100 80GB","count":1}]}`), 400, "id"},
		{"ID with bad UTF-8", httpReq("PUT", "/v1/claims/vm%ff", J, `{"gpus":[{"model":"H100 80GB","count":1}]}`), 400, "id"},
		{"ID of 4000 bytes", httpReq("PUT", "/v1/claims/"+strings.Repeat("a", 4000), J, `{"gpus":[{"model":"H100 80GB","count":1}]}`), 400, "at most 128"},
		{"release with dot-dot", httpReq("DELETE", "/v1/claims/..%2Fvm-0", "", ""), 400, "id"},
		{"resize a bad ID", httpReq("POST", "/v1/claims/vm-0%00/resize", J, `{"gpus":[{"model":"H100 80GB","count":2}]}`), 400, "id"},
		{"drain path trick", httpReq("PUT", "/v1/gpus/..%2F..%2Fdrivers_probe/drain", J, `{}`), 400, "pci_address"},
		{"drain NUL address", httpReq("PUT", "/v1/gpus/0000:18:00.0%00/drain", J, `{}`), 400, "pci_address"},
		{"drain upper-case address", httpReq("PUT", "/v1/gpus/0000:18:00.0%0A/drain", J, `{}`), 400, "pci_address"},
		{"drain unknown GPU", httpReq("PUT", "/v1/gpus/0000:ff:1f.7/drain", J, `{}`), 404, "no GPU"},
		{"drain long reason", httpReq("PUT", "/v1/gpus/0000:18:00.0/drain", J, `{"reason":"`+strings.Repeat("r", 5000)+`"}`), 400, "256"},
		{"undrain path trick", httpReq("DELETE", "/v1/gpus/..%2F..%2Fbind/drain", "", ""), 400, "pci_address"},
		{"group of a billion nodes", httpReq("PUT", "/v1/groups/g1", J, `{"nodes":1000000000,"gpus":[{"model":"H100 80GB","count":1}]}`), 400, "nodes"},
		{"group bad name", httpReq("PUT", "/v1/groups/..%2Fg", J, `{"nodes":1,"gpus":[{"model":"H100 80GB","count":1}]}`), 400, ""},
		{"wrong method", httpReq("POST", "/v1/claims/vm-1", J, `{}`), 404, "no such endpoint"},
		{"no such endpoint", httpReq("GET", "/v1/ledger/backup", "", ""), 404, "no such endpoint"},
		// net/http's ServeMux answers an unclean path with a redirect to
		// the clean one, before any handler runs: not a 4xx, but nothing is
		// served or changed, and the target is itself refused.
		{"dot-dot path", httpReq("GET", "/v1/ledger/../../etc/passwd", "", ""), 307, ""},
		{"dot-dot into claims", httpReq("PUT", "/v1/claims/x/../vm-1", J, `{"gpus":[{"model":"H100 80GB","count":1}]}`), 307, ""},
		{"huge header", []byte("GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"), 431, ""},
		{"bad request line", []byte("GET /v1/status\x00 HTTP/1.1\r\nHost: x\r\n\r\n"), 400, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, socket, tc.req)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d; body %.300s", resp.StatusCode, tc.status, body)
			}
			if len(body) > 4096 {
				t.Errorf("answer of %d bytes echoes the request back: %.200s…", len(body), body)
			}
			if tc.want != "" && !strings.Contains(string(body), tc.want) {
				t.Errorf("answer %.300s lacks %q", body, tc.want)
			}
			if resp.StatusCode == 400 || resp.StatusCode == 404 || resp.StatusCode == 413 || resp.StatusCode == 415 {
				var eb api.ErrorBody
				if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil || eb.Error.Message == "" || eb.Error.Code == "" {
					if tc.name != "bad request line" {
						t.Errorf("answer is not an API error: %.300s", body)
					}
				}
			}
		})
	}
	if a.ledger.Revision() != rev || !reflect.DeepEqual(a.ledger.List(), claims) {
		t.Errorf("hostile requests changed the ledger: revision %d → %d", rev, a.ledger.Revision())
	}
	if w := m.Kernel.Writes()[writes:]; len(w) != 0 {
		t.Errorf("hostile requests wrote to sysfs: %v", w)
	}
	// And the agent still serves.
	resp, body := rawRequest(t, socket, httpReq("GET", "/v1/claims/vm-0", "", ""))
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"claimed"`) {
		t.Fatalf("after the hostile requests: %d %s", resp.StatusCode, body)
	}
}
