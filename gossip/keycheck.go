package gossip

import (
	"fmt"
	"os"
)

// CheckKeyFile checks a gossip key file the way the agent will read it, and
// more: it must be a regular file owned by the user the agent runs as (or
// root), not readable by group or others, and hold at least one valid key.
// It is what `gpuherd config check` and the agent's start run before
// anything changes on the machine.
func CheckKeyFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("gossip key file: %w", err)
	}
	if uid, ok := fileOwner(st); ok && uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("gossip key file %s is owned by uid %d, not by the agent's user (uid %d) or root: run chown root: %s", path, uid, os.Geteuid(), path)
	}
	_, err = readKeyFile(path)
	return err
}
