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
	"strings"
	"sync"
)

// Request bodies are decoded strictly. encoding/json on its own matches
// field names case-insensitively ("GPUS" fills gpus) and lets the last of
// two equal keys win: a request that a proxy, a log or another decoder
// reads differently from the agent. checkStrict runs before decoding and
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
// which names them.
func checkStrict(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkValue(dec, t, "")
}

func walkValue(dec *json.Decoder, t reflect.Type, path string) error {
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
			if err := walkValue(dec, next, where); err != nil {
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
			if err := walkValue(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	return nil
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
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
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
