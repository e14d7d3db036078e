package groups

import (
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

func TestGroupSpecRoundTrip(t *testing.T) {
	items := []api.Item{{Model: "NVIDIA L40S", Count: 2}, {Model: "NVIDIA A100 80GB", Count: 1}}
	s, err := groupSpec(3, items)
	if err != nil || s != "group/1;nodes=3;gpus=NVIDIA A100 80GB:1,NVIDIA L40S:2" {
		t.Fatalf("spec %q, %v", s, err)
	}
	n, got, err := parseGroupSpec(s)
	if err != nil || n != 3 || !api.SameItems(got, items) {
		t.Fatalf("parsed %d %v %v", n, got, err)
	}
	if s, _ := groupSpec(2, nil); s != "group/1;nodes=2;gpus=" {
		t.Fatalf("no GPUs: %q", s)
	}
	for _, bad := range []string{"", "group/2;nodes=1;gpus=", "group/1;nodes=0;gpus=", "group/1;nodes=1;gpus=L40S", "group/1;nodes=1;gpus=L40S:0"} {
		if _, _, err := parseGroupSpec(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
