package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Output formats of -o. table and wide are for people (wide adds columns,
// as kubectl's does); json and yaml are for programs and carry the same
// fields under the same names.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

var outputFormats = []string{outTable, outWide, outJSON, outYAML}

// structured reports whether the output is for programs.
func structured(output string) bool { return output == outJSON || output == outYAML }

// encode writes v as JSON or YAML. YAML is made from the JSON encoding, so
// that both formats use the same field names in the same order.
func encode(w io.Writer, output string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if output == outJSON {
		var buf bytes.Buffer
		if err := json.Indent(&buf, data, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	node, err := yamlNode(dec)
	if err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(node); err != nil {
		return err
	}
	return enc.Close()
}

// yamlNode reads one JSON value from dec as a YAML node, keeping the order
// of object keys (a map would sort them).
func yamlNode(dec *json.Decoder) (*yaml.Node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := yamlNode(dec)
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k.(string)}, v)
			}
			_, err := dec.Token() // '}'
			return n, err
		case '[':
			n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			for dec.More() {
				v, err := yamlNode(dec)
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, v)
			}
			_, err := dec.Token() // ']'
			return n, err
		}
		return nil, fmt.Errorf("unexpected JSON delimiter %v", t)
	case string:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: t}, nil
	case json.Number:
		tag := "!!int"
		if strings.ContainsAny(t.String(), ".eE") {
			tag = "!!float"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: t.String()}, nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(t)}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// newTable is the tabwriter of every table.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// esc makes one field safe for a table cell: control characters (tab and
// newline included: they would forge columns and lines), C1 controls,
// bidirectional overrides and invalid UTF-8 are written as Go escapes.
// Names and reasons come from other servers and from API callers; a model
// name holding "\x1b[2J" must not clear the operator's screen.
func esc(s string) string {
	if safe(s, false) {
		return s
	}
	return escape(s, false)
}

// safe reports whether s needs no escaping (keepLayout: tab and newline
// are allowed).
func safe(s string, keepLayout bool) bool {
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r, keepLayout) {
			return false
		}
	}
	return true
}

func unsafeRune(r rune, keepLayout bool) bool {
	switch {
	case keepLayout && (r == '\t' || r == '\n'):
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x2028, r == 0x2029:
		return true // bidirectional overrides and line separators
	}
	return false
}

func escape(s string, keepLayout bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !unsafeRune(r, keepLayout):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

// escapingWriter passes text to w with every control character but tab and
// newline escaped: the last line of defence for text output (a table
// field that was not escaped, an error message quoting a remote server).
// A rune split across two writes is held until it is complete.
type escapingWriter struct {
	mu      sync.Mutex
	w       io.Writer
	pending []byte
}

func (e *escapingWriter) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	data := append(e.pending, p...)
	e.pending = nil
	// Hold back an incomplete rune at the end.
	if cut := incompleteTail(data); cut > 0 {
		e.pending = append([]byte(nil), data[len(data)-cut:]...)
		data = data[:len(data)-cut]
	}
	s := string(data)
	if !safe(s, true) {
		s = escape(s, true)
	}
	if _, err := io.WriteString(e.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// incompleteTail is how many bytes at the end of b start a UTF-8 sequence
// that is not complete yet.
func incompleteTail(b []byte) int {
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			return 0
		}
		if c >= 0xc0 { // the leading byte of the last rune
			if !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// Flush writes a held, incomplete rune as escaped bytes.
func (e *escapingWriter) Flush() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.pending) == 0 {
		return nil
	}
	s := escape(string(e.pending), true)
	e.pending = nil
	_, err := io.WriteString(e.w, s)
	return err
}

// errorBody is what a failed command writes on stderr with -o json or
// yaml: the API's error shape, for local errors too.
type errorBody struct {
	Error *cliError `json:"error"`
}

// cliError is the API's error with the fields a local failure needs.
type cliError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// The API error's other fields (field, missing, alternatives, ...),
	// when the agent answered.
	api map[string]json.RawMessage
}

func (c *cliError) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"code":`)
	code, _ := json.Marshal(c.Code)
	buf.Write(code)
	buf.WriteString(`,"message":`)
	msg, _ := json.Marshal(c.Message)
	buf.Write(msg)
	for _, k := range apiErrorExtras {
		if v, ok := c.api[k]; ok {
			name, _ := json.Marshal(k)
			buf.WriteByte(',')
			buf.Write(name)
			buf.WriteByte(':')
			buf.Write(v)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// apiErrorExtras are the fields of api.Error besides code and message, in
// the order the API writes them.
var apiErrorExtras = []string{"field", "missing", "known_models", "alternatives"}

// writeError writes err on w in the structured format.
func writeError(w io.Writer, output string, err error) {
	ce := &cliError{Code: errorCode(err), Message: err.Error()}
	if ae := asAPIError(err); ae != nil {
		if data, mErr := json.Marshal(ae); mErr == nil {
			_ = json.Unmarshal(data, &ce.api)
		}
		ce.Message = ae.Message
	}
	_ = encode(w, output, errorBody{Error: ce})
}

// asAPIError is the agent's error inside err, if any.
func asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}
