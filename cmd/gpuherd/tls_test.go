package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/pki"
)

// runTLS runs a gpuherd command line and returns its exit code and output.
// It goes through run, like the binary, once the root knows "tls"; until
// then it runs newTLSCmd alone and maps the error as run would.
func runTLS(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	if c, _, err := newRoot(&out, &errb).Find([]string{"tls"}); err == nil && c.Name() == "tls" {
		code = run(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	g := &globals{stdout: &out, stderr: &errb, output: "table"}
	if len(args) > 1 && args[0] == "-o" {
		g.output, args = args[1], args[2:]
	}
	if len(args) == 0 || args[0] != "tls" {
		t.Fatalf("runTLS: %q is not a tls command line", args)
	}
	cmd := newTLSCmd(g)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args[1:])
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		errb.WriteString("gpuherd: " + err.Error() + "\n")
		return exitCode(err), out.String(), errb.String()
	}
	return exitOK, out.String(), errb.String()
}

func TestTLSTestClusterInTwoCommands(t *testing.T) {
	base := t.TempDir()
	caDir, outDir := filepath.Join(base, "ca"), filepath.Join(base, "gpu-01")

	code, out, errOut := runTLS(t, "tls", "ca", "--dir", caDir, "--name", "lab CA", "--days", "400")
	if code != exitOK {
		t.Fatalf("tls ca: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{`Created CA "lab CA"`, filepath.Join(caDir, "ca.crt"), "gpuherd tls cert NODE --ca-dir " + caDir} {
		if !strings.Contains(out, want) {
			t.Errorf("tls ca output lacks %q:\n%s", want, out)
		}
	}
	checkFileMode(t, filepath.Join(caDir, "ca.crt"), 0o644)
	checkFileMode(t, filepath.Join(caDir, "ca.key"), 0o600)

	code, out, errOut = runTLS(t, "-o", "json", "tls", "cert", "gpu-01", "--ca-dir", caDir, "--out", outDir,
		"--host", "10.0.0.7", "--host", "gpu-01.lab.example,fd00::7", "--days", "7")
	if code != exitOK {
		t.Fatalf("tls cert: exit %d, stderr %q", code, errOut)
	}
	var res tlsCertResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("tls cert -o json: %v\n%s", err, out)
	}
	want := tlsAgentConfig{
		TLSCA:   filepath.Join(caDir, "ca.crt"),
		TLSCert: filepath.Join(outDir, "gpu-01.crt"),
		TLSKey:  filepath.Join(outDir, "gpu-01.key"),
	}
	if res.Config != want {
		t.Fatalf("agent_config = %+v, want %+v", res.Config, want)
	}
	if got := strings.Join(res.Names, ","); got != "gpu-01,gpu-01.lab.example,10.0.0.7,fd00::7" {
		t.Fatalf("names = %s", got)
	}
	checkFileMode(t, want.TLSCert, 0o644)
	checkFileMode(t, want.TLSKey, 0o600)

	// What it told us to configure is a working identity.
	if _, err := pki.ServerConfig(pki.Files{CA: want.TLSCA, Cert: want.TLSCert, Key: want.TLSKey}); err != nil {
		t.Fatalf("the printed agent config does not load: %v", err)
	}

	// The table form prints the same config keys for people.
	code, out, errOut = runTLS(t, "tls", "cert", "gpu-02", "--ca-dir", caDir, "--out", outDir)
	if code != exitOK {
		t.Fatalf("tls cert gpu-02: exit %d, stderr %q", code, errOut)
	}
	if !strings.Contains(errOut, "no --host given") {
		t.Errorf("tls cert without --host gave no note on stderr: %q", errOut)
	}
	for _, want := range []string{"tls_ca: " + want.TLSCA, "tls_cert: " + filepath.Join(outDir, "gpu-02.crt"), "tls_key: " + filepath.Join(outDir, "gpu-02.key")} {
		if !strings.Contains(out, want) {
			t.Errorf("tls cert output lacks %q:\n%s", want, out)
		}
	}
}

func TestTLSExitCodes(t *testing.T) {
	base := t.TempDir()
	caDir := filepath.Join(base, "ca")
	if code, _, errOut := runTLS(t, "tls", "ca", "--dir", caDir); code != exitOK {
		t.Fatalf("tls ca: exit %d: %s", code, errOut)
	}
	out := filepath.Join(base, "out")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"ca without --dir", []string{"tls", "ca"}, exitUsage, "--dir"},
		{"ca with zero days", []string{"tls", "ca", "--dir", filepath.Join(base, "x"), "--days", "0"}, exitUsage, "--days 0"},
		{"ca with a stray argument", []string{"tls", "ca", "extra", "--dir", filepath.Join(base, "y")}, exitUsage, "no arguments"},
		{"ca over an existing CA", []string{"tls", "ca", "--dir", caDir}, exitError, "refusing to overwrite"},
		{"tls alone", []string{"tls"}, exitUsage, "ca or cert"},
		{"unknown flag", []string{"tls", "ca", "--bogus"}, exitUsage, "unknown flag"},
		{"cert without node", []string{"tls", "cert", "--ca-dir", caDir, "--out", out}, exitUsage, "one node name"},
		{"cert with a bad node", []string{"tls", "cert", "GPU_01", "--ca-dir", caDir, "--out", out}, exitUsage, "NODE: node name"},
		{"cert without --ca-dir", []string{"tls", "cert", "gpu-01", "--out", out}, exitUsage, "--ca-dir"},
		{"cert without --out", []string{"tls", "cert", "gpu-01", "--ca-dir", caDir}, exitUsage, "--out"},
		{"cert with a bad host", []string{"tls", "cert", "gpu-01", "--ca-dir", caDir, "--out", out, "--host", "not_a_host"}, exitUsage, "--host"},
		{"cert with too many days", []string{"tls", "cert", "gpu-01", "--ca-dir", caDir, "--out", out, "--days", "99999"}, exitUsage, "--days"},
		{"cert outliving the CA", []string{"tls", "cert", "gpu-01", "--ca-dir", caDir, "--out", out, "--days", "4000"}, exitError, "after its CA"},
		{"cert from a missing CA", []string{"tls", "cert", "gpu-01", "--ca-dir", filepath.Join(base, "none"), "--out", out}, exitError, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runTLS(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.want)
			}
		})
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("failed commands created %s", out)
	}

	// Issuing twice refuses the second time and keeps the first pair.
	if code, _, errOut := runTLS(t, "tls", "cert", "gpu-01", "--ca-dir", caDir, "--out", out, "--host", "127.0.0.1"); code != exitOK {
		t.Fatalf("tls cert: exit %d: %s", code, errOut)
	}
	key := filepath.Join(out, "gpu-01.key")
	before, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runTLS(t, "tls", "cert", "gpu-01", "--ca-dir", caDir, "--out", out)
	if code != exitError || !strings.Contains(errOut, "refusing to overwrite") {
		t.Fatalf("second tls cert: exit %d, stderr %q", code, errOut)
	}
	if after, _ := os.ReadFile(key); !bytes.Equal(before, after) {
		t.Fatal("the refused command changed the key")
	}
}

func checkFileMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Fatalf("%s: mode %v, want %v", path, got, want)
	}
}
