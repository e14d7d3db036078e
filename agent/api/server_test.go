package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// request is one HTTP request to the handler.
type request struct {
	method, target, body, contentType string
}

// serve runs req through the real handler on svc and returns the recorded
// answer and what was logged.
func serve(t *testing.T, svc api.Service, req request) (*httptest.ResponseRecorder, string) {
	t.Helper()
	var body io.Reader
	if req.body != "" {
		body = strings.NewReader(req.body)
	}
	r := httptest.NewRequest(req.method, req.target, body)
	if req.contentType != "" {
		r.Header.Set("Content-Type", req.contentType)
	}
	var logs bytes.Buffer
	h := api.NewHandler(svc, slog.New(slog.NewTextHandler(&logs, nil)))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec, logs.String()
}

// errorOf checks that rec is a JSON error body {"error":{code,message}} and
// returns it with Status filled from the HTTP status.
func errorOf(t *testing.T, rec *httptest.ResponseRecorder) *api.Error {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	var eb api.ErrorBody
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("error body %q is not an api.ErrorBody: %v", rec.Body.String(), err)
	}
	if eb.Error == nil || eb.Error.Code == "" || eb.Error.Message == "" {
		t.Fatalf("error body %q lacks error.code or error.message", rec.Body.String())
	}
	eb.Error.Status = rec.Code
	return eb.Error
}

func TestHandlerRoutesEachEndpoint(t *testing.T) {
	claimBody := `{"gpus":[{"model":"H100 80GB","count":2},{"model":"L40S","count":1}],"labels":{"tenant":"t-1"}}`
	tests := []struct {
		name string
		req  request
		call call
		want any // the body, decoded into a value of the same type
	}{
		{"status", request{method: "GET", target: "/v1/status"}, call{Method: "Status"}, fakeStatus},
		{"claims", request{method: "GET", target: "/v1/claims"}, call{Method: "ListClaims"}, fakeClaimList},
		{"get", request{method: "GET", target: "/v1/claims/vm-1"}, call{Method: "Get", ID: "vm-1"}, fakeClaim("vm-1")},
		{"claim", request{method: "PUT", target: "/v1/claims/vm-1", body: claimBody, contentType: "application/json"},
			call{Method: "Claim", ID: "vm-1", Req: api.ClaimRequest{
				GPUs:   []api.Item{{Model: "H100 80GB", Count: 2}, {Model: "L40S", Count: 1}},
				Labels: map[string]string{"tenant": "t-1"},
			}}, fakeClaim("vm-1")},
		{"claim with the content type in capitals", request{method: "PUT", target: "/v1/claims/vm-2", body: `{"gpus":[{"model":"L40S","count":1}]}`, contentType: "Application/JSON; Charset=UTF-8"},
			call{Method: "Claim", ID: "vm-2", Req: api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}}, fakeClaim("vm-2")},
		{"claim with charset", request{method: "PUT", target: "/v1/claims/vm-3", body: `{"gpus":[]}`, contentType: "application/json; charset=utf-8"},
			call{Method: "Claim", ID: "vm-3", Req: api.ClaimRequest{GPUs: []api.Item{}}}, fakeClaim("vm-3")},
		{"release", request{method: "DELETE", target: "/v1/claims/vm-1"}, call{Method: "Release", ID: "vm-1"}, released(fakeClaim("vm-1"))},
		{"drain with reason", request{method: "PUT", target: "/v1/gpus/0000:18:00.0/drain", body: `{"reason":"RMA"}`, contentType: "application/json"},
			call{Method: "Drain", ID: "0000:18:00.0", Reason: "RMA"},
			func() api.GPU {
				g := fakeGPU
				g.State, g.DrainReason = api.StateDrained, "RMA"
				return g
			}()},
		{"drain without body", request{method: "PUT", target: "/v1/gpus/0000:18:00.0/drain"},
			call{Method: "Drain", ID: "0000:18:00.0"},
			func() api.GPU { g := fakeGPU; g.State = api.StateDrained; return g }()},
		{"undrain", request{method: "DELETE", target: "/v1/gpus/0000:18:00.0/drain"}, call{Method: "Undrain", ID: "0000:18:00.0"},
			func() api.GPU { g := fakeGPU; g.State = api.StateFree; return g }()},
		{"availability", request{method: "GET", target: "/v1/availability"}, call{Method: "Availability"}, fakeAvail},
		{"version", request{method: "GET", target: "/v1/version"}, call{Method: "Version"}, fakeVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			rec, _ := serve(t, svc, tc.req)
			if rec.Code != http.StatusOK {
				t.Fatalf("%s %s = %d %s, want 200", tc.req.method, tc.req.target, rec.Code, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			if got := svc.Calls(); !reflect.DeepEqual(got, []call{tc.call}) {
				t.Errorf("service calls = %+v, want [%+v]", got, tc.call)
			}
			got := reflect.New(reflect.TypeOf(tc.want))
			if err := json.Unmarshal(rec.Body.Bytes(), got.Interface()); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if !reflect.DeepEqual(got.Elem().Interface(), tc.want) {
				t.Errorf("body decodes to %+v, want %+v", got.Elem().Interface(), tc.want)
			}
		})
	}
}

