package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/vfio"
)

// Config is everything the agent can be told. Defaults come from
// DefaultConfig, then the YAML file, then flags; Validate runs once at start.
type Config struct {
	// NodeName names this server to users and, later, to the cluster.
	NodeName string `yaml:"node_name"`
	// DataDir holds the ledger (and, when simulating, the simulated machine).
	DataDir string `yaml:"data_dir"`
	// Socket is the local API's unix socket.
	Socket string `yaml:"socket"`
	// SocketGroup, when set, owns the socket so its members may use it (mode 0660).
	SocketGroup string `yaml:"socket_group"`
	// SysfsRoot and DevRoot root every sysfs and /dev access (tests, containers).
	SysfsRoot string `yaml:"sysfs_root"`
	DevRoot   string `yaml:"dev_root"`
	// ProcRoot is where the agent finds the processes (QEMU) that hold VFIO
	// groups open.
	ProcRoot string `yaml:"proc_root"`
	// DriverCheckInterval is how often every GPU's driver is re-read and
	// compared with the ledger (a GPU rebound behind it is put back).
	DriverCheckInterval Duration `yaml:"driver_check_interval"`
	// RememberReleased is how long a released claim ID's server and
	// request are remembered: a later claim of the ID prefers that server.
	// 0 forgets at once.
	RememberReleased Duration `yaml:"remember_released"`
	// Simulate runs on simulated hardware: a built-in profile name or a profile file.
	Simulate string `yaml:"simulate"`
	// IdleDriver is where free GPUs live: vfio-pci, nvidia or none.
	IdleDriver string `yaml:"idle_driver"`
	// AllowDevices lists the vendor:device IDs gpuherd may bind ("10de:*").
	AllowDevices []string `yaml:"allow_devices"`
	// AllowUnsafeInterrupts offers GPUs on a host without interrupt
	// remapping (vfio then needs vfio_iommu_type1 allow_unsafe_interrupts=1).
	AllowUnsafeInterrupts bool `yaml:"allow_unsafe_interrupts"`
	// GPUDevices lists extra vendor:device IDs counted as GPUs besides
	// NVIDIA's display-class functions. For tests on emulated hardware only
	// (QEMU devices standing in for GPUs, tools/test/realkernel); empty on a real
	// server. Each must also be on AllowDevices.
	GPUDevices []string `yaml:"gpu_devices"`
	// BindTimeout bounds every sysfs write; a write that takes longer marks the device stuck.
	BindTimeout Duration `yaml:"bind_timeout"`
	// ReservationLease is how long a reservation lives unless committed.
	ReservationLease Duration `yaml:"reservation_lease"`
	// HealthInterval is how often GPUs are checked for vanishing from the bus.
	HealthInterval Duration `yaml:"health_interval"`
	// DirectorySettle is how long the membership must stay unchanged (and
	// this agent up) before it vouches, as the home of a claim ID, that the
	// ID is held nowhere; until then coordinators ask every server.
	DirectorySettle Duration `yaml:"directory_settle"`
	// MaxGPUsPerClaim caps the GPUs of one request.
	MaxGPUsPerClaim int `yaml:"max_gpus_per_claim"`
	// NVML is "auto" (use it when libnvidia-ml answers) or "off".
	NVML string `yaml:"nvml"`
	// LogLevel is debug, info, warn or error; LogFormat is text or json.
	LogLevel  string `yaml:"log_level"`
	LogFormat string `yaml:"log_format"`
	// OfferedModels are the models the platform offers: `availability`
	// lists them (as Unavailable when none is free) besides every model
	// some server has.
	OfferedModels []string `yaml:"offered_models"`
	// MetricsAddr serves /metrics, /healthz and /readyz over plain HTTP
	// (HOST:PORT; "" turns it off).
	MetricsAddr string `yaml:"metrics_addr"`
	// MetricsWebConfig is an exporter-toolkit web configuration file (TLS,
	// basic auth) for the metrics listener, as node_exporter's
	// --web.config.file; "" serves plain HTTP.
	MetricsWebConfig string `yaml:"metrics_web_config"`
	// Models extends the built-in model catalog (models.yaml): a model
	// with the name of a built-in one replaces it.
	Models []ModelConfig `yaml:"models"`
	// DenyDevices lists PCI addresses ("0000:3b:00.0") gpuherd never
	// manages, whatever AllowDevices says: the card stays where it is.
	DenyDevices []string `yaml:"deny_devices"`
	// FabricMode states how this server's NVSwitch fabric is run: "auto"
	// (detect), "none", "shared-nvswitch" or "full-passthrough"; see
	// docs/design.md, "NVSwitch boards".
	FabricMode string `yaml:"fabric_mode"`

	// The cluster. GossipAddr "" runs this server alone.
	GossipAddr         string   `yaml:"gossip_addr"`         // HOST:PORT memberlist listens on
	AdvertiseAddr      string   `yaml:"advertise_addr"`      // IP others reach this server at; "" finds it with netlink
	AdvertiseInterface string   `yaml:"advertise_interface"` // interface to take it from; "" the default route's
	Join               []string `yaml:"join"`                // seeds: HOST or HOST:PORT of other servers' gossip
	GossipKeyFile      string   `yaml:"gossip_key_file"`     // AES keys, one per line, first is primary
	InsecureGossip     bool     `yaml:"insecure_gossip"`     // allow unencrypted gossip (labs only)
	PeerAddr           string   `yaml:"peer_addr"`           // HOST:PORT of the mutual-TLS API for coordinators
	TLSCA              string   `yaml:"tls_ca"`              // CA that signs every agent's certificate
	TLSCert            string   `yaml:"tls_cert"`            // this agent's certificate (server and client)
	TLSKey             string   `yaml:"tls_key"`             // its key

	// The name registry (docs/names.md), run by every agent of a cluster.
	NamesVoters          []string `yaml:"names_voters"`           // the voters' node names (1, 3 or 5); none: chosen at run time
	NamesAddr            string   `yaml:"names_addr"`             // HOST:PORT raft listens on; "": peer_addr's host, port 0
	NamesDir             string   `yaml:"names_dir"`              // raft state; "": <data_dir>/names
	NamesBootstrapExpect int      `yaml:"names_bootstrap_expect"` // voters a registry grows to when names_voters is not set

	// Kubernetes configures gpuherd-kubelet-plugin, the DRA driver of a
	// hypervisor that is a Kubernetes node (docs/kubevirt.md); the agent
	// itself does not read it.
	Kubernetes KubernetesConfig `yaml:"kubernetes"`
}

