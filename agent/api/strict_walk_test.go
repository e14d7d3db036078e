package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// The walk checkStrict does byte by byte must say what walking
// json.Decoder's tokens said, word for word: the reference below is that
// walk, as it was.

func TestCheckStrictMatchesTheTokenWalk(t *testing.T) {
	types := strictTestTypes()
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]int{}
	for i := range 20000 {
		typ := types[i%len(types)]
		data := genStrictJSON(r, typ, 0)
		if !json.Valid(data) {
			t.Fatalf("generated %q, not JSON", data)
		}
		compareStrict(t, data, typ)
		switch err := checkStrict(data, typ); {
		case err == nil:
			seen["accepted"]++
		case strings.Contains(err.Error(), "appears twice"):
			seen["twice"]++
		case strings.Contains(err.Error(), "did you mean"):
			seen["case"]++
		case strings.Contains(err.Error(), "unknown field"):
			seen["unknown"]++
		}
	}
	for _, k := range []string{"accepted", "twice", "case", "unknown"} {
		if seen[k] < 100 {
			t.Errorf("only %d generated bodies %s (%v): the comparison misses a case", seen[k], k, seen)
		}
	}
	for _, s := range []string{
		`{"gpus":[{"model":"x","count":1}],"gpus":[]}`,
		`{"gpus":[{"model":"x","count":1,"count":2}]}`,
		`{"labels":{"a":"1","a":"2"}}`,
		`{"GPUS":[]}`, `{"gpu":[]}`, `{"\u0067pus":[]}`, `{"\u0067pus":[],"gpus":[]}`,
		"{\"gp\xffus\":1}", `{"gpus":[{"model":"x","Count":1}]}`,
		`{"gpus":[{},{},{"nope":1}]}`, ` { "gpus" : [ ] } `, `{}`, `[]`, `"x"`, `1`, `null`,
		`{"labels":{` + strings.Repeat(`"k":1,`, 40) + `"k":1}}`,
	} {
		for _, typ := range types {
			compareStrict(t, []byte(s), typ)
		}
	}
}

func FuzzCheckStrictMatchesTheTokenWalk(f *testing.F) {
	f.Add([]byte(`{"gpus":[{"model":"x","count":1}],"labels":{"a":"b"}}`), uint8(0))
	f.Add([]byte(`{"items":[],"coordinator":"a","coordinator":"b"}`), uint8(1))
	f.Add([]byte("{\"gp\\u00e9us\":[],\"\xff\":2}"), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		if !json.Valid(data) {
			return // checkStrict reads only what decodeStrict decoded
		}
		types := strictTestTypes()
		compareStrict(t, data, types[int(kind)%len(types)])
	})
}

func compareStrict(t *testing.T, data []byte, typ reflect.Type) {
	t.Helper()
	got, want := checkStrict(data, typ), checkStrictTokens(data, typ)
	if (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
		t.Fatalf("%s %s: checkStrict says %v, the token walk %v", typ, data, got, want)
	}
	if ge, ok := got.(*Error); ok {
		if we, ok := want.(*Error); !ok || ge.Field != we.Field {
			t.Fatalf("%s %s: error %#v, the token walk %#v", typ, data, got, want)
		}
	}
}

func strictTestTypes() []reflect.Type {
	return []reflect.Type{
		reflect.TypeFor[*ClaimRequest](), reflect.TypeFor[*ReserveRequest](), reflect.TypeFor[*GroupRequest](),
		reflect.TypeFor[*ResizeRequest](), reflect.TypeFor[*ReleaseRequest](), reflect.TypeFor[map[string]any](),
	}
}

