package controlplane_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
)

// TestStandalone runs a control plane the way a demo program would, with
// no testing.T, and checks that cleanups run on success and on Fatal. It is
// also a second Start in the same process, which must work as well as the
// first.
func TestStandalone(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	var out bytes.Buffer
	var dir string
	err := controlplane.NewStandalone("demo", &out).Run(func(tb controlplane.TB) {
		cp := controlplane.Start(tb, controlplane.Options{NoScheduler: true, NoClaimController: true})
		dir = cp.Dir()
		if _, err := cp.AddNode(ctx, "n1"); err != nil {
			tb.Fatal(err)
		}
		if _, err := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
			tb.Fatal(err)
		}
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("control plane directory %s left behind (%v)", dir, err)
	}
	if !strings.Contains(out.String(), "control plane up in") {
		t.Errorf("log output lacks the start-up line:\n%s", out.String())
	}

	ran := false
	err = controlplane.NewStandalone("fatal", &out).Run(func(tb controlplane.TB) {
		tb.Cleanup(func() { ran = true })
		tb.Fatal("boom")
		t.Error("Fatal returned")
	})
	if err == nil || !ran {
		t.Errorf("after Fatal: Run = %v, cleanup ran = %v; want an error and the cleanup", err, ran)
	}
}