func TestHandlerUnknownEndpoints(t *testing.T) {
	for _, req := range []request{
		{method: "GET", target: "/"},
		{method: "GET", target: "/status"},
		{method: "GET", target: "/v2/status"},
		{method: "GET", target: "/v1/nope"},
		{method: "POST", target: "/v1/claims/vm-1", body: `{"gpus":[]}`},
		{method: "PATCH", target: "/v1/gpus/0000:18:00.0/drain"},
		{method: "GET", target: "/v1/gpus/0000:18:00.0/drain"},
		{method: "DELETE", target: "/v1/claims"},
		{method: "GET", target: "/v1/claims/a/b"}, // an unescaped slash is two segments: no route
		{method: "GET", target: "/v1/" + strings.Repeat("x", 5000)},
	} {
		name := req.method + " " + req.target
		if len(name) > 60 {
			name = name[:60]
		}
		t.Run(name, func(t *testing.T) {
			svc := &fakeService{}
			rec, _ := serve(t, svc, req)
			e := errorOf(t, rec)
			if e.Status != http.StatusNotFound || e.Code != api.CodeNotFound {
				t.Errorf("answer %d %s, want 404 %s", e.Status, e.Code, api.CodeNotFound)
			}
			if !strings.Contains(e.Message, req.method) {
				t.Errorf("message %q does not name the method", e.Message)
			}
			// The path is echoed, but never more than a line's worth of it.
			if len(e.Message) > 200 {
				t.Errorf("message is %d bytes long: a hostile path must be truncated", len(e.Message))
			}
			if calls := svc.Calls(); len(calls) != 0 {
				t.Errorf("service was called: %+v", calls)
			}
		})
	}
}

