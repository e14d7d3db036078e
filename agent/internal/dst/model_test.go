package dst

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/gpuherd/gpuherd/agent/names"
)

// TestNameModelRefuses: the porcupine model refuses histories the
// registry must never produce, and accepts the ones it may.
func TestNameModelRefuses(t *testing.T) {
	grant := func(req string, tok uint64) regOp {
		return regOp{In: regIn{Op: "acquire", Key: "vm-1", Caller: "gpu-a", Request: req, Now: 10 * time.Millisecond, Lease: 5 * time.Second},
			Out: names.Result{Code: names.CodeOK, Record: &names.Record{Kind: names.KindClaim, Name: "vm-1", State: names.StatePending, Caller: "gpu-a", Request: req, Token: tok}}}
	}
	confirm := func(tok uint64, code names.Code) regOp {
		return regOp{In: regIn{Op: "confirm", Key: "vm-1", Token: tok, Node: "gpu-b", Now: 20 * time.Millisecond}, Out: names.Result{Code: code}}
	}
	for _, tc := range []struct {
		name  string
		h     []regOp
		legal bool
	}{
		{"grant then confirm", []regOp{grant("r1", 5), confirm(5, names.CodeOK)}, true},
		{"two grants to two requests", []regOp{grant("r1", 5), grant("r2", 6)}, false},
		{"token going back", []regOp{grant("r1", 5), confirm(5, names.CodeOK),
			{In: regIn{Op: "release", Key: "vm-1", Token: 5, Node: "gpu-b", Now: 30 * time.Millisecond}, Out: names.Result{Code: names.CodeOK}}, grant("r1", 4)}, false},
		{"an old token confirmed", []regOp{grant("r1", 5), confirm(4, names.CodeOK)}, false},
		{"a confirm of a free name", []regOp{confirm(5, names.CodeOK)}, false},
		{"a lost grant learnt from its confirm", []regOp{{In: grant("r1", 0).In, Unknown: true}, confirm(7, names.CodeOK)}, true},
		{"a lost grant learnt from a refusal", []regOp{{In: grant("r1", 0).In, Unknown: true},
			{In: regIn{Op: "release", Key: "vm-1", Token: 3, Node: "gpu-a", Now: 30 * time.Millisecond}, Out: names.Result{Code: names.CodeStale, Record: &names.Record{Token: 8}}},
			confirm(8, names.CodeOK)}, true},
		{"a refusal showing an old token", []regOp{grant("r1", 5), {In: grant("r1", 0).In, Unknown: true},
			{In: regIn{Op: "release", Key: "vm-1", Token: 3, Node: "gpu-a", Now: 30 * time.Millisecond}, Out: names.Result{Code: names.CodeStale, Record: &names.Record{Token: 4}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.h {
				tc.h[i].Call, tc.h[i].Return = uint64(2*i+1), uint64(2*i+2)
			}
			res, _ := checkHistory(tc.h, time.Second)
			if got := res == porcupine.Ok; got != tc.legal {
				t.Fatalf("history judged %v, want legal=%v", res, tc.legal)
			}
		})
	}
}
