package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// Default validities: a CA outlives many node certificates, and a node
// certificate is short enough that rotating it is routine.
const (
	defaultCADays   = 3650
	defaultCertDays = 365
	// maxDays keeps days×24h far inside time.Duration (about 292 years).
	maxDays = 36500
)

func newTLSCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Make the CA and node certificates for mutual TLS between agents",
		Long: `Agents talk to each other, and remote clients to agents, over HTTPS with mutual
TLS: every party presents a certificate signed by the cluster's CA, and that
certificate names its node. A test cluster is two commands away:

  gpuherd tls ca --dir ./pki/ca
  gpuherd tls cert gpu-01 --ca-dir ./pki/ca --out ./pki/gpu-01 --host 10.0.0.7

Existing files are never overwritten.`,
		Args: cli.ExactArgs(0, "a subcommand: ca or cert"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cli.Usagef("tls: give a subcommand: ca or cert (see gpuherd tls --help)")
		},
	}
	cmd.AddCommand(newTLSCACmd(g), newTLSCertCmd(g))
	return cmd
}

// tlsCAResult is what `gpuherd tls ca -o json` prints.
type tlsCAResult struct {
	Name     string    `json:"name"`
	Cert     string    `json:"cert"`
	Key      string    `json:"key"`
	NotAfter time.Time `json:"not_after"`
}