// TestHandlerRefusesHostileBodies: a body the handler cannot decode into
// exactly one known object is a 4xx naming what is wrong, and the service
// never sees it.
func TestHandlerRefusesHostileBodies(t *testing.T) {
	const claim, drain = "/v1/claims/vm-1", "/v1/gpus/0000:18:00.0/drain"
	oversized := `{"gpus":[{"model":"` + strings.Repeat("x", api.MaxBodyBytes) + `","count":1}]}`
	nestedOpen := `{"gpus":` + strings.Repeat("[", 20000)
	nestedBalanced := `{"labels":` + strings.Repeat(`{"a":`, 10001) + `""` + strings.Repeat("}", 10001) + "}"
	longField := strings.Repeat("f", 10000)
	const anyField = "\x00any"
	tests := []struct {
		name       string
		target     string
		body       string
		ct         string
		wantStatus int
		wantField  string
		wantMsg    string // a substring of the message
	}{
		{"body over 64 KiB", claim, oversized, "", http.StatusRequestEntityTooLarge, "", "larger than 65536 bytes"},
		{"drain body over 64 KiB", drain, `{"reason":"` + strings.Repeat("r", api.MaxBodyBytes) + `"}`, "", http.StatusRequestEntityTooLarge, "", "larger than"},
		{"64 KiB of whitespace before the object", claim, strings.Repeat(" ", api.MaxBodyBytes+1) + `{}`, "", http.StatusRequestEntityTooLarge, "", "larger than"},
		{"nesting never closed", claim, nestedOpen, "", http.StatusBadRequest, "", "malformed JSON"},
		{"nesting 10001 deep", claim, nestedBalanced, "", http.StatusBadRequest, "", "malformed JSON"},
		{"unknown top-level field", claim, `{"gpus":[{"model":"L40S","count":1}],"gpu":[]}`, "", http.StatusBadRequest, "gpu", `unknown field "gpu"`},
		{"unknown nested field", claim, `{"gpus":[{"model":"L40S","count":1,"cnt":2}]}`, "", http.StatusBadRequest, "cnt", `unknown field "cnt"`},
		{"unknown drain field", drain, `{"reason":"x","force":true}`, "", http.StatusBadRequest, "force", `unknown field "force"`},
		// The message truncates the name; Field still carries all of it
		// (see the report), so it is not checked here.
		{"unknown field with a huge name", claim, `{"` + longField + `":1}`, "", http.StatusBadRequest, anyField, "unknown field"},
		{"count as a string", claim, `{"gpus":[{"model":"L40S","count":"2"}]}`, "", http.StatusBadRequest, "gpus.count", "gpus.count"},
		{"count as a float", claim, `{"gpus":[{"model":"L40S","count":1.5}]}`, "", http.StatusBadRequest, "gpus.count", "gpus.count"},
		{"count beyond int", claim, `{"gpus":[{"model":"L40S","count":1e40}]}`, "", http.StatusBadRequest, "gpus.count", "gpus.count"},
		{"model as a number", claim, `{"gpus":[{"model":100,"count":1}]}`, "", http.StatusBadRequest, "gpus.model", "gpus.model"},
		{"gpus as a string", claim, `{"gpus":"H100:2"}`, "", http.StatusBadRequest, "gpus", `"gpus"`},
		{"label value as a number", claim, `{"gpus":[],"labels":{"k":1}}`, "", http.StatusBadRequest, "labels", `"labels"`},
		{"reason as a number", drain, `{"reason":5}`, "", http.StatusBadRequest, "reason", `"reason"`},
		{"array instead of object", claim, `[{"model":"L40S","count":1}]`, "", http.StatusBadRequest, "", "array"},
		{"second object after the first", claim, `{"gpus":[]} {"gpus":[]}`, "", http.StatusBadRequest, "", "more than one JSON value"},
		{"garbage after the object", claim, `{"gpus":[]}garbage`, "", http.StatusBadRequest, "", "more than one JSON value"},
		{"empty body", claim, "", "", http.StatusBadRequest, "", "empty request body"},
		{"whitespace body", claim, " \n\t ", "", http.StatusBadRequest, "", "empty request body"},
		{"truncated object", claim, `{"gpus":[{"model":"L40S"`, "", http.StatusBadRequest, "", "malformed request"},
		{"NUL byte inside a string", claim, "{\"gpus\":[{\"model\":\"L40S\x00\",\"count\":1}]}", "", http.StatusBadRequest, "", "malformed JSON"},
		{"NUL byte between tokens", claim, "{\"gpus\":[]\x00}", "", http.StatusBadRequest, "", "malformed JSON"},
		{"text/plain", claim, `{"gpus":[]}`, "text/plain", http.StatusUnsupportedMediaType, "", `content type "text/plain"`},
		{"form", claim, "gpus=L40S", "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType, "", "send application/json"},
		{"drain as text/plain", drain, `{"reason":"x"}`, "text/plain", http.StatusUnsupportedMediaType, "", "content type"},
		{"huge content type", claim, `{"gpus":[]}`, "text/" + strings.Repeat("x", 5000), http.StatusUnsupportedMediaType, "", "content type"},
		// Strict content type: exactly application/json, charset utf-8 at most.
		{"no content type", claim, `{"gpus":[]}`, noContentType, http.StatusUnsupportedMediaType, "", "no content type"},
		{"a json-like type", claim, `{"gpus":[]}`, "application/jsonx", http.StatusUnsupportedMediaType, "", "content type"},
		{"json with a suffix", claim, `{"gpus":[]}`, "application/json-seq", http.StatusUnsupportedMediaType, "", "content type"},
		{"another charset", claim, `{"gpus":[]}`, "application/json; charset=latin1", http.StatusUnsupportedMediaType, "", "charset=utf-8"},
		{"another parameter", claim, `{"gpus":[]}`, "application/json; boundary=x", http.StatusUnsupportedMediaType, "", "content type"},
		{"malformed parameters", claim, `{"gpus":[]}`, "application/json;;", http.StatusUnsupportedMediaType, "", "content type"},
		// Strict keys: exact case, no duplicates, at any depth.
		{"field name in capitals", claim, `{"GPUS":[{"model":"L40S","count":1}]}`, "", http.StatusBadRequest, "GPUS", `did you mean "gpus"`},
		{"nested field in another case", claim, `{"gpus":[{"Model":"L40S","count":1}]}`, "", http.StatusBadRequest, "gpus[0].Model", `did you mean "model"`},
		{"drain reason in capitals", drain, `{"Reason":"x"}`, "", http.StatusBadRequest, "Reason", `did you mean "reason"`},
		{"duplicate top-level key", claim, `{"gpus":[],"gpus":[{"model":"L40S","count":1}]}`, "", http.StatusBadRequest, "gpus", "appears twice"},
		{"duplicate nested key", claim, `{"gpus":[{"model":"L40S","count":1,"count":9}]}`, "", http.StatusBadRequest, "gpus[0].count", "appears twice"},
		{"duplicate label", claim, `{"gpus":[],"labels":{"k":"a","k":"b"}}`, "", http.StatusBadRequest, "labels.k", "appears twice"},
		{"keys equal but for case", claim, `{"gpus":[],"gpuS":[]}`, "", http.StatusBadRequest, "gpuS", "case-sensitive"},
		{"duplicate key behind an escape", claim, `{"gpus":[],"gp\u0075s":[]}`, "", http.StatusBadRequest, "gpus", "appears twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			ct := tc.ct
			switch ct {
			case "":
				ct = "application/json"
			case noContentType:
				ct = ""
			}
			rec, _ := serve(t, svc, request{method: "PUT", target: tc.target, body: tc.body, contentType: ct})
			e := errorOf(t, rec)
			if e.Status != tc.wantStatus || e.Code != api.CodeInvalid {
				t.Errorf("answer %d %s, want %d %s", e.Status, e.Code, tc.wantStatus, api.CodeInvalid)
			}
			if tc.wantField != anyField && e.Field != tc.wantField {
				t.Errorf("field = %.80q, want %.80q", e.Field, tc.wantField)
			}
			if !strings.Contains(e.Message, tc.wantMsg) {
				t.Errorf("message %.300q does not contain %q", e.Message, tc.wantMsg)
			}
			if len(e.Message) > 300 {
				t.Errorf("message is %d bytes long: it must not echo the hostile input", len(e.Message))
			}
			if calls := svc.Calls(); len(calls) != 0 {
				t.Errorf("service was called with an undecodable request: %+v", calls[0].Method)
			}
		})
	}
}

