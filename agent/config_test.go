package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent"
)

// writeConfig writes a config file into a fresh temporary directory.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpuherd.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// validDefaults is DefaultConfig with a node name, so that the test does not
// depend on the host name of the machine it runs on.
func validDefaults() agent.Config {
	cfg := agent.DefaultConfig()
	cfg.NodeName = "gpu-17"
	return cfg
}

func TestDefaultConfigValidates(t *testing.T) {
	cfg := agent.DefaultConfig()
	if cfg.NodeName == "" {
		t.Skip("the host name of this machine cannot be read; DefaultConfig leaves node_name empty")
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v, want nil", err)
	}
	want := map[string]bool{
		"data_dir":           cfg.DataDir == agent.DefaultDataDir,
		"socket":             cfg.Socket == agent.DefaultSocket,
		"idle_driver":        cfg.IdleDriver == "vfio-pci",
		"allow_devices":      reflect.DeepEqual(cfg.AllowDevices, []string{"10de:*"}),
		"bind_timeout":       time.Duration(cfg.BindTimeout) == 10*time.Second,
		"reservation_lease":  time.Duration(cfg.ReservationLease) == 30*time.Second,
		"health_interval":    time.Duration(cfg.HealthInterval) == 15*time.Second,
		"max_gpus_per_claim": cfg.MaxGPUsPerClaim == 16,
		"nvml":               cfg.NVML == "auto",
		"log_level":          cfg.LogLevel == "info",
		"log_format":         cfg.LogFormat == "text",
		"sysfs_root":         cfg.SysfsRoot == "/sys",
		"dev_root":           cfg.DevRoot == "/dev",
	}
	for key, ok := range want {
		if !ok {
			t.Errorf("default %s differs from the README's table", key)
		}
	}
}

func TestLoadConfigFileEveryKey(t *testing.T) {
	path := writeConfig(t, `# every key of the README's table
node_name: gpu-17
data_dir: /srv/gpuherd
socket: /run/gh/api.sock
socket_group: gpuherd
sysfs_root: /host/sys
dev_root: /host/dev
simulate: dgx-h100
idle_driver: nvidia
allow_devices: ["10de:2330", "10de:22a3"]
bind_timeout: 30s
reservation_lease: 2m
health_interval: 1m30s
max_gpus_per_claim: 8
nvml: "off"
log_level: debug
log_format: json
`)
	cfg := agent.DefaultConfig()
	if err := agent.LoadConfigFile(path, &cfg); err != nil {
		t.Fatalf("LoadConfigFile: %v", err)
	}
	// Keys the file does not name (there are none in the README's table)
	// keep their defaults.
	want := agent.DefaultConfig()
	want.NodeName = "gpu-17"
	want.DataDir = "/srv/gpuherd"
	want.Socket = "/run/gh/api.sock"
	want.SocketGroup = "gpuherd"
	want.SysfsRoot = "/host/sys"
	want.DevRoot = "/host/dev"
	want.Simulate = "dgx-h100"
	want.IdleDriver = "nvidia"
	want.AllowDevices = []string{"10de:2330", "10de:22a3"}
	want.BindTimeout = agent.Duration(30 * time.Second)
	want.ReservationLease = agent.Duration(2 * time.Minute)
	want.HealthInterval = agent.Duration(90 * time.Second)
	want.MaxGPUsPerClaim = 8
	want.NVML = "off"
	want.LogLevel = "debug"
	want.LogFormat = "json"
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("loaded\n%+v\nwant\n%+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the loaded file does not validate: %v", err)
	}
}

func TestLoadConfigFileKeepsDefaultsOfKeysNotGiven(t *testing.T) {
	for name, body := range map[string]string{
		"empty file":     "",
		"only a comment": "# nothing set here\n",
		"one key":        "log_level: warn\n",
	} {
		t.Run(name, func(t *testing.T) {
			cfg := validDefaults()
			want := validDefaults()
			if strings.Contains(body, "log_level") {
				want.LogLevel = "warn"
			}
			if err := agent.LoadConfigFile(writeConfig(t, body), &cfg); err != nil {
				t.Fatalf("LoadConfigFile: %v", err)
			}
			if !reflect.DeepEqual(cfg, want) {
				t.Errorf("got\n%+v\nwant\n%+v", cfg, want)
			}
		})
	}
}