func newTLSCACmd(g *globals) *cobra.Command {
	var (
		dir, name string
		days      int
	)
	cmd := &cobra.Command{
		Use:   "ca --dir DIR [--name NAME] [--days N]",
		Short: "Create a cluster CA (ca.crt, ca.key) in DIR",
		Long: `Create a new CA: DIR/ca.crt (0644), which every server needs to trust its
peers, and DIR/ca.key (0600), which signs node certificates and should stay
off the servers. DIR is created (0700) if missing.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			if dir == "" {
				return cli.Usagef("--dir: give the directory for the new CA")
			}
			validity, err := daysFlag(days)
			if err != nil {
				return err
			}
			if err := pki.CreateCA(dir, name, validity); err != nil {
				return err
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			res := tlsCAResult{Cert: filepath.Join(abs, pki.CACertFile), Key: filepath.Join(abs, pki.CAKeyFile)}
			ca, err := pki.LoadCertificate(res.Cert)
			if err != nil {
				return err
			}
			res.Name, res.NotAfter = ca.Subject.CommonName, ca.NotAfter.UTC()
			return g.show(res, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "Created CA %q, valid until %s.\n", res.Name, res.NotAfter.Format(time.DateOnly))
				fmt.Fprintf(w, "  %s\tcopy to every server (tls_ca)\n", res.Cert)
				fmt.Fprintf(w, "  %s\tkeep it safe and off the servers: it signs node certificates\n", res.Key)
				fmt.Fprintln(w, "Next, for each server:")
				fmt.Fprintf(w, "  gpuherd tls cert NODE --ca-dir %s --out DIR --host SERVER_IP\n", abs)
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for ca.crt and ca.key (created if missing)")
	cmd.Flags().StringVar(&name, "name", pki.DefaultCAName, "the CA's common name")
	cmd.Flags().IntVar(&days, "days", defaultCADays, "validity in days")
	return cmd
}

// tlsAgentConfig is the agent configuration that uses the issued files,
// keyed as in the agent's config file.
type tlsAgentConfig struct {
	TLSCA   string `json:"tls_ca"`
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
}

// tlsCertResult is what `gpuherd tls cert -o json` prints.
type tlsCertResult struct {
	Node     string         `json:"node"`
	Cert     string         `json:"cert"`
	Key      string         `json:"key"`
	CA       string         `json:"ca"`
	Names    []string       `json:"names"` // subject alternative names: DNS names, then IPs
	NotAfter time.Time      `json:"not_after"`
	Config   tlsAgentConfig `json:"agent_config"`
}

func newTLSCertCmd(g *globals) *cobra.Command {
	var (
		caDir, out string
		hosts      []string
		days       int
	)
	cmd := &cobra.Command{
		Use:   "cert NODE --ca-dir DIR --out DIR [--host IP_OR_DNS ...] [--days N]",
		Short: "Issue a certificate for a node, signed by the CA",
		Long: `Issue OUT/NODE.crt (0644) and OUT/NODE.key (0600) for the server whose agent
runs with node_name NODE. The certificate serves the node's API and
authenticates it to its peers. Agents check a peer by the node name in its
certificate, so --host is optional; give the server's IP addresses and DNS
names to let other clients verify it by the address they dial.`,
		Args: cli.ExactArgs(1, "one node name"),
		RunE: func(_ *cobra.Command, args []string) error {
			node := args[0]
			if err := pki.ValidateNodeName(node); err != nil {
				return cli.Usagef("NODE: %v", err)
			}
			if caDir == "" {
				return cli.Usagef("--ca-dir: give the directory made by \"gpuherd tls ca\"")
			}
			if out == "" {
				return cli.Usagef("--out: give the directory for %s.crt and %s.key", node, node)
			}
			for _, h := range hosts {
				if err := pki.ValidateHost(h); err != nil {
					return cli.Usagef("--host: %v", err)
				}
			}
			validity, err := daysFlag(days)
			if err != nil {
				return err
			}
			if err := pki.IssueCert(caDir, out, node, hosts, validity); err != nil {
				return err
			}
			res, err := certResult(caDir, out, node)
			if err != nil {
				return err
			}
			if len(hosts) == 0 {
				fmt.Fprintf(g.stderr, "gpuherd: note: no --host given; agents verify %s by its node name, but clients that verify by address will refuse it\n", node)
			}
			return g.show(res, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "Issued a certificate for node %q, valid until %s, for %s.\n", res.Node, res.NotAfter.Format(time.DateOnly), strings.Join(res.Names, ", "))
				fmt.Fprintf(w, "  %s\n  %s\n", res.Cert, res.Key)
				fmt.Fprintf(w, "Copy them and %s to %s (keep the key at mode 0600), and set in its agent config:\n", res.CA, res.Node)
				fmt.Fprintf(w, "  tls_ca: %s\n  tls_cert: %s\n  tls_key: %s\n", res.Config.TLSCA, res.Config.TLSCert, res.Config.TLSKey)
				fmt.Fprintln(w, "(paths as created here; change them if you copy the files elsewhere)")
			})
		},
	}
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "directory holding ca.crt and ca.key")
	cmd.Flags().StringVar(&out, "out", "", "directory for NODE.crt and NODE.key (created if missing)")
	cmd.Flags().StringSliceVar(&hosts, "host", nil, "IP address or DNS name of the server (repeatable, or comma-separated)")
	cmd.Flags().IntVar(&days, "days", defaultCertDays, "validity in days (at most the CA's remaining validity)")
	return cmd
}

// certResult describes the files IssueCert wrote, read back from them so
// the output shows exactly what was issued.
func certResult(caDir, out, node string) (tlsCertResult, error) {
	absCA, err := filepath.Abs(caDir)
	if err != nil {
		return tlsCertResult{}, err
	}
	absOut, err := filepath.Abs(out)
	if err != nil {
		return tlsCertResult{}, err
	}
	res := tlsCertResult{Node: node, CA: filepath.Join(absCA, pki.CACertFile)}
	res.Cert, res.Key = pki.NodeFiles(absOut, node)
	c, err := pki.LoadCertificate(res.Cert)
	if err != nil {
		return tlsCertResult{}, err
	}
	res.NotAfter = c.NotAfter.UTC()
	res.Names = append(res.Names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		res.Names = append(res.Names, ip.String())
	}
	res.Config = tlsAgentConfig{TLSCA: res.CA, TLSCert: res.Cert, TLSKey: res.Key}
	return res, nil
}

// daysFlag turns --days into a validity.
func daysFlag(days int) (time.Duration, error) {
	if days < 1 || days > maxDays {
		return 0, cli.Usagef("--days %d: give a number of days from 1 to %d", days, maxDays)
	}
	return time.Duration(days) * 24 * time.Hour, nil
}