// TestHandlerPassesHostileIDsVerbatim: whatever an ID in the path holds, it
// reaches the one method its route names, decoded and whole, and never
// another route or another resource; validating it is the service's job
// (the fake answers not_found, as the agent would).
func TestHandlerPassesHostileIDsVerbatim(t *testing.T) {
	long := strings.Repeat("i", 10000)
	tests := []struct {
		name   string
		method string
		target string
		want   call
	}{
		{"escaped traversal in a claim ID", "GET", "/v1/claims/..%2F..%2Fetc", call{Method: "Get", ID: "../../etc"}},
		{"escaped traversal on release", "DELETE", "/v1/claims/..%2F..%2Fetc%2Fpasswd", call{Method: "Release", ID: "../../etc/passwd"}},
		{"escaped slash in a claim ID", "GET", "/v1/claims/a%2Fb", call{Method: "Get", ID: "a/b"}},
		{"dot-dot alone, escaped", "GET", "/v1/claims/%2E%2E", call{Method: "Get", ID: ".."}},
		{"NUL byte in a claim ID", "GET", "/v1/claims/vm-1%00.db", call{Method: "Get", ID: "vm-1\x00.db"}},
		{"newline in a claim ID", "DELETE", "/v1/claims/vm-1%0Aadmin", call{Method: "Release", ID: "vm-1\nadmin"}},
		{"10000-byte claim ID", "GET", "/v1/claims/" + long, call{Method: "Get", ID: long}},
		{"traversal in a PCI address", "PUT", "/v1/gpus/..%2F..%2Fdrivers%2Fnvidia%2Funbind/drain",
			call{Method: "Drain", ID: "../../drivers/nvidia/unbind"}},
		{"NUL byte in a PCI address", "DELETE", "/v1/gpus/0000:18:00.0%00/drain", call{Method: "Undrain", ID: "0000:18:00.0\x00"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{err: &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: "not found"}}
			rec, _ := serve(t, svc, request{method: tc.method, target: tc.target})
			e := errorOf(t, rec)
			if e.Status != http.StatusNotFound || e.Code != api.CodeNotFound {
				t.Errorf("answer %d %s, want the service's 404 not_found", e.Status, e.Code)
			}
			if got := svc.Calls(); !reflect.DeepEqual(got, []call{tc.want}) {
				t.Errorf("service calls = %.200q, want [%.200q]", fmt.Sprint(got), fmt.Sprint(tc.want))
			}
		})
	}
}

