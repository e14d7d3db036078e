package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Request bodies are decoded strictly. encoding/json on its own matches
// field names case-insensitively ("GPUS" fills gpus) and lets the last of
// two equal keys win: a request that a proxy, a log or another decoder
// reads differently from the agent. checkStrict runs after decoding and
// refuses both, naming the key.

// checkContentType accepts exactly application/json, optionally with
// charset=utf-8 (the only encoding JSON may have, RFC 8259), in any case.
func checkContentType(ct string) error {
	if ct == "" {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: CodeInvalid,
			Message: "no content type: send Content-Type: application/json"}
	}
	mt, params, err := mime.ParseMediaType(ct)
	ok := err == nil && mt == "application/json"
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			ok = false
		}
	}
	if !ok {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: CodeInvalid,
			Message: fmt.Sprintf("content type %q: send application/json (charset=utf-8 at most)", truncate(ct, 64))}
	}
	return nil
}

// checkStrict walks the JSON value in data against the Go type t: every
// object key must be unique and, for a struct, be one of its JSON field
// names exactly. Values of the wrong kind are left to json.Unmarshal,
// which names them. data must be one well-formed JSON value (decodeStrict
// decodes it first): the walk reads it byte by byte, allocating only for
// what it reports, instead of through json.Decoder's tokens, which cost
// every peer call an allocation per key and per value.
func checkStrict(data []byte, t reflect.Type) error {
	w := strictWalk{b: data}
	if err := w.value(t, nil); err != nil {
		return err
	}
	if w.skipSpace(); w.i != len(w.b) {
		return w.malformed()
	}
	return nil
}

// jsonSpace is the white space JSON allows between tokens (RFC 8259).
const jsonSpace = " \t\n\r"

// strictWalk is checkStrict's position in its data.
type strictWalk struct {
	b []byte
	i int
}

// strictPath is where a value sits, built into a string only for an
// error: a key of the object its parent is, or an index of an array.
type strictPath struct {
	parent *strictPath
	key    string
	index  int // of an array, when isIdx
	isIdx  bool
}

func (p *strictPath) String() string {
	if p == nil {
		return ""
	}
	parent := p.parent.String()
	if p.isIdx {
		return fmt.Sprintf("%s[%d]", parent, p.index)
	}
	return joinPath(parent, p.key)
}

// errStrictMalformed: data was not the well-formed JSON checkStrict
// requires (a caller's mistake, not the client's).
var errStrictMalformed = errors.New("malformed JSON")

func (w *strictWalk) malformed() error {
	return fmt.Errorf("%w at byte %d", errStrictMalformed, w.i)
}

func (w *strictWalk) skipSpace() {
	for w.i < len(w.b) && strings.IndexByte(jsonSpace, w.b[w.i]) >= 0 {
		w.i++
	}
}

// next skips white space and returns the byte there, 0 at the end.
func (w *strictWalk) next() byte {
	w.skipSpace()
	if w.i >= len(w.b) {
		return 0
	}
	return w.b[w.i]
}

func (w *strictWalk) value(t reflect.Type, path *strictPath) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch w.next() {
	case '{':
		return w.object(t, path)
	case '[':
		return w.array(t, path)
	case '"':
		_, _, err := w.str()
		return err
	case 0:
		return w.malformed()
	}
	// A number, true, false or null: up to the next delimiter.
	for w.i < len(w.b) && strings.IndexByte(",}]"+jsonSpace, w.b[w.i]) < 0 {
		w.i++
	}
	return nil
}

// str reads the string at w.i: its bytes as written, and whether they
// must be unescaped (escapes, or bytes beyond ASCII, which json.Decoder
// reads as it reads invalid UTF-8).
func (w *strictWalk) str() (raw []byte, decode bool, err error) {
	start := w.i
	w.i++ // the opening quote
	for w.i < len(w.b) {
		switch c := w.b[w.i]; {
		case c == '"':
			w.i++
			return w.b[start:w.i], decode, nil
		case c == '\\':
			decode = true
			w.i += 2
		case c >= 0x80:
			decode = true
			w.i++
		default:
			w.i++
		}
	}
	return nil, false, w.malformed()
}

