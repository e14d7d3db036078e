package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/home"
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

// peerCallAs sends one raw peer API request to agent to, through the
// in-memory network, as node from (the identity a client certificate
// would give it), and returns the status and the error body, if any.
func peerCallAs(t *testing.T, tc *testCluster, from string, to *Agent, method, path, body string) (int, *api.Error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+to.cluster.peerAddr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := tc.peers.Transport(from).RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s as %s: %v", method, path, from, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	if resp.StatusCode/100 != 2 {
		if err := json.Unmarshal(data, &eb); err != nil || eb.Error == nil {
			t.Fatalf("%s %s as %s: %d %s is not an API error", method, path, from, resp.StatusCode, data)
		}
	}
	return resp.StatusCode, eb.Error
}

// waitHeld waits until home answers that id is held on owner.
func waitHeld(t *testing.T, home *Agent, id, owner string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ans, err := home.LookupDirectory(context.Background(), id)
		if err == nil && ans.State == api.DirHeld && slices.Equal(ans.Owners, []string{owner}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("home %s never said %s is held on %s: %+v, %v", home.cfg.NodeName, id, owner, ans, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A peer call speaks only for its caller: a certificate of the cluster's
// CA (here: the in-memory network's caller "intruder") cannot reserve
// under another coordinator's name, begin a placement for another, or
// tell a home that another server released a claim — which, before, let
// the same ID be claimed a second time with another request.
func TestPeerCallsSpeakOnlyForTheirCaller(t *testing.T) {
	tc, a, b, c := threeAgents(t, 0, "l40s-4", "dgx-h100", "a100-pcie-4")
	ctx := context.Background()
	id := idHomedOn(a, "c")
	if _, err := b.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, c, id, "a")
	rev := a.ledger.Revision()

	forbidden := func(what string, status int, e *api.Error) {
		t.Helper()
		if status != http.StatusForbidden || e == nil || e.Code != api.CodeForbidden {
			t.Errorf("%s: %d %+v, want 403 forbidden", what, status, e)
		}
	}
	// A release notice in a's name, for a's claim, sent to its home.
	status, e := peerCallAs(t, tc, "intruder", c, "POST", "/v1/peer/directory",
		`{"from":"a","ops":[{"id":"`+id+`","op":"gone"}]}`)
	forbidden("gone in another server's name", status, e)
	if e != nil && (e.Field != "from" || !strings.Contains(e.Message, `"intruder"`)) {
		t.Errorf("the refusal does not name the field and the caller: %+v", e)
	}
	waitHeld(t, c, id, "a")
	// So the same ID with another request (H100s: only b has them) is a
	// conflict, not a second copy on b.
	if cl, err := b.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("the same ID with another request: %+v, %v; want a conflict", cl, err)
	}

	// A reservation and an intent in another coordinator's name.
	status, e = peerCallAs(t, tc, "intruder", a, "PUT", "/v1/peer/reservations/vm-stolen",
		`{"items":[{"model":"NVIDIA L40S","count":1}],"coordinator":"b"}`)
	forbidden("a reservation under another coordinator", status, e)
	status, e = peerCallAs(t, tc, "intruder", c, "POST", "/v1/peer/directory/vm-stolen/begin", `{"coordinator":"b"}`)
	forbidden("an intent under another coordinator", status, e)
	if a.ledger.Revision() != rev {
		t.Errorf("refused calls changed a's ledger: revision %d → %d", rev, a.ledger.Revision())
	}
	if c.home.Knows("vm-stolen") {
		t.Error("a refused begin left an intent")
	}

	// The control: under its own name (or none: the caller's is filled
	// in) the same reservation is made, and the ledger names the caller.
	status, e = peerCallAs(t, tc, "intruder", a, "PUT", "/v1/peer/reservations/vm-own",
		`{"items":[{"model":"NVIDIA L40S","count":1}]}`)
	if status != http.StatusOK {
		t.Fatalf("a reservation under the caller's own name: %d %+v", status, e)
	}
	if r, err := a.ledger.Get("vm-own"); err != nil || r.Coordinator != "intruder" {
		t.Errorf("the reservation's coordinator: %+v, %v; want intruder", r, err)
	}
	if status, e := peerCallAs(t, tc, "intruder", a, "DELETE", "/v1/peer/reservations/vm-own", ""); status != http.StatusOK {
		t.Errorf("aborting its own reservation: %d %+v", status, e)
	}
}

// A peer call that carries no verified caller is refused, whatever it
// asks; the public API on the same handler is not a peer call.
func TestPeerCallWithoutCallerIsRefused(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a", "l40s-4")
	h := api.NewPeerHandler(a, a, quietLog())
	rev := a.ledger.Revision()
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/peer/claims", ""},
		{"PUT", "/v1/peer/reservations/vm-1", `{"items":[{"model":"NVIDIA L40S","count":1}],"coordinator":"a"}`},
		{"POST", "/v1/peer/directory", `{"from":"a","ops":[{"id":"vm-1","op":"held"}]}`},
		{"GET", "/v1/peer/capacity", ""},
	} {
		req := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var eb api.ErrorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &eb)
		if rec.Code != http.StatusForbidden || eb.Error == nil || eb.Error.Code != api.CodeForbidden {
			t.Errorf("%s %s without a caller: %d %s", r.method, r.path, rec.Code, rec.Body)
		}
	}
	if a.ledger.Revision() != rev || a.home.Stats().Entries != 0 {
		t.Error("a refused call changed the ledger or the directory")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/status", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("the public status on the peer handler: %d", rec.Code)
	}
}

