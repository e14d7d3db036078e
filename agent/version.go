package agent

import (
	"runtime"
	"runtime/debug"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Version and Commit are set at link time (-X) by the Makefile.
var (
	Version = "dev"
	Commit  = ""
)

// VersionInfo describes this build.
func VersionInfo() api.VersionInfo {
	v := api.VersionInfo{Version: Version, Commit: Commit, Go: runtime.Version()}
	if v.Commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v.Commit = s.Value[:12]
				}
			}
		}
	}
	return v
}
