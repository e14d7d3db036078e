package names

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestStoreLogs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.db")
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if first, _ := s.FirstIndex(); first != 0 {
		t.Fatalf("first index of an empty log %d", first)
	}
	at := time.Unix(1700000000, 123)
	var logs []*raft.Log
	for i := uint64(3); i <= 9; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: []byte{byte(i)}, Extensions: []byte("x"), AppendedAt: at})
	}
	logs = append(logs, &raft.Log{Index: 10, Term: 3, Type: raft.LogNoop})
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	// One durable write per append: its fdatasync (the first also syncs
	// the directory its segment was created in).
	n := s.Commits()
	if err := s.StoreLogs([]*raft.Log{{Index: 11, Term: 3, Type: raft.LogNoop}}); err != nil {
		t.Fatal(err)
	}
	if d := s.Commits() - n; d != 1 {
		t.Fatalf("%d durable writes for one append", d)
	}
	logs = append(logs, &raft.Log{Index: 11, Term: 3, Type: raft.LogNoop})
	if err := s.DeleteRange(3, 4); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 5 || last != 11 {
		t.Fatalf("indexes %d..%d, want 5..11", first, last)
	}
	for _, want := range logs[2:] {
		var got raft.Log
		if err := s.GetLog(want.Index, &got); err != nil {
			t.Fatal(err)
		}
		same := got.Index == want.Index && got.Term == want.Term && got.Type == want.Type &&
			reflect.DeepEqual(got.Data, want.Data) && reflect.DeepEqual(got.Extensions, want.Extensions) &&
			got.AppendedAt.Equal(want.AppendedAt)
		if !same {
			t.Fatalf("entry %d: %+v, want %+v", want.Index, got, *want)
		}
	}
	var l raft.Log
	if err := s.GetLog(4, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("deleted entry: %v", err)
	}
}

func TestStoreStable(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "names.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// raft tells a missing key from a failure by this text.
	if _, err := s.Get([]byte("k")); err == nil || err.Error() != "not found" {
		t.Fatalf("missing key: %v", err)
	}
	if _, err := s.GetUint64([]byte("n")); err == nil || err.Error() != "not found" {
		t.Fatalf("missing number: %v", err)
	}
	if err := s.SetUint64([]byte("n"), 42); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.GetUint64([]byte("n")); n != 42 {
		t.Fatalf("number %d", n)
	}
	if v, _ := s.Get([]byte("k")); string(v) != "v" {
		t.Fatalf("value %q", v)
	}
	if _, err := s.GetUint64([]byte("k")); err == nil {
		t.Fatal("a one-byte value read as a number")
	}
}

func TestDecodeLogRefusesDamage(t *testing.T) {
	good := encodeLog(&raft.Log{Term: 1, Type: raft.LogCommand, Data: []byte("abc")})
	var l raft.Log
	if err := decodeLog(good, &l); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(good); i++ {
		if err := decodeLog(good[:i], &l); err == nil {
			t.Errorf("truncated to %d bytes: decoded", i)
		}
	}
	if err := decodeLog(append(append([]byte(nil), good...), 0), &l); err == nil {
		t.Error("trailing byte: decoded")
	}
	if err := decodeLog(append([]byte{9}, good[1:]...), &l); err == nil {
		t.Error("unknown format: decoded")
	}
}
