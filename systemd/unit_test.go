package systemd

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"
)

// unit is a parsed systemd unit file: section → key → every value assigned,
// in order (systemd accumulates some keys and lets later ones win for others).
type unit map[string]map[string][]string

// parseUnit reads the unit file syntax of systemd.syntax(7): [Section]
// headers, Key=Value lines, # and ; comments, backslash continuations.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	var pending string
	sc := bufio.NewScanner(f)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending += cont + " "
			continue
		}
		line, pending = pending+line, ""
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: not a key=value line inside a section: %q", path, lineNo, line)
		}
		key = strings.TrimSpace(key)
		u[section][key] = append(u[section][key], strings.TrimSpace(value))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// last is the effective value of a key that a later assignment overrides.
func (u unit) last(section, key string) (string, bool) {
	v := u[section][key]
	if len(v) == 0 {
		return "", false
	}
	return v[len(v)-1], true
}

// words is the effective list of a key that accumulates (an empty
// assignment resets it).
func (u unit) words(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		if v == "" {
			out = nil
			continue
		}
		out = append(out, strings.Fields(v)...)
	}
	return out
}

// setting is a key's effective value a unit must have, and why.
type setting struct{ section, key, want, why string }

// mustHave reports each setting u does not have.
func (u unit) mustHave(t *testing.T, settings []setting) {
	t.Helper()
	for _, tc := range settings {
		got, ok := u.last(tc.section, tc.key)
		if !ok || got != tc.want {
			t.Errorf("[%s] %s = %q, want %q (%s)", tc.section, tc.key, got, tc.want, tc.why)
		}
	}
}

func TestUnitFileMustHaves(t *testing.T) {
	u := parseUnit(t, "gpuherd.service")
	u.mustHave(t, []setting{
		{"Service", "Type", "notify", "READY=1 only after inventory, ledger and gossip"},
		{"Service", "NotifyAccess", "main", "only the agent speaks for itself"},
		{"Service", "ExecStart", "/usr/bin/gpuherd agent --config /etc/gpuherd/gpuherd.yaml", "the packaged paths"},
		{"Service", "ExecReload", "/bin/kill -HUP $MAINPID", "SIGHUP reloads the log level and gossip keys"},
		{"Service", "Restart", "on-failure", "a crashed or watchdog-killed agent comes back"},
		{"Service", "WatchdogSec", "30s", "the agent pings at half of it"},
		{"Service", "StateDirectory", "gpuherd", "the ledger in /var/lib/gpuherd"},
		{"Service", "StateDirectoryMode", "0700", "the ledger is root's alone"},
		{"Service", "RuntimeDirectory", "gpuherd", "the socket in /run/gpuherd"},
		{"Service", "RuntimeDirectoryMode", "0755", "socket_group members must reach the 0660 socket"},
		{"Service", "NoNewPrivileges", "yes", "hardening"},
		{"Service", "ProtectSystem", "strict", "hardening that still leaves /sys and /dev writable"},
		{"Service", "ProtectHome", "yes", "hardening"},
		{"Service", "PrivateTmp", "yes", "hardening"},
		{"Service", "ProtectControlGroups", "yes", "hardening"},
		{"Service", "ProtectKernelModules", "yes", "vfio-pci is loaded by modules-load.d, not the agent"},
		{"Service", "LockPersonality", "yes", "hardening"},
		{"Service", "MemoryDenyWriteExecute", "yes", "hardening"},
		{"Service", "RestrictRealtime", "yes", "hardening"},
		{"Service", "SystemCallArchitectures", "native", "hardening"},
		{"Service", "CapabilityBoundingSet", "CAP_CHOWN CAP_DAC_READ_SEARCH CAP_SYS_PTRACE", "root owns every sysfs file; CAP_CHOWN gives the socket to socket_group; the other two read QEMU's /proc/<pid>/fd"},
		{"Install", "WantedBy", "multi-user.target", "enable starts it at boot"},
	})

	for _, d := range []string{"TimeoutStartSec", "RestartSec", "LimitNOFILE"} {
		if _, ok := u.last("Service", d); !ok {
			t.Errorf("[Service] %s is missing", d)
		}
	}
	families := u.words("Service", "RestrictAddressFamilies")
	slices.Sort(families)
	if want := []string{"AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"}; !slices.Equal(families, want) {
		// AF_NETLINK: default route and uevents; AF_INET*: gossip, peers, metrics.
		t.Errorf("RestrictAddressFamilies = %v, want %v", families, want)
	}
	if !slices.Contains(u.words("Unit", "After"), "network-online.target") ||
		!slices.Contains(u.words("Unit", "Wants"), "network-online.target") {
		t.Error("the unit must want and come after network-online.target: gossip needs an address")
	}
	// The libvirt hook asks the agent before every VM start, autostarted
	// ones included; Before= only orders (libvirt starts without gpuherd),
	// Requires= or Wants= on libvirt would pull it onto hosts without it.
	before := u.words("Unit", "Before")
	for _, svc := range []string{"libvirtd.service", "virtqemud.service", "libvirt-guests.service"} {
		if !slices.Contains(before, svc) {
			t.Errorf("[Unit] Before = %v lacks %s: VMs that autostart would not find their GPUs bound and claims known", before, svc)
		}
		for _, dep := range []string{"Wants", "Requires", "Requisite", "BindsTo", "After"} {
			if slices.Contains(u.words("Unit", dep), svc) {
				t.Errorf("[Unit] %s names %s: gpuherd orders itself before libvirt and must not pull it in", dep, svc)
			}
		}
	}
}

