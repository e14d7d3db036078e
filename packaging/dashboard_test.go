package packaging_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type dashboard struct {
	Panels []struct {
		Type            string                  `json:"type"`
		Title           string                  `json:"title"`
		Targets         []struct{ Expr string } `json:"targets"`
		Transformations []struct {
			ID      string         `json:"id"`
			Options map[string]any `json:"options"`
		} `json:"transformations"`
	} `json:"panels"`
	Templating struct {
		List []struct{ Name string } `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("grafana/gpuherd-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// The per-GPU table joins its queries on server and PCI address together:
// joined on the address alone, two identical servers merged into one row.
func TestDashboardGPUTableKeysByServerAndAddress(t *testing.T) {
	d := readDashboard(t)
	found := false
	for _, p := range d.Panels {
		if p.Type != "table" || p.Title != "GPUs" {
			continue
		}
		found = true
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, `label_join(`) || !strings.Contains(tg.Expr, `"gpu", " ", "instance", "pci_address")`) {
				t.Errorf("query %q does not build the gpu key from instance and pci_address", tg.Expr)
			}
		}
		for _, tr := range p.Transformations {
			if tr.ID == "joinByField" && tr.Options["byField"] != "gpu" {
				t.Errorf("the table joins by %v, want gpu (instance and pci_address)", tr.Options["byField"])
			}
		}
	}
	if !found {
		t.Fatal("no GPUs table")
	}
}

// Every dashboard variable the operations guide names exists.
func TestDocsNameTheDashboardVariables(t *testing.T) {
	d := readDashboard(t)
	var names []string
	for _, v := range d.Templating.List {
		names = append(names, v.Name)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)gpuherd-dashboard\.json.{0,300}?are its\s+variables`).Find(doc)
	if m == nil {
		t.Fatal("docs/operations.md no longer names the dashboard's variables")
	}
	for _, v := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(string(m), -1) {
		if !slices.Contains(names, v[1]) {
			t.Errorf("docs/operations.md names variable %q; the dashboard has %v", v[1], names)
		}
	}
}

// The DCGM join rules use gpuherd's metrics as exported, and the relabel
// rule in their comment turns dcgm-exporter's pci_bus_id into gpuherd's
// pci_address.
func TestDCGMJoinRules(t *testing.T) {
	data, err := os.ReadFile("prometheus/gpuherd-dcgm.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			n++
			if !strings.HasPrefix(r.Record, "gpuherd:") {
				t.Errorf("recording rule %s: name it gpuherd:...", r.Record)
			}
			// node is added by the scrape configuration the file documents.
			checkExpr(t, r.Record, strings.ReplaceAll(r.Expr, "node, ", ""))
		}
	}
	if n == 0 {
		t.Fatal("no recording rule")
	}
	re := regexp.MustCompile(`regex: '(\[0-9A-Fa-f\][^']+)'`).FindSubmatch(data)
	if re == nil {
		t.Fatal("no pci_bus_id relabel regex in the rules file's comment")
	}
	// Prometheus anchors relabel regexes and replaces with $1.
	anchored := regexp.MustCompile("^(?:" + string(re[1]) + ")$")
	for in, want := range map[string]string{"00000000:3B:00.0": "0000:3b:00.0", "00000001:C1:00.1": "0001:c1:00.1"} {
		m := anchored.FindStringSubmatch(in)
		if m == nil || strings.ToLower(m[1]) != want {
			t.Errorf("relabel of %s: %v, want %s", in, m, want)
		}
	}
}