// TestHandlerServiceErrors: an *api.Error reaches the client as it is; any
// other error is a logged 500 internal.
func TestHandlerServiceErrors(t *testing.T) {
	notAvailable := &api.Error{Status: http.StatusConflict, Code: api.CodeNotAvailable,
		Message: "The following GPUs are not available: 1x NVIDIA L40S", Missing: []api.Item{{Model: "NVIDIA L40S", Count: 1}}}
	unknownModel := &api.Error{Status: http.StatusBadRequest, Code: api.CodeUnknownModel, Field: "gpus[0].model",
		Message: `unknown GPU model "V100"`, KnownModels: []string{"NVIDIA H100 80GB", "NVIDIA L40S"}}
	tests := []struct {
		name    string
		err     error
		want    *api.Error
		wantLog bool
	}{
		{"not available", notAvailable, notAvailable, false},
		{"unknown model with the catalog", unknownModel, unknownModel, false},
		{"wrapped api error", fmt.Errorf("claiming: %w", notAvailable), notAvailable, false},
		{"conflict", &api.Error{Status: 409, Code: api.CodeConflict, Message: "taken"},
			&api.Error{Status: 409, Code: api.CodeConflict, Message: "taken"}, false},
		{"api error without status", &api.Error{Code: api.CodeBindFailed, Message: "stuck"},
			&api.Error{Status: 500, Code: api.CodeBindFailed, Message: "stuck"}, false},
		{"plain error", errors.New("disk on fire"),
			&api.Error{Status: 500, Code: api.CodeInternal, Message: "disk on fire"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{err: tc.err}
			rec, logs := serve(t, svc, request{method: "PUT", target: "/v1/claims/vm-1",
				body: `{"gpus":[{"model":"L40S","count":1}]}`, contentType: "application/json"})
			got := errorOf(t, rec)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("error = %+v, want %+v", got, tc.want)
			}
			if logged := strings.Contains(logs, "request failed"); logged != tc.wantLog {
				t.Errorf("logged %q, want a 'request failed' line: %v", logs, tc.wantLog)
			}
			if tc.wantLog && !strings.Contains(logs, "disk on fire") {
				t.Errorf("log %q does not carry the error", logs)
			}
		})
	}
}

// Every code the protocol uses travels with the status it always had.
func TestStatusOfCodes(t *testing.T) {
	for code, want := range map[string]int{
		api.CodeInvalid: 400, api.CodeUnknownModel: 400, api.CodeNotFound: 404,
		api.CodeNotAvailable: 409, api.CodeConflict: 409, api.CodeLeaseExpired: 409,
		api.CodeBindFailed: 500, api.CodeInternal: 500, api.CodeUnavailable: 503, api.CodeForbidden: 403, api.CodeLimit: 429,
		"something_new": 500,
	} {
		if got := api.StatusOf(code); got != want {
			t.Errorf("StatusOf(%q) = %d, want %d", code, got, want)
		}
		if got := (&api.Error{Code: code}).ServerFault(); got != (want >= 500) {
			t.Errorf("ServerFault of %q = %v", code, got)
		}
	}
	if got := (&api.Error{Status: 413, Code: api.CodeInvalid}).HTTPStatus(); got != 413 {
		t.Errorf("an explicit status is kept: got %d", got)
	}
}

// noContentType in a test table sends no Content-Type header at all.
const noContentType = "(none)"

// released is c as the answer to its release shows it.
func released(c api.Claim) api.Claim {
	c.State = api.StateReleased
	return c
}
