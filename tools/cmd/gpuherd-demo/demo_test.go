package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemo builds gpuherd and runs the whole demo against it: four agents,
// every step of the scenario and its checks.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four agents; skipped with -short")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH to build gpuherd with")
	}
	bin := filepath.Join(t.TempDir(), "gpuherd")
	// Built in the agent's own module (three levels up): the tools module
	// does not carry the agent binary's dependencies (cobra) in its go.sum.
	build := exec.Command(goTool, "build", "-ldflags", "-extldflags=-Wl,-z,lazy", "-o", bin, "./cmd/gpuherd")
	build.Dir = filepath.Join("..", "..", "..")
	build.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" {
		// go-nvml's cgo header is full of deprecation warnings.
		build.Env = append(build.Env, "CGO_CFLAGS=-Wno-deprecated-declarations")
	}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building gpuherd: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	code := mainCode(ctx, []string{"--gpuherd", bin}, &out, &out)
	if code != exitOK {
		t.Fatalf("demo exited %d, want 0; its output:\n%s", code, out.String())
	}
	t.Logf("demo took %s", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{"The following GPUs are not available: ", "[exit status 3]", "Unavailable", "every step behaved as expected"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the transcript lacks %q", want)
		}
	}
}

func TestMissingBinary(t *testing.T) {
	var out bytes.Buffer
	code := mainCode(t.Context(), []string{"--gpuherd", filepath.Join(t.TempDir(), "nope")}, &out, &out)
	if code != exitFailed || !strings.Contains(out.String(), "make build") {
		t.Errorf("exit %d, output %q; want %d and a hint to build gpuherd", code, out.String(), exitFailed)
	}
}

func TestQuote(t *testing.T) {
	tr := &transcript{dir: "/tmp/d"}
	for in, want := range map[string]string{
		"claim":              "claim",
		"H100 80GB:4":        `"H100 80GB:4"`,
		"L40S:2":             "L40S:2",
		"/tmp/d/a/api.sock":  "$D/a/api.sock",
		"/tmp/d":             "$D",
		"/tmp/dx/api.sock":   "/tmp/dx/api.sock",
		"/tmp/d/my dir/sock": `"$D/my dir/sock"`,
		`say "$HOME"`:        `"say \"\$HOME\""`,
		"tenant=acme":        "tenant=acme",
	} {
		if got := tr.quote(in); got != want {
			t.Errorf("quote(%q) = %s, want %s", in, got, want)
		}
	}
}
