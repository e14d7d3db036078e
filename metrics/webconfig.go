package metrics

import (
	"fmt"

	"github.com/prometheus/exporter-toolkit/web"
)

// CheckWebConfig validates an exporter-toolkit web configuration file (TLS
// server certificate, client CAs, basic-auth users with bcrypt hashes), the
// format node_exporter reads with --web.config.file.
func CheckWebConfig(path string) error {
	if err := web.Validate(path); err != nil {
		return fmt.Errorf("web config %s: %w", path, err)
	}
	return nil
}

// UseWebConfig makes Serve answer with the TLS and basic auth of an
// exporter-toolkit web configuration file (see CheckWebConfig); the file is
// re-read on every new connection, as node_exporter does, so a renewed
// certificate needs no restart.
func (s *Server) UseWebConfig(path string) error {
	if err := CheckWebConfig(path); err != nil {
		return err
	}
	s.webConfig = path
	return nil
}

// serve runs the HTTP server on the listener, through exporter-toolkit when
// a web configuration is set.
func (s *Server) serve() error {
	if s.webConfig == "" {
		return s.srv.Serve(s.ln)
	}
	addr := s.ln.Addr().String()
	systemdSocket := false
	flags := &web.FlagConfig{
		WebListenAddresses: &[]string{addr},
		WebSystemdSocket:   &systemdSocket,
		WebConfigFile:      &s.webConfig,
	}
	return web.Serve(s.ln, s.srv, flags, s.log)
}