// TestLoadConfigFileRejects covers files that must never start an agent:
// every error names what is wrong so that the operator can fix the file.
func TestLoadConfigFileRejects(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string // substrings of the error
	}{
		{"unknown key", "node_name: a\nidle_drvier: nvidia\n", []string{"idle_drvier"}},
		// Type errors come from the YAML decoder: they give the line and
		// the value, not the key (see the report: they should name it).
		{"list given as a mapping", "node_name: a\nallow_devices: {10de: '*'}\n", []string{"line 2", "[]string"}},
		{"duration without unit", "bind_timeout: 30\n", []string{`"30"`, "duration"}},
		{"duration not a duration", "reservation_lease: soon\n", []string{`"soon"`, "duration"}},
		{"number not a number", "max_gpus_per_claim: lots\n", []string{"line 1", "lots"}},
		{"duplicate key", "log_level: info\nlog_level: debug\n", []string{"log_level"}},
		{"not a mapping", "- node_name\n", []string{"gpuherd.yaml"}},
		{"malformed YAML", "node_name: [unterminated\n", []string{"gpuherd.yaml"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.body)
			cfg := validDefaults()
			err := agent.LoadConfigFile(path, &cfg)
			if err == nil {
				t.Fatalf("LoadConfigFile(%q) = nil, want an error", tc.body)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file %s", err, path)
			}
		})
	}
}

func TestLoadConfigFileMissing(t *testing.T) {
	cfg := validDefaults()
	err := agent.LoadConfigFile(filepath.Join(t.TempDir(), "absent.yaml"), &cfg)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadConfigFile(absent) = %v, want an error wrapping os.ErrNotExist", err)
	}
}

func TestLoadConfigFileOversized(t *testing.T) {
	// A valid YAML file (a comment) just over 1 MiB: the size alone refuses it.
	body := "# " + strings.Repeat("x", 1<<20) + "\n"
	cfg := validDefaults()
	err := agent.LoadConfigFile(writeConfig(t, body), &cfg)
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("LoadConfigFile(%d bytes) = %v, want a 'larger than' error", len(body), err)
	}

	// Exactly at the limit is still read.
	atLimit := "# " + strings.Repeat("x", 1<<20-3) + "\n"
	if len(atLimit) != 1<<20 {
		t.Fatalf("test bug: %d bytes", len(atLimit))
	}
	if err := agent.LoadConfigFile(writeConfig(t, atLimit), &cfg); err != nil {
		t.Errorf("LoadConfigFile(%d bytes) = %v, want nil", len(atLimit), err)
	}
}

// TestValidateNamesTheKey is the rule table of Validate: each bad value is a
// *ConfigError whose Key is the YAML key to fix.
func TestValidateNamesTheKey(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		mutate func(*agent.Config)
	}{
		{"empty node_name", "node_name", func(c *agent.Config) { c.NodeName = "" }},
		{"node_name with a space", "node_name", func(c *agent.Config) { c.NodeName = "gpu 17" }},
		{"node_name with a slash", "node_name", func(c *agent.Config) { c.NodeName = "a/b" }},
		{"node_name of 64 characters", "node_name", func(c *agent.Config) { c.NodeName = strings.Repeat("n", 64) }},
		{"empty data_dir", "data_dir", func(c *agent.Config) { c.DataDir = "" }},
		{"empty socket", "socket", func(c *agent.Config) { c.Socket = "" }},
		{"socket too long for sun_path", "socket", func(c *agent.Config) { c.Socket = "/run/" + strings.Repeat("s", 100) }},
		{"empty sysfs_root", "sysfs_root", func(c *agent.Config) { c.SysfsRoot = "" }},
		{"empty dev_root", "dev_root", func(c *agent.Config) { c.DevRoot = "" }},
		{"bad idle_driver", "idle_driver", func(c *agent.Config) { c.IdleDriver = "nouveau" }},
		{"empty idle_driver", "idle_driver", func(c *agent.Config) { c.IdleDriver = "" }},
		{"no allow_devices", "allow_devices", func(c *agent.Config) { c.AllowDevices = nil }},
		{"allow_devices entry without device", "allow_devices", func(c *agent.Config) { c.AllowDevices = []string{"10de"} }},
		{"allow_devices entry not hex", "allow_devices", func(c *agent.Config) { c.AllowDevices = []string{"10de:*", "nvidia:2330"} }},
		{"bind_timeout below 100ms", "bind_timeout", func(c *agent.Config) { c.BindTimeout = agent.Duration(99 * time.Millisecond) }},
		{"bind_timeout above 10m", "bind_timeout", func(c *agent.Config) { c.BindTimeout = agent.Duration(10*time.Minute + time.Second) }},
		{"bind_timeout zero", "bind_timeout", func(c *agent.Config) { c.BindTimeout = 0 }},
		{"reservation_lease below 1s", "reservation_lease", func(c *agent.Config) { c.ReservationLease = agent.Duration(999 * time.Millisecond) }},
		{"reservation_lease above 1h", "reservation_lease", func(c *agent.Config) { c.ReservationLease = agent.Duration(time.Hour + time.Second) }},
		{"reservation_lease negative", "reservation_lease", func(c *agent.Config) { c.ReservationLease = agent.Duration(-time.Minute) }},
		{"health_interval below 1s", "health_interval", func(c *agent.Config) { c.HealthInterval = agent.Duration(time.Millisecond) }},
		{"max_gpus_per_claim 0", "max_gpus_per_claim", func(c *agent.Config) { c.MaxGPUsPerClaim = 0 }},
		{"max_gpus_per_claim 65", "max_gpus_per_claim", func(c *agent.Config) { c.MaxGPUsPerClaim = 65 }},
		{"max_gpus_per_claim negative", "max_gpus_per_claim", func(c *agent.Config) { c.MaxGPUsPerClaim = -1 }},
		{"nvml on", "nvml", func(c *agent.Config) { c.NVML = "on" }},
		{"nvml empty", "nvml", func(c *agent.Config) { c.NVML = "" }},
		{"log_level trace", "log_level", func(c *agent.Config) { c.LogLevel = "trace" }},
		{"log_level upper case", "log_level", func(c *agent.Config) { c.LogLevel = "INFO" }},
		{"log_format logfmt", "log_format", func(c *agent.Config) { c.LogFormat = "logfmt" }},
		{"socket_group with a colon", "socket_group", func(c *agent.Config) { c.SocketGroup = "root:wheel" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validDefaults()
			tc.mutate(&cfg)
			err := cfg.Validate()
			var ce *agent.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Validate() = %v (%T), want *agent.ConfigError", err, err)
			}
			if ce.Key != tc.key {
				t.Errorf("ConfigError.Key = %q, want %q (error: %v)", ce.Key, tc.key, err)
			}
			if !strings.HasPrefix(err.Error(), "config: "+tc.key+": ") || ce.Reason == "" {
				t.Errorf("error %q should read \"config: %s: <reason>\"", err, tc.key)
			}
		})
	}
}