// key is the object key at w.i, as json.Decoder reads it.
func (w *strictWalk) key() (string, error) {
	if w.next() != '"' {
		return "", w.malformed()
	}
	raw, decode, err := w.str()
	if err != nil {
		return "", err
	}
	if !decode {
		return string(raw[1 : len(raw)-1]), nil
	}
	var k string
	if err := json.Unmarshal(raw, &k); err != nil {
		return "", err
	}
	return k, nil
}

func (w *strictWalk) object(t reflect.Type, path *strictPath) error {
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
	w.i++ // '{'
	if w.next() == '}' {
		w.i++
		return nil
	}
	var (
		seen    []string        // the keys so far, while few
		seenSet map[string]bool // past strictSeenList
	)
	for {
		key, err := w.key()
		if err != nil {
			return err
		}
		if w.next() != ':' {
			return w.malformed()
		}
		w.i++
		here := &strictPath{parent: path, key: key}
		dup := seenSet[key]
		if seenSet == nil {
			dup = slices.Contains(seen, key)
			if seen = append(seen, key); len(seen) > strictSeenList {
				seenSet = make(map[string]bool, 2*len(seen))
				for _, k := range seen {
					seenSet[k] = true
				}
			}
		} else {
			seenSet[key] = true
		}
		if dup {
			where := truncate(here.String(), 64)
			return Invalid(where, "field %q appears twice", where)
		}
		next := elem
		if fields != nil {
			ft, known := fields[key]
			if !known {
				return unknownField(here.String(), key, fields)
			}
			next = ft
		}
		if err := w.value(next, here); err != nil {
			return err
		}
		switch w.next() {
		case ',':
			w.i++
		case '}':
			w.i++
			return nil
		default:
			return w.malformed()
		}
	}
}

// strictSeenList is how many keys of one object are compared one by one
// before they go into a set.
const strictSeenList = 16

func (w *strictWalk) array(t reflect.Type, path *strictPath) error {
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	w.i++ // '['
	if w.next() == ']' {
		w.i++
		return nil
	}
	for i := 0; ; i++ {
		if err := w.value(elem, &strictPath{parent: path, index: i, isIdx: true}); err != nil {
			return err
		}
		switch w.next() {
		case ',':
			w.i++
		case ']':
			w.i++
			return nil
		default:
			return w.malformed()
		}
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// unknownField names a key that is not a field, and the field it differs
// from only in case, if any.
func unknownField(where, key string, fields map[string]reflect.Type) error {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return Invalid(truncate(where, 64), "unknown field %q: field names are case-sensitive, did you mean %q?", truncate(where, 64), name)
		}
	}
	return Invalid(truncate(where, 64), "unknown field %q", truncate(where, 64))
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields maps the JSON names of t's fields (embedded structs flattened)
// to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				m[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}

// decodeStrict is decode's body: content type, size, strict keys, then
// json.Decoder with unknown fields refused and exactly one value.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) error {
	if err := checkContentType(r.Header.Get("Content-Type")); err != nil {
		return err
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return decodeError(err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Invalid("", "empty request body: send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	// Only JSON's white space may follow (read in place: the decoder's
	// Token would grow its buffer to find the end).
	if len(bytes.TrimLeft(data[dec.InputOffset():], jsonSpace)) != 0 {
		return Invalid("", "request body holds more than one JSON value")
	}
	if trimmed := bytes.TrimSpace(data); trimmed[0] != '{' {
		return Invalid("", "request body is %s: send a JSON object", truncate(string(trimmed), 16))
	}
	// The body is one well-formed value of the right types: now the keys.
	if err := checkStrict(data, reflect.TypeOf(v)); err != nil {
		var e *Error
		if errors.As(err, &e) {
			return e
		}
		return Invalid("", "malformed request: %v", err)
	}
	return nil
}