// One caller cannot grow a home's memory without end, nor push out the
// records of others: 100,000 intents, held claims and releases from one
// caller are refused (or, for releases, replace its own oldest) past its
// bound; another owner's remembered release survives; an intruder's
// intents go when the membership changes without it.
func TestHomeRecordsAreBoundedPerCaller(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a", "l40s-4")
	ctx := context.Background()
	const flood = 100_000
	ids := func(prefix string, from, n int) []api.DirOp {
		ops := make([]api.DirOp, n)
		for i := range ops {
			ops[i] = api.DirOp{ID: fmt.Sprintf("%s-%d", prefix, from+i)}
		}
		return ops
	}
	send := func(from, op, prefix string) (applied int, err error) {
		for i := 0; i < flood; i += api.MaxDirUpdateIDs {
			batch := ids(prefix, i, min(api.MaxDirUpdateIDs, flood-i))
			for j := range batch {
				batch[j].Op = op
			}
			if err := a.UpdateDirectory(ctx, api.DirUpdate{From: from, Ops: batch}); err != nil {
				return i, err
			}
		}
		return flood, nil
	}
	// A real owner's release, to be remembered for remember_released.
	if err := a.UpdateDirectory(ctx, api.DirUpdate{From: "owner-1", Ops: []api.DirOp{{ID: "vm-real", Op: api.DirOpGone}}}); err != nil {
		t.Fatal(err)
	}

	if n, err := send("intruder", api.DirOpHeld, "held"); !api.IsCode(err, api.CodeLimit) || n > home.HeldPerCaller {
		t.Errorf("100k held claims: %d batches' worth applied, %v; want a limit error by %d", n, err, home.HeldPerCaller)
	}
	if n, err := send("intruder", api.DirOpGone, "gone"); err != nil {
		t.Errorf("100k releases after %d: %v", n, err)
	}
	refused := 0
	for i := range flood {
		if _, err := a.BeginClaim(ctx, fmt.Sprintf("intent-%d", i), api.DirBegin{Coordinator: "intruder"}); err != nil {
			if !api.IsCode(err, api.CodeLimit) {
				t.Fatalf("begin %d: %v", i, err)
			}
			refused++
		}
	}
	if refused != flood-home.IntentsPerCaller {
		t.Errorf("%d of 100k intents refused, want all past %d", refused, home.IntentsPerCaller)
	}
	st := a.home.Stats()
	entries, released, last := st.Entries, st.Releases, a.home.LastOwner("vm-real")
	if entries > home.HeldPerCaller+home.IntentsPerCaller || released > home.ReleasesPerCaller+1 {
		t.Errorf("one caller grew the home to %d entries and %d releases; bounds %d and %d", entries, released, home.HeldPerCaller+home.IntentsPerCaller, home.ReleasesPerCaller)
	}
	if last != "owner-1" {
		t.Errorf("owner-1's release of vm-real is forgotten (last owner %q)", last)
	}
	// Over the wire too: 429 limit, naming the caller.
	status, e := peerCallAs(t, tc, "intruder", a, "POST", "/v1/peer/directory", `{"ops":[{"id":"one-more","op":"held"}]}`)
	if status != http.StatusTooManyRequests || e == nil || e.Code != api.CodeLimit || !strings.Contains(e.Message, "intruder") {
		t.Errorf("one more held claim over the wire: %d %+v", status, e)
	}

	// The intruder is no member: the next membership change drops its
	// intents (its held records stay: they are what keeps a claim on a
	// server that is down from answering "not found").
	tc.start("b", "l40s-4")
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := a.home.Stats().Intents["intruder"]
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d intents of a non-member remain after a membership change", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An intent alone does not hold a real claim: a member that posts a
// begin for an ID it never places (under its own name, all it can do
// now) delays a real claim of that ID by at most claim.PendingPatience, not a
// reservation's whole life (55 s by default), and the claim is placed
// once.
func TestFakeIntentDoesNotStallAClaim(t *testing.T) {
	tc, a, b, _ := threeAgents(t, 0, "l40s-4", "l40s-4", "a100-pcie-4")
	tc.start("intruder", "a100-pcie-4")
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 4 })
	id := idHomedOn(a, "a", "b")
	homeAgent := a
	if home.Of(id, a.targets(), targetName).Name() == "b" {
		homeAgent = b
	}
	if status, e := peerCallAs(t, tc, "intruder", homeAgent, "POST", "/v1/peer/directory/"+id+"/begin", `{}`); status != http.StatusOK {
		t.Fatalf("the intruder's begin: %d %+v", status, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	cl, err := b.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the real claim after %v: %v", took, err)
	}
	t.Logf("claim of an ID with a fake intent took %v", took)
	if took > claim.PendingPatience+3*time.Second {
		t.Errorf("the real claim took %v; a fake intent may delay it by %v at most", took, claim.PendingPatience)
	}
	if on := holdersSeenBy(b, id); len(on) != 1 || on[0] != cl.Node {
		t.Errorf("copies of %s on %v, want the one on %s", id, on, cl.Node)
	}
}
