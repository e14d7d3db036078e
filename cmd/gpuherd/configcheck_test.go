package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gpuherd.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigCheckCommand(t *testing.T) {
	dir := t.TempDir()
	good := writeConfig(t, "node_name: gpu-1\ndata_dir: "+dir+"/data\nsocket: "+dir+"/gpuherd.sock\noffered_models: [l40s, \"H100 80GB\"]\n")
	r := gpuherd(t, "/nonexistent.sock", "config", "check", "--config", good)
	if r.code != exitOK || !strings.Contains(r.stdout, ": ok") {
		t.Errorf("a good file: %s", r)
	}

	bad := writeConfig(t, "metrics_adr: :9465\n")
	r = gpuherd(t, "/nonexistent.sock", "config", "check", "--config", bad)
	if r.code != exitError || !strings.Contains(r.stdout, "unknown key metrics_adr (line 1): did you mean metrics_addr?") {
		t.Errorf("a typo: %s", r)
	}

	bad = writeConfig(t, "offered_models: [l40s, Z9000]\nsocket_group: gpuherd-no-such-group\nsocket: "+dir+"/s.sock\ndata_dir: "+dir+"/d\n")
	r = gpuherd(t, "/nonexistent.sock", "config", "check", "--config", bad, "-o", "json")
	var rep configReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	if r.code != exitError || rep.OK || len(rep.Problems) != 1 || rep.Problems[0].Key != "offered_models" || !strings.Contains(rep.Problems[0].Message, "Z9000") {
		t.Errorf("Z9000: %s", r)
	}
}

// `gpuherd inventory --config` applies the configuration's deny list, so
// it shows what the agent would manage.
func TestInventoryAppliesTheConfigDenyList(t *testing.T) {
	cfg := writeConfig(t, "simulate: mixed\ndeny_devices: [\"0000:e1:00.0\"]\n")
	r := gpuherd(t, "/nonexistent.sock", "inventory", "--config", cfg, "-o", "json")
	var rep struct {
		GPUs []struct {
			Address string `json:"address"`
		} `json:"gpus"`
		Denied []string `json:"denied"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	if len(rep.GPUs) != 5 || len(rep.Denied) != 1 || rep.Denied[0] != "0000:e1:00.0" {
		t.Errorf("inventory with a deny list: %d GPUs, denied %v; want 5 and [0000:e1:00.0]", len(rep.GPUs), rep.Denied)
	}
	for _, g := range rep.GPUs {
		if g.Address == "0000:e1:00.0" {
			t.Error("the denied GPU is listed")
		}
	}
}
