package names

import (
	"bytes"
	"encoding/json"
	"testing"
)

// decodeMessage refuses data after a command exactly where json.Decoder's
// More would have said more follows: servers of two versions must refuse
// the same log entries.
func TestDecodeMessageRefusesTrailingDataAsMoreDid(t *testing.T) {
	good, err := encodeMessage(messageStamp, &stampMessage{Key: Group("pool-1"), Token: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := decodeMessage(good); err != nil {
		t.Fatalf("a command as written: %v", err)
	}
	for _, tail := range []string{"", " ", "\n\t\r ", "}", " ]", "]x", "x", " 1", "{}", "\u00a0", "\x00", ` "s"`, "\n{"} {
		b := append(bytes.Clone(good), tail...)
		_, _, err := decodeMessage(b)
		dec := json.NewDecoder(bytes.NewReader(b[2:]))
		var m stampMessage
		if derr := dec.Decode(&m); derr != nil {
			t.Fatal(derr)
		}
		if more := dec.More(); (err != nil) != more {
			t.Errorf("tail %q: decodeMessage says %v, More says %v", tail, err, more)
		}
	}
}