// KubernetesConfig is the DRA kubelet plugin's configuration.
type KubernetesConfig struct {
	// Kubeconfig holds the node's credentials for the API server (the
	// kubelet's, which may publish this node's ResourceSlices).
	Kubeconfig string `yaml:"kubeconfig"`
	// NodeName is this server's Kubernetes node; "" is node_name.
	NodeName string `yaml:"node_name"`
	// DriverName names the driver and its attribute domain.
	DriverName string `yaml:"driver_name"`
	// PluginDir is the plugin's directory under the kubelet's (its socket,
	// the device metadata, the checkpoint); "" is
	// /var/lib/kubelet/plugins/<driver_name>.
	PluginDir string `yaml:"plugin_dir"`
	// RegistrarDir is where the kubelet finds plugins.
	RegistrarDir string `yaml:"registrar_dir"`
	// CDIDir is where the container runtime reads CDI specs.
	CDIDir string `yaml:"cdi_dir"`
}

// DefaultKubeconfig is the kubelet's own kubeconfig on a kubeadm node.
const DefaultKubeconfig = "/etc/kubernetes/kubelet.conf"

// Duration is a time.Duration that reads "30s" from YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (use e.g. 30s, 2m)", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// String implements pflag.Value.
func (d *Duration) String() string { return time.Duration(*d).String() }

// Set implements pflag.Value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (use e.g. 30s, 2m)", s)
	}
	*d = Duration(v)
	return nil
}

// Type implements pflag.Value.
func (d *Duration) Type() string { return "duration" }

// Default paths of a packaged install.
const (
	DefaultDataDir = "/var/lib/gpuherd"
	DefaultSocket  = "/run/gpuherd/gpuherd.sock"
)

