package dra

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A checkpoint entry the driver never writes (a UID that would lead the
// CDI spec's removal out of its directory, a name the API server does not
// make, no claim) is refused at open, naming the file and the entry; a
// good one opens.
func TestCheckpointRefusesDamagedEntries(t *testing.T) {
	good := `{"namespace":"vms","name":"vm-1","claim":"k8s.vms.vm-1.0f1e2d3c","devices":["0000:3b:00.0"]}`
	for name, tc := range map[string]struct {
		body, want string
	}{
		"good":          {`{"version":1,"prepared":{"0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9":` + good + `}}`, ""},
		"path as UID":   {`{"version":1,"prepared":{"../../../etc/passwd":` + good + `}}`, `UID "../../../etc/passwd"`},
		"bad namespace": {`{"version":1,"prepared":{"0f1e2d3c":{"namespace":"../x","name":"vm-1","claim":"c"}}}`, `ResourceClaim "../x"/"vm-1"`},
		"no claim":      {`{"version":1,"prepared":{"0f1e2d3c":{"namespace":"vms","name":"vm-1"}}}`, `claim ""`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, checkpointFile), []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			cp, err := openCheckpoint(dir)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("a good checkpoint: %v", err)
			case tc.want == "":
				if len(cp.uids()) != 1 {
					t.Fatalf("a good checkpoint opened with %v", cp.uids())
				}
			case err == nil:
				t.Fatalf("opened, with %v", cp.uids())
			case !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), checkpointFile):
				t.Fatalf("error %q does not name the file and %s", err, tc.want)
			}
		})
	}
}
