package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/metrics"
	"github.com/gpuherd/gpuherd/vfio"
)

// validateValues checks the values Validate's older rules do not: what a
// name may contain, the models and the deny list.
func (c *Config) validateValues() error {
	bad := func(key, format string, args ...any) error {
		return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	for _, r := range c.NodeName {
		// The name reaches terminals, logs and other servers: a control
		// character or an escape would rewrite what an operator sees.
		if !unicode.IsPrint(r) || r == '\\' || r == '"' || r == '\'' {
			return bad("node_name", "%q holds a control character, quote or escape: use letters, digits, '.' and '-'", c.NodeName)
		}
	}
	cat, err := c.Catalog()
	if err != nil {
		return err
	}
	if _, err := c.canonicalOffered(cat); err != nil {
		return err
	}
	for _, addr := range c.DenyDevices {
		if err := vfio.ValidateAddress(addr); err != nil {
			return bad("deny_devices", "%v (give PCI addresses such as 0000:3b:00.0, as lspci -D shows them)", err)
		}
	}
	if _, err := host.ParseFabricMode(c.FabricMode); err != nil {
		return bad("fabric_mode", "%v", err)
	}
	for _, seed := range c.Join {
		host := seed
		if h, p, err := net.SplitHostPort(seed); err == nil {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return bad("join", "%q: the port must be a number from 1 to 65535", seed)
			}
			host = h
		}
		if host == "" || strings.ContainsAny(host, " /\\") {
			return bad("join", "%q: give HOST or HOST:PORT of another server's gossip", seed)
		}
	}
	if c.MetricsWebConfig != "" && c.MetricsAddr == "" {
		return bad("metrics_web_config", "set without metrics_addr: there is no metrics listener to secure")
	}
	return nil
}

// Check is the whole check of a configuration on this host, without
// touching any device or binding anything: every value (Validate), then
// what the values name on this machine (CheckHost). `gpuherd config check`
// runs it; the agent runs it before it moves any driver.
func (c *Config) Check() error {
	if err := c.Validate(); err != nil {
		return err
	}
	return c.CheckHost()
}

// CheckHost checks what the configuration names on this host: paths, the
// socket group, ports, the TLS files and the gossip key. Every problem is
// reported, not only the first.
func (c *Config) CheckHost() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)})
	}
	// Paths.
	for _, p := range []struct{ key, path string }{{"data_dir", c.DataDir}, {"socket", c.Socket}} {
		if !filepath.IsAbs(p.path) {
			bad(p.key, "%q is not an absolute path", p.path)
		}
	}
	if fi, err := os.Stat(c.DataDir); err == nil && !fi.IsDir() {
		bad("data_dir", "%s exists and is not a directory", c.DataDir)
	}
	if err := checkSocketPath(c.Socket); err != nil {
		bad("socket", "%v", err)
	}
	if c.Simulate == "" {
		for _, p := range []struct{ key, path string }{{"sysfs_root", c.SysfsRoot}, {"dev_root", c.DevRoot}} {
			if fi, err := os.Stat(p.path); err != nil || !fi.IsDir() {
				bad(p.key, "%s is not a directory", p.path)
			}
		}
	}
	if c.Simulate != "" {
		if _, err := sim.Load(c.Simulate); err != nil {
			bad("simulate", "%v", err)
		}
	}
	if c.AdvertiseInterface != "" {
		if _, err := net.InterfaceByName(c.AdvertiseInterface); err != nil {
			bad("advertise_interface", "%q: %v (ip link lists this host's interfaces)", c.AdvertiseInterface, err)
		}
	}
	if c.SocketGroup != "" {
		if _, err := user.LookupGroup(c.SocketGroup); err != nil {
			var unknown user.UnknownGroupError
			if errors.As(err, &unknown) {
				bad("socket_group", "no group named %q on this host: create it (groupadd --system %s; the packages create gpuherd) or leave socket_group empty", c.SocketGroup, c.SocketGroup)
			} else {
				bad("socket_group", "%q: %v", c.SocketGroup, err)
			}
		}
	}
	if c.MetricsWebConfig != "" {
		if err := checkWebConfig(c.MetricsWebConfig); err != nil {
			bad("metrics_web_config", "%v", err)
		}
	}
	// Ports: each listener needs its own.
	ports := map[int]string{}
	for _, l := range []struct{ key, addr string }{{"metrics_addr", c.MetricsAddr}, {"gossip_addr", c.GossipAddr}, {"peer_addr", c.PeerAddr}, {"names_addr", c.NamesAddr}} {
		if l.addr == "" {
			continue
		}
		_, ps, err := net.SplitHostPort(l.addr)
		if err != nil {
			bad(l.key, "%q: use HOST:PORT", l.addr)
			continue
		}
		p, err := strconv.Atoi(ps)
		if err != nil || p < 0 || p > 65535 {
			bad(l.key, "port %q: use a number from 1 to 65535 (0 picks a free one)", ps)
			continue
		}
		if other, dup := ports[p]; dup && p != 0 {
			bad(l.key, "port %d is also %s's: each listener needs its own port", p, other)
		}
		ports[p] = l.key
	}
	// The cluster's secrets.
	if c.GossipAddr != "" || c.TLSCert != "" {
		if err := pki.CheckFiles(pki.Files{CA: c.TLSCA, Cert: c.TLSCert, Key: c.TLSKey}, c.NodeName, clock.Wall()); err != nil {
			bad("tls_cert", "%v", err)
		}
	}
	if c.GossipKeyFile != "" {
		if err := gossip.CheckKeyFile(c.GossipKeyFile); err != nil {
			bad("gossip_key_file", "%v", err)
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return &ConfigErrors{Errs: errs}
}

// checkSocketPath refuses a socket path the agent could not listen on: too
// long, under something that is not a directory, or taken by a file that is
// not a socket.
func checkSocketPath(path string) error {
	if len(path) > 100 {
		return fmt.Errorf("path %q is too long for a unix socket (max 100 bytes)", path)
	}
	dir := filepath.Dir(path)
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s is not a directory: the socket cannot be created under it", d)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", d, err)
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; remove it or choose another path", path)
	}
	return nil
}

// checkWebConfig validates the metrics listener's web configuration file.
func checkWebConfig(path string) error { return metrics.CheckWebConfig(path) }