// DefaultConfig is the configuration of a packaged install.
func DefaultConfig() Config {
	hostname, _ := os.Hostname()
	c := Config{
		NodeName:         hostname,
		DataDir:          DefaultDataDir,
		Socket:           DefaultSocket,
		SysfsRoot:        "/sys",
		DevRoot:          "/dev",
		IdleDriver:       string(vfio.IdleVFIO),
		AllowDevices:     []string{"10de:*"},
		BindTimeout:      Duration(10 * time.Second),
		ReservationLease: Duration(30 * time.Second),
		HealthInterval:   Duration(15 * time.Second),
		DirectorySettle:  Duration(10 * time.Second),
		MaxGPUsPerClaim:  16,
		NVML:             "auto",
		LogLevel:         "info",
		LogFormat:        "text",
		FabricMode:       host.FabricAuto,
		OfferedModels:    []string{"NVIDIA L40S", "NVIDIA A100 80GB", "NVIDIA H100 80GB", "NVIDIA RTX 6000 Pro"},
	}
	c.ProcRoot = "/proc"
	c.DriverCheckInterval = Duration(30 * time.Second)
	c.RememberReleased = Duration(24 * time.Hour)
	c.NamesBootstrapExpect = 3
	c.Kubernetes = KubernetesConfig{Kubeconfig: DefaultKubeconfig, DriverName: "gpu.gpuherd.io",
		RegistrarDir: "/var/lib/kubelet/plugins_registry", CDIDir: "/var/run/cdi"}
	return c
}

// maxConfigBytes bounds the config file: it is read whole.
const maxConfigBytes = 1 << 20

// LoadConfigFile reads a YAML file over cfg. Unknown keys are errors, so a
// typo never silently falls back to a default.
func LoadConfigFile(path string, cfg *Config) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return fmt.Errorf("config %s: larger than %d bytes", path, maxConfigBytes)
	}
	if err := decodeConfig(data, cfg); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

func decodeConfig(data []byte, cfg *Config) error {
	if err := checkKeys(data); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file keeps the defaults
		}
		if key := badKey(data); key != "" {
			return &ConfigError{Key: key, Reason: err.Error()}
		}
		return err
	}
	return nil
}

// badKey finds the top-level key whose value does not decode, so that the
// error names it: yaml's own type errors give only a line.
func badKey(data []byte) string {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return ""
	}
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		one := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{m.Content[i], m.Content[i+1]}}
		out, _ := yaml.Marshal(one)
		dec := yaml.NewDecoder(bytes.NewReader(out))
		dec.KnownFields(true)
		var probe Config
		if dec.Decode(&probe) != nil {
			return m.Content[i].Value
		}
	}
	return ""
}

// ConfigError names the key that is wrong.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return fmt.Sprintf("config: %s: %s", e.Key, e.Reason) }

// Validate checks every key once, at start.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if c.NodeName == "" {
		return bad("node_name", "must not be empty (the host name could not be read; set it)")
	}
	if len(c.NodeName) > 63 || strings.ContainsAny(c.NodeName, " /\\\t\n") {
		return bad("node_name", "%q must be at most 63 characters without spaces or slashes", c.NodeName)
	}
	if err := c.validateValues(); err != nil {
		return err
	}
	for _, kv := range [][2]string{{"data_dir", c.DataDir}, {"socket", c.Socket}, {"sysfs_root", c.SysfsRoot}, {"dev_root", c.DevRoot}, {"proc_root", c.ProcRoot}} {
		if kv[1] == "" {
			return bad(kv[0], "must not be empty")
		}
	}
	if len(c.Socket) > 100 {
		// sun_path is 108 bytes on Linux; leave room for the terminator.
		return bad("socket", "path %q is too long for a unix socket (max 100 bytes)", c.Socket)
	}
	if _, err := vfio.ParseIdlePolicy(c.IdleDriver); err != nil {
		return bad("idle_driver", "%q: use vfio-pci, nvidia or none", c.IdleDriver)
	}
	if len(c.AllowDevices) == 0 {
		return bad("allow_devices", "must list at least one vendor:device (e.g. 10de:*)")
	}
	if _, err := vfio.ParseAllowList(c.AllowDevices); err != nil {
		return bad("allow_devices", "%v", err)
	}
	if _, err := c.gpuDevices(); err != nil {
		return err
	}
	if c.BindTimeout < Duration(100*time.Millisecond) || c.BindTimeout > Duration(10*time.Minute) {
		return bad("bind_timeout", "%s must be between 100ms and 10m", time.Duration(c.BindTimeout))
	}
	if c.ReservationLease < Duration(time.Second) || c.ReservationLease > Duration(time.Hour) {
		return bad("reservation_lease", "%s must be between 1s and 1h", time.Duration(c.ReservationLease))
	}
	if c.DirectorySettle < 0 || c.DirectorySettle > Duration(10*time.Minute) {
		return bad("directory_settle", "%s must be between 0s and 10m", time.Duration(c.DirectorySettle))
	}
	if c.HealthInterval < Duration(time.Second) {
		return bad("health_interval", "%s must be at least 1s", time.Duration(c.HealthInterval))
	}
	if c.DriverCheckInterval < Duration(time.Second) || c.DriverCheckInterval > Duration(time.Hour) {
		return bad("driver_check_interval", "%s must be between 1s and 1h", time.Duration(c.DriverCheckInterval))
	}
	if c.RememberReleased < 0 || c.RememberReleased > Duration(90*24*time.Hour) {
		return bad("remember_released", "%s must be between 0s and 2160h (90 days)", time.Duration(c.RememberReleased))
	}
	if c.MaxGPUsPerClaim < 1 || c.MaxGPUsPerClaim > 64 {
		return bad("max_gpus_per_claim", "%d must be between 1 and 64", c.MaxGPUsPerClaim)
	}
	switch c.NVML {
	case "auto", "off":
	default:
		return bad("nvml", "%q: use auto or off", c.NVML)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log_level", "%q: use debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return bad("log_format", "%q: use text or json", c.LogFormat)
	}
	if c.SocketGroup != "" && strings.ContainsAny(c.SocketGroup, " /:") {
		return bad("socket_group", "%q is not a group name", c.SocketGroup)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return bad("metrics_addr", "%q: use HOST:PORT, e.g. :9465", c.MetricsAddr)
		}
	}
	return c.validateCluster()
}