// TestValidateAcceptsBounds pins the inclusive ends of every range, so that
// an off-by-one in either direction fails one of the two tables.
func TestValidateAcceptsBounds(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*agent.Config)
	}{
		{"node_name of 63 characters", func(c *agent.Config) { c.NodeName = strings.Repeat("n", 63) }},
		{"socket of 100 bytes", func(c *agent.Config) { c.Socket = "/" + strings.Repeat("s", 99) }},
		{"idle_driver nvidia", func(c *agent.Config) { c.IdleDriver = "nvidia" }},
		{"idle_driver none", func(c *agent.Config) { c.IdleDriver = "none" }},
		{"bind_timeout 100ms", func(c *agent.Config) { c.BindTimeout = agent.Duration(100 * time.Millisecond) }},
		{"bind_timeout 10m", func(c *agent.Config) { c.BindTimeout = agent.Duration(10 * time.Minute) }},
		{"reservation_lease 1s", func(c *agent.Config) { c.ReservationLease = agent.Duration(time.Second) }},
		{"reservation_lease 1h", func(c *agent.Config) { c.ReservationLease = agent.Duration(time.Hour) }},
		{"health_interval 1s", func(c *agent.Config) { c.HealthInterval = agent.Duration(time.Second) }},
		{"max_gpus_per_claim 1", func(c *agent.Config) { c.MaxGPUsPerClaim = 1 }},
		{"max_gpus_per_claim 64", func(c *agent.Config) { c.MaxGPUsPerClaim = 64 }},
		{"allow_devices of one device", func(c *agent.Config) { c.AllowDevices = []string{"10de:2330"} }},
		{"nvml off", func(c *agent.Config) { c.NVML = "off" }},
		{"log_level error", func(c *agent.Config) { c.LogLevel = "error" }},
		{"log_format json", func(c *agent.Config) { c.LogFormat = "json" }},
		{"socket_group set", func(c *agent.Config) { c.SocketGroup = "gpuherd" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validDefaults()
			tc.mutate(&cfg)
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestDurationFlagValue(t *testing.T) {
	var d agent.Duration
	if err := d.Set("1m30s"); err != nil {
		t.Fatalf("Set(1m30s): %v", err)
	}
	if got := d.String(); got != "1m30s" {
		t.Errorf("String() = %q, want 1m30s", got)
	}
	if err := d.Set("90"); err == nil || !strings.Contains(err.Error(), `"90"`) {
		t.Errorf("Set(90) = %v, want an error quoting the value", err)
	}
	if d.Type() != "duration" {
		t.Errorf("Type() = %q", d.Type())
	}
}

func TestLedgerPath(t *testing.T) {
	cfg := validDefaults()
	cfg.DataDir = "/var/lib/gpuherd"
	if got := cfg.LedgerPath(); got != "/var/lib/gpuherd/ledger.db" {
		t.Errorf("LedgerPath() = %q", got)
	}
}