// genStrictJSON writes a JSON value shaped after typ (its keys, in their
// case or another, twice, unknown, escaped), or anything at all.
func genStrictJSON(r *rand.Rand, typ reflect.Type, depth int) []byte {
	for typ != nil && typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	var b bytes.Buffer
	ws := func() {
		if r.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n"}[r.IntN(4)])
		}
	}
	if depth > 4 || typ == nil && r.IntN(3) == 0 {
		b.WriteString([]string{`1`, `-2.5e3`, `true`, `null`, `"s"`, `"a\"b"`, `"é"`, `false`}[r.IntN(8)])
		return b.Bytes()
	}
	kind := reflect.Invalid
	if typ != nil {
		kind = typ.Kind()
	}
	switch {
	case kind == reflect.Slice || kind == reflect.Array || typ == nil && r.IntN(2) == 0:
		var elem reflect.Type
		if typ != nil {
			elem = typ.Elem()
		}
		b.WriteByte('[')
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			b.Write(genStrictJSON(r, elem, depth+1))
			ws()
		}
		b.WriteByte(']')
	case kind == reflect.Struct || kind == reflect.Map || typ == nil:
		var names []string
		fields := map[string]reflect.Type{}
		if kind == reflect.Struct {
			fields = jsonFields(typ)
			for n := range fields {
				names = append(names, n)
			}
		}
		b.WriteByte('{')
		n := r.IntN(6)
		used := []string{}
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			var key string
			switch {
			case len(used) > 0 && r.IntN(12) == 0:
				key = used[r.IntN(len(used))] // twice
			case len(names) > 0 && r.IntN(10) < 8:
				key = names[r.IntN(len(names))]
				if r.IntN(15) == 0 {
					key = strings.ToUpper(key)
				}
			default:
				key = []string{"k", "x", "gpu", "Items", "a.b", "é", "\xff", "z\tz"}[r.IntN(8)]
			}
			used = append(used, key)
			kb, _ := json.Marshal(key)
			if r.IntN(10) == 0 && len(key) > 0 && key[0] < 0x80 {
				kb = []byte(fmt.Sprintf(`"\u%04x%s`, key[0], kb[2:])) // escaped first letter
			}
			if r.IntN(20) == 0 {
				kb = []byte("\"" + key + "\"") // raw bytes, invalid UTF-8 kept
				if !json.Valid(kb) {
					kb, _ = json.Marshal(key)
				}
			}
			b.Write(kb)
			ws()
			b.WriteByte(':')
			ws()
			var vt reflect.Type
			if kind == reflect.Map {
				vt = typ.Elem()
			} else {
				vt = fields[key]
			}
			b.Write(genStrictJSON(r, vt, depth+1))
			ws()
		}
		b.WriteByte('}')
	default:
		b.WriteString([]string{`1`, `"s"`, `true`, `null`, `[1]`, `{"a":1,"a":2}`}[r.IntN(6)])
	}
	return b.Bytes()
}

// checkStrictTokens is the reference: checkStrict as json.Decoder's
// tokens walked it.
func checkStrictTokens(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkValueTokens(dec, t, "")
}

func walkValueTokens(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	switch d {
	case '{':
		var fields map[string]reflect.Type
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Struct:
				fields = jsonFields(t)
			case reflect.Map:
				elem = t.Elem()
			}
		}
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := kt.(string)
			where := joinPath(path, key)
			if seen[key] {
				return Invalid(truncate(where, 64), "field %q appears twice", truncate(where, 64))
			}
			seen[key] = true
			next := elem
			if fields != nil {
				ft, known := fields[key]
				if !known {
					return unknownField(where, key, fields)
				}
				next = ft
			}
			if err := walkValueTokens(dec, next, where); err != nil {
				return err
			}
		}
		_, err := dec.Token() // '}'
		return err
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkValueTokens(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	return nil
}

// decodeStrict refuses what follows the object exactly where json.Decoder's
// Token found something other than the end.
func TestOnlyJSONSpaceMayFollowTheObject(t *testing.T) {
	for _, tail := range []string{"", " ", "\n\t\r ", "}", "]", "x", " {}", "\u00a0", "\u2028", "\x00", "\x0b", "\x0c", " 1", `"s"`} {
		body := `{"gpus":[]}` + tail
		r := httptest.NewRequest(http.MethodPut, "/v1/claims/x", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		err := decode(httptest.NewRecorder(), r, &ClaimRequest{})
		refused := err != nil && strings.Contains(err.Error(), "more than one JSON value")
		dec := json.NewDecoder(strings.NewReader(body))
		if derr := dec.Decode(&ClaimRequest{}); derr != nil {
			t.Fatal(derr)
		}
		_, terr := dec.Token()
		if want := !errors.Is(terr, io.EOF); refused != want {
			t.Errorf("tail %q: refused %v (%v), the decoder's token says %v", tail, refused, err, want)
		}
	}
}
