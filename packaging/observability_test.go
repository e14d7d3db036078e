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

// metricLabels is the agent's metric contract (DESIGN.md, metrics/): every
// name the dashboard and the alerts may use, with the labels it carries
// besides the scrape target's job and instance. nil: labels not pinned.
var metricLabels = map[string][]string{
	"gpuherd_build_info":                        nil,
	"gpuherd_agent_phase":                       {"phase"},
	"gpuherd_claim_duplicates":                  nil,
	"gpuherd_gpu_info":                          {"pci_address", "model", "device_id", "iommu_group", "numa_node", "uuid"},
	"gpuherd_gpu_state":                         {"pci_address", "model", "state"},
	"gpuherd_gpu_driver_info":                   {"pci_address", "model", "driver"},
	"gpuherd_gpu_healthy":                       {"pci_address", "model"},
	"gpuherd_gpu_unusable_info":                 {"pci_address", "model", "reason", "blocking_device"},
	"gpuherd_model_gpus_unusable":               {"model"},
	"gpuherd_cluster_model_gpus_unusable":       {"model"},
	"gpuherd_model_gpus":                        {"model"},
	"gpuherd_model_gpus_free":                   {"model"},
	"gpuherd_model_gpus_healthy":                {"model"},
	"gpuherd_cluster_model_gpus":                {"model"},
	"gpuherd_cluster_model_gpus_free":           {"model"},
	"gpuherd_cluster_model_gpus_healthy":        {"model"},
	"gpuherd_cluster_model_max_free_per_server": {"model"},
	"gpuherd_claims_total":                      {"outcome"},
	"gpuherd_claim_duration_seconds":            {},
	"gpuherd_reservations_total":                {"outcome"},
	"gpuherd_claim_lookups_total":               {"path"},
	"gpuherd_vfio_operation_duration_seconds":   {"op"},
	"gpuherd_vfio_operation_errors_total":       {"op"},
	"gpuherd_driver_changes_unexpected_total":   {"pci_address", "driver"},
	"gpuherd_claims_adopted_total":              {},
	"gpuherd_releases_refused_in_use_total":     {},
	"gpuherd_gossip_members":                    {"state"},
	"gpuherd_gossip_health_score":               {},
	"gpuherd_names_role":                        {"role"},
	"gpuherd_names_leader":                      {},
	"gpuherd_names_last_contact_seconds":        {},
	"gpuherd_names_halted":                      {},
	"gpuherd_names_registries":                  {},
	"gpuherd_ledger_claims":                     {"state"},
	"gpuherd_ledger_file_size_bytes":            {},
	"gpuherd_storage_errors_total":              {"store", "op"},
	"gpuherd_storage_failing":                   {"store"},
	"gpuherd_storage_write_duration_seconds":    {"store", "op"},
	"gpuherd_gpu_temperature_celsius":           {"pci_address", "model"},
	"gpuherd_gpu_power_watts":                   {"pci_address", "model"},
	"gpuherd_gpu_energy_joules_total":           {"pci_address", "model"},
	"gpuherd_gpu_memory_used_bytes":             {"pci_address", "model"},
	"gpuherd_gpu_memory_total_bytes":            {"pci_address", "model"},
	"gpuherd_gpu_utilization_ratio":             {"pci_address", "model"},
	"gpuherd_gpu_xid_errors_total":              {"pci_address", "model", "xid"},
	"up":                                        {}, // Prometheus itself
	"probe_success":                             {}, // blackbox exporter probing /readyz
}

var histograms = []string{"gpuherd_claim_duration_seconds", "gpuherd_vfio_operation_duration_seconds", "gpuherd_storage_write_duration_seconds"}

// targetLabels come from the scrape, "le" from histogram buckets.
var targetLabels = []string{"job", "instance", "le"}

var (
	metricName = regexp.MustCompile(`\b(gpuherd_[a-z0-9_]+|up|probe_success)\b(\{[^}]*\})?`)
	matcher    = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)`)
	grouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	// Functions and keywords that look like metric names.
	promqlWords = []string{"by", "on", "without", "ignoring", "bool", "and", "or", "unless"}
)

// checkExpr reports every metric name or label in a PromQL expression that
// the agent does not export.
func checkExpr(t *testing.T, where, expr string) []string {
	t.Helper()
	var used []string
	labels := map[string]bool{}
	for _, l := range targetLabels {
		labels[l] = true
	}
	for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		base := name
		for _, h := range histograms {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if name == h+suffix {
					base = h
				}
			}
		}
		known, ok := metricLabels[base]
		if !ok {
			t.Errorf("%s: unknown metric %s in %q", where, name, expr)
			continue
		}
		used = append(used, base)
		for _, l := range known {
			labels[l] = true
		}
		for _, mm := range matcher.FindAllStringSubmatch(m[2], -1) {
			if known != nil && !slices.Contains(known, mm[1]) && !slices.Contains(targetLabels, mm[1]) {
				t.Errorf("%s: %s has no label %s (%q)", where, name, mm[1], expr)
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !labels[l] && !slices.Contains(promqlWords, l) {
				t.Errorf("%s: groups by %s, which none of its metrics carries (%q)", where, l, expr)
			}
		}
	}
	return used
}

func TestAlertRulesUseExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("prometheus/gpuherd-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExpr(t, r.Alert, r.Expr)
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
		}
	}
	slices.Sort(alerts)
	want := []string{"GpuherdAgentDown", "GpuherdBindFailures", "GpuherdClaimDuplicates", "GpuherdDriverChangedBehindLedger", "GpuherdGPUUnhealthy", "GpuherdGPUUnusable", "GpuherdGossipMembersDead", "GpuherdModelExhausted", "GpuherdNameRegistryNoLeader", "GpuherdNameRegistrySplit", "GpuherdNoReadiness", "GpuherdStorageFailing"}
	if !slices.Equal(alerts, want) {
		t.Errorf("alerts = %v, want %v", alerts, want)
	}
}

// panel is the part of a Grafana panel this test reads.
type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func TestDashboardUsesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("grafana/gpuherd-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Schema     int     `json:"schemaVersion"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.UID == "" || dash.Title == "" || dash.Schema == 0 {
		t.Fatalf("dashboard needs uid, title and schemaVersion (got %q, %q, %d)", dash.UID, dash.Title, dash.Schema)
	}
	used := map[string]bool{}
	for _, v := range dash.Templating.List {
		for _, m := range checkExpr(t, "variable "+v.Name, v.Definition) {
			used[m] = true
		}
	}
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup {
				t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
			}
			ids[p.ID] = p.Title
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if refs[tg.RefID] {
					t.Errorf("panel %q: refId %s twice", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				for _, m := range checkExpr(t, "panel "+p.Title, tg.Expr) {
					used[m] = true
				}
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)

	// What the dashboard promises to show.
	for _, m := range []string{
		"gpuherd_cluster_model_gpus", "gpuherd_cluster_model_gpus_free", "gpuherd_model_gpus", "gpuherd_model_gpus_free",
		"gpuherd_gpu_state", "gpuherd_gpu_temperature_celsius", "gpuherd_gpu_power_watts", "gpuherd_gpu_utilization_ratio",
		"gpuherd_claim_duration_seconds", "gpuherd_claims_total", "gpuherd_vfio_operation_duration_seconds",
		"gpuherd_vfio_operation_errors_total", "gpuherd_gossip_members",
		"gpuherd_gpu_unusable_info", "gpuherd_model_gpus_unusable", "gpuherd_cluster_model_gpus_unusable",
	} {
		if !used[m] {
			t.Errorf("the dashboard does not show %s", m)
		}
	}
}
