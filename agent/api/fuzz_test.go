package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeRequest feeds arbitrary bodies to the request decoder, for every
// request type the API reads. It must never panic; what it refuses is a
// *Error of status 400, 413 or 415 with a message that fits on a line; what
// it accepts came as application/json, is one JSON object of exactly that
// type, which encodes and decodes back to itself, and reads the same to any
// other JSON decoder (no key in another case, no key twice).
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"gpus":[{"model":"H100 80GB","count":2}],"labels":{"team":"ml"},"prefer_node":"gpu-1"}`,
		`{"gpus":[{"model":"L40S","count":1}]}`,
		`{"nodes":3,"gpus":[{"model":"A100 80GB","count":1}]}`,
		`{"reason":"fan"}`,
		`{"force":true}`, `{"force":"yes"}`,
		`{"items":[{"model":"NVIDIA H100 80GB","count":1}],"coordinator":"gpu-2"}`,
		`{}`, ``, `null`, `[]`, `"x"`, `{"gpus":null}`, `{"gpus":[{"count":"2"}]}`,
		`{"gpus":[{"count":1e400}]}`, `{"gpus":[{"count":-9223372036854775809}]}`,
		`{"unknown":1}`, `{"gpus":[]} {}`, `{"labels":{"a\u0000b":"c"}}`,
		strings.Repeat(`[`, 10001), `{"a":` + strings.Repeat(`{"a":`, 200),
		"{\"reason\":\"\xff\xfe\"}", `{"GPUS":[{"MODEL":"x","COUNT":1}]}`,
	} {
		f.Add(uint8(0), []byte(s), "application/json")
	}
	f.Add(uint8(1), []byte(`{"gpus":[{"model":"x","count":1}]}`), "text/plain")
	f.Add(uint8(2), []byte(`{"nodes":1}`), "")
	f.Add(uint8(0), []byte(`{"gpus":[]}`), "application/json; charset=UTF-8")
	f.Add(uint8(0), []byte(`{"gpus":[{"model":"x","Count":1}]}`), "application/json")
	f.Add(uint8(5), []byte(`{"items":[],"coordinator":"a","coordinator":"b"}`), "application/json")
	f.Fuzz(func(t *testing.T, kind uint8, body []byte, contentType string) {
		var v any
		switch kind % 7 {
		case 0:
			v = &ClaimRequest{}
		case 1:
			v = &ResizeRequest{}
		case 2:
			v = &GroupRequest{}
		case 3:
			v = &DrainRequest{}
		case 4:
			v = &ServerDrainRequest{}
		case 5:
			v = &ReleaseRequest{}
		default:
			v = &ReserveRequest{}
		}
		r := httptest.NewRequest(http.MethodPut, "/v1/claims/x", bytes.NewReader(body))
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		err := decode(httptest.NewRecorder(), r, v)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("decode error %T is not an *Error: %v", err, err)
			}
			if e.Status != http.StatusBadRequest && e.Status != http.StatusRequestEntityTooLarge && e.Status != http.StatusUnsupportedMediaType {
				t.Fatalf("decode refused with status %d: %v", e.Status, e)
			}
			if len(e.Message) > 1024 || len(e.Field) > 80 {
				t.Fatalf("error of %d bytes (field %d) echoes the input back: %.200q", len(e.Message), len(e.Field), e.Message)
			}
			return
		}
		if len(body) > MaxBodyBytes {
			t.Fatalf("accepted a body of %d bytes, over the limit of %d", len(body), MaxBodyBytes)
		}
		if mt, _, _ := strings.Cut(strings.ToLower(contentType), ";"); strings.TrimSpace(mt) != "application/json" {
			t.Fatalf("accepted content type %q", contentType)
		}
		// What a case-sensitive, generic decoder sees must be what the
		// agent decoded: no field matched in another case.
		var generic any
		if err := json.Unmarshal(body, &generic); err != nil {
			t.Fatalf("accepted %q, which is not JSON: %v", body, err)
		}
		if g, typed := dropEmpty(generic), dropEmpty(normalizeEmpty(v)); !reflect.DeepEqual(g, typed) {
			t.Fatalf("accepted %q, read as\n %+v\nby a generic decoder and as\n %+v\nby the agent", body, g, typed)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode %+v: %v", body, v, err)
		}
		back := reflect.New(reflect.TypeOf(v).Elem()).Interface()
		if err := json.Unmarshal(again, back); err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", again, err)
		}
		if !reflect.DeepEqual(normalizeEmpty(back), normalizeEmpty(v)) {
			t.Fatalf("round trip of %q:\n got %+v\nwant %+v", body, back, v)
		}
	})
}

// normalizeEmpty makes an empty map and a nil one equal: omitempty drops
// both on the way out.
func normalizeEmpty(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// dropEmpty removes zero values (null, false, 0, "", empty objects and
// arrays) from objects: the typed side writes a field it was not sent as its
// zero value, or omits it, so a zero says nothing either way; a key in
// another case with a value that matters still shows.
func dropEmpty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			e = dropEmpty(e)
			switch ee := e.(type) {
			case nil:
				continue
			case bool:
				if !ee {
					continue
				}
			case float64:
				if ee == 0 {
					continue
				}
			case string:
				if ee == "" {
					continue
				}
			case map[string]any:
				if len(ee) == 0 {
					continue
				}
			case []any:
				if len(ee) == 0 {
					continue
				}
			}
			out[k] = e
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = dropEmpty(e)
		}
		return out
	}
	return v
}
