package agent

import (
	"errors"
	"testing"
	"time"
)

func TestConfigVMKeys(t *testing.T) {
	d := DefaultConfig()
	if d.ProcRoot != "/proc" || d.DriverCheckInterval != Duration(30*time.Second) || d.RememberReleased != Duration(24*time.Hour) {
		t.Fatalf("defaults: proc_root %q, driver_check_interval %s, remember_released %s", d.ProcRoot, &d.DriverCheckInterval, &d.RememberReleased)
	}
	for _, tc := range []struct {
		yaml, key string
	}{
		{"proc_root: \"\"", "proc_root"},
		{"driver_check_interval: 0s", "driver_check_interval"},
		{"driver_check_interval: 2h", "driver_check_interval"},
		{"remember_released: -1h", "remember_released"},
		{"remember_released: 2400h", "remember_released"},
		{"remember_released: soon", "remember_released"},
	} {
		cfg := DefaultConfig()
		cfg.NodeName = "n"
		err := decodeConfig([]byte(tc.yaml), &cfg)
		if err == nil {
			err = cfg.Validate()
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%s: %v, want an error naming %s", tc.yaml, err, tc.key)
		}
	}
	cfg := DefaultConfig()
	cfg.NodeName = "n"
	if err := decodeConfig([]byte("remember_released: 0s\ndriver_check_interval: 5s\nproc_root: /host/proc\n"), &cfg); err != nil || cfg.Validate() != nil {
		t.Fatalf("valid keys refused: %v %v", err, cfg.Validate())
	}
	if cfg.RememberReleased != 0 || cfg.ProcRoot != "/host/proc" {
		t.Errorf("decoded %+v", cfg)
	}
}