func (c *Config) validateCluster() error {
	bad := func(key, format string, args ...any) error {
		return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if c.GossipAddr == "" {
		if len(c.Join) > 0 {
			return bad("join", "needs gossip_addr: set the address gossip listens on (e.g. 0.0.0.0:7946)")
		}
		return c.validateNames()
	}
	if _, _, err := net.SplitHostPort(c.GossipAddr); err != nil {
		return bad("gossip_addr", "%q: use HOST:PORT, e.g. 0.0.0.0:7946", c.GossipAddr)
	}
	if c.PeerAddr == "" {
		return bad("peer_addr", "required with gossip_addr: the mutual-TLS API coordinators call (e.g. 0.0.0.0:7947)")
	}
	if _, _, err := net.SplitHostPort(c.PeerAddr); err != nil {
		return bad("peer_addr", "%q: use HOST:PORT, e.g. 0.0.0.0:7947", c.PeerAddr)
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		return bad("advertise_addr", "%q is not an IP address", c.AdvertiseAddr)
	}
	for _, kv := range [][2]string{{"tls_ca", c.TLSCA}, {"tls_cert", c.TLSCert}, {"tls_key", c.TLSKey}} {
		if kv[1] == "" {
			return bad(kv[0], "required with gossip_addr: agents talk to each other over mutual TLS (create them with `gpuherd tls ca` and `gpuherd tls cert`)")
		}
	}
	if c.GossipKeyFile == "" && !c.InsecureGossip {
		return bad("gossip_key_file", "required with gossip_addr: gossip is encrypted (generate a key with `gpuherd gossip keygen`), or set insecure_gossip: true for a lab")
	}
	return c.validateNames()
}

// gpuDevices parses GPUDevices: exact vendor:device IDs, each on the allow
// list (a GPU gpuherd may not bind could only fail its claims).
func (c *Config) gpuDevices() (vfio.AllowList, error) {
	bad := func(format string, args ...any) error {
		return &ConfigError{Key: "gpu_devices", Reason: fmt.Sprintf(format, args...)}
	}
	ids, err := vfio.ParseAllowList(c.GPUDevices)
	if err != nil {
		return nil, bad("%v", err)
	}
	allow, _ := vfio.ParseAllowList(c.AllowDevices)
	for _, id := range ids {
		if id.AnyDevice {
			return nil, bad("%s: list exact vendor:device IDs, not a whole vendor", id)
		}
		if !allow.Allows(id.Vendor, id.Device) {
			return nil, bad("%s is not on allow_devices (%s): gpuherd could not bind it", id, allow)
		}
	}
	return ids, nil
}

// LedgerPath is where the claims ledger lives.
func (c *Config) LedgerPath() string { return filepath.Join(c.DataDir, "ledger.db") }
