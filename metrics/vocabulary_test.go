package metrics

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/events"
)

// Every value of the protocol's event vocabulary (agent/events) is a
// series from the start, at 0, and is named where the metric is
// documented (doc.go, which `go doc` and the README point to). A value
// added to the vocabulary and forgotten here fails this test.
func TestEveryEventValueReachesTheMetricsAndTheDocs(t *testing.T) {
	m := New(SourceFunc(func() Snapshot { return Snapshot{} }))
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string][]string{} // "family label" → values
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				k := mf.GetName() + " " + l.GetName()
				series[k] = append(series[k], l.GetValue())
			}
		}
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct {
		family, label string
		values        []string
	}{
		{"gpuherd_claims_total", "outcome", events.ClaimOutcomes()},
		{"gpuherd_reservations_total", "outcome", events.ReservationOutcomes()},
		{"gpuherd_claim_lookups_total", "path", events.LookupPaths()},
		{"gpuherd_vfio_operation_errors_total", "op", events.VFIOOps()},
		{"gpuherd_vfio_operation_duration_seconds", "op", events.VFIOOps()},
	} {
		para := docParagraph(string(doc), v.family)
		if para == "" {
			t.Errorf("doc.go does not document %s", v.family)
		}
		for _, val := range v.values {
			if !slices.Contains(series[v.family+" "+v.label], val) {
				t.Errorf("%s{%s=%q} is not a series from the start", v.family, v.label, val)
			}
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(val) + `\b`).MatchString(para) {
				t.Errorf("doc.go's entry of %s does not name %s %q", v.family, v.label, val)
			}
		}
	}
}

// docParagraph is doc.go's entry of a metric family: from its name to the
// next entry or section.
func docParagraph(doc, family string) string {
	i := strings.Index(doc, "//\t"+family+"{")
	if i < 0 {
		return ""
	}
	rest := doc[i+len(family)+3:]
	if j := regexp.MustCompile(`\n//\tgpuherd_|\n// #|\n//\n// [A-Z]`).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}
