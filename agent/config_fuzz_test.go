package agent

import (
	"errors"
	"strings"
	"testing"
)

// FuzzDecodeConfig feeds arbitrary YAML to the config loader and the
// validation after it. Neither may panic or hang; decoding either fails or
// yields a config that Validate judges, and every error Validate returns is
// a *ConfigError naming a key.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{
		"", "node_name: gpu-1\n", "node_name: [1, 2]\n", "bind_timeout: 10s\n", "bind_timeout: -1s\n",
		"bind_timeout: 1e400h\n", "max_gpus_per_claim: 99999999999999999999\n", "idle_driver: nouveau\n",
		"allow_devices: ['10de:*', '8086:1234']\n", "allow_devices: '10de:*'\n", "nodename: x\n",
		"gossip_addr: 0.0.0.0:7946\npeer_addr: 0.0.0.0:7947\n", "join: [a, b, c]\n", "offered_models: []\n",
		"a: &a [*a, *a]\nb: &b [*a, *a]\n", "---\n---\n", "!!binary aGVsbG8=\n", "node_name: \"\\0\"\n",
		"data_dir: ../../etc\n", "socket: /run/gpuherd/../x.sock\n", "log_level: trace\n",
		"metrics_addr: ':99999'\n", "reservation_lease: 0s\n", strings.Repeat("- ", 1000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := DefaultConfig()
		cfg.NodeName = "fuzz"
		if err := decodeConfig(data, &cfg); err != nil {
			_ = err.Error()
			return
		}
		if err := cfg.Validate(); err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Key == "" {
				t.Fatalf("Validate error %T without a key: %v", err, err)
			}
		}
	})
}