func TestUnitFileMustNotHaves(t *testing.T) {
	u := parseUnit(t, "gpuherd.service")
	// Each of these breaks binding on a real server, and none shows up in a
	// test on simulated hardware: keep them out for good.
	for key, why := range map[string]string{
		"ProtectKernelTunables": "makes /sys read-only, so no GPU can be bound",
		"PrivateDevices":        "hides /dev/vfio and /dev/nvidia*",
		"ProtectClock":          "implies DeviceAllow=, whose device filter blocks /dev/vfio and /dev/nvidia*",
		"DeviceAllow":           "the device filter blocks /dev/vfio and /dev/nvidia*",
		"DevicePolicy":          "the device filter blocks /dev/vfio and /dev/nvidia*",
		"PrivateNetwork":        "gossip and the peer API need the host's network",
		"ReadOnlyPaths":         "/sys and /dev must stay writable",
		"InaccessiblePaths":     "/sys and /dev must stay reachable",
		"User":                  "sysfs bind files are writable by root only",
		"DynamicUser":           "sysfs bind files are writable by root only",
		"PrivateUsers":          "root in a user namespace cannot write sysfs",
	} {
		if v, ok := u.last("Service", key); ok && v != "no" && v != "false" && v != "" {
			t.Errorf("[Service] %s=%s must not be set: it %s", key, v, why)
		}
	}
	caps := u.words("Service", "CapabilityBoundingSet")
	for _, c := range caps {
		if strings.HasPrefix(c, "~") {
			t.Errorf("CapabilityBoundingSet uses a deny list (%s): list what is allowed instead", c)
		}
	}
	if len(caps) != 3 {
		t.Errorf("CapabilityBoundingSet = %v: every capability added needs its reason in docs/operations.md and here", caps)
	}
}

// The DRA driver's unit runs the plugin's own binary (the agent's links no
// Kubernetes code), notifies when its slice is published, and comes after
// the agent it talks to.
func TestKubeletPluginUnit(t *testing.T) {
	u := parseUnit(t, "gpuherd-kubelet-plugin.service")
	u.mustHave(t, []setting{
		{"Service", "ExecStart", "/usr/bin/gpuherd-kubelet-plugin --config /etc/gpuherd/gpuherd.yaml", "the packaged binary and config"},
		{"Service", "Type", "notify", "READY=1 once the ResourceSlice is published"},
		{"Service", "NotifyAccess", "main", "only the plugin speaks for itself"},
		{"Service", "Restart", "on-failure", "a crashed plugin comes back"},
		{"Install", "WantedBy", "multi-user.target", "enable starts it at boot"},
	})
	if !slices.Contains(u.words("Unit", "After"), "gpuherd.service") || !slices.Contains(u.words("Unit", "Wants"), "gpuherd.service") {
		t.Error("the plugin must want and come after gpuherd.service: it talks to the agent")
	}
}
