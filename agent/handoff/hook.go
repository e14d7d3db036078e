package handoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// MaxDomainXML bounds what the hook reads from stdin; a domain's XML is a
// few kilobytes.
const MaxDomainXML = 16 << 20

// Agent is the local agent as the hook uses it; *api.Client implements it.
type Agent interface {
	UseClaim(ctx context.Context, id string, req api.UseRequest) (api.Claim, error)
	EndUse(ctx context.Context, id, domainUUID string, release bool) (api.UseEnd, error)
}

// Devices tells, without the agent, whether a host PCI function is one of
// this server's GPUs or their companions; SysfsDevices implements it.
type Devices interface {
	Managed(addr string) bool
}

// Hook is gpuherd's libvirt QEMU hook (libvirt's docs/hooks.rst): libvirt
// runs it with NAME OP SUBOP EXTRA and the domain's XML on stdin, and a
// non-zero exit of prepare, migrate or restore refuses the operation with
// the hook's stderr as the reason. It never calls libvirt (libvirt waits
// for the hook: a call back would deadlock).
type Hook struct {
	Agent   Agent
	Devices Devices
	// Log takes what goes wrong in calls that must not fail (started,
	// reconnect, release), which libvirt does not show.
	Log *slog.Logger
	// Socket names the agent's socket in messages.
	Socket string
}

// Refusal is the error of a refused operation: its message is the one
// line libvirt shows.
type Refusal struct{ Msg string }

func (r *Refusal) Error() string { return r.Msg }

// Run handles one call. A non-nil error refuses the operation (only prepare
// begin, migrate begin and restore begin ever return one); stdin is always
// read to its end, so libvirt's write of the XML never fails.
//
//   - prepare begin: a domain with no gpuherd metadata and no hostdev that
//     is one of this server's GPUs passes at once. Otherwise every such
//     hostdev must be managed='no' and belong to the claim the metadata
//     names (or the claim named like the domain), committed on this server
//     and on vfio-pci; the claim is then marked in use by the domain's UUID.
//   - started begin, reconnect begin: the claim is marked in use by the
//     running domain; problems are logged, never returned (a failing
//     reconnect would kill the running guest).
//   - release end: the domain's use ends; when its metadata says
//     release-on-stop, the claim is released, but only when this domain
//     marked it in use and started (libvirt calls release after a refused
//     or failed start too).
//   - migrate begin, restore begin: refused unless the domain's GPUs are
//     claimed on this server; nothing is marked (prepare follows). Nothing
//     is written to stdout, which libvirt reads as "XML unchanged".
func (h *Hook) Run(ctx context.Context, args []string, stdin io.Reader) error {
	data, rerr := io.ReadAll(io.LimitReader(stdin, MaxDomainXML+1))
	_, _ = io.Copy(io.Discard, stdin)
	if len(args) < 3 {
		return &Refusal{Msg: fmt.Sprintf("gpuherd libvirt-hook: want NAME OP SUBOP [EXTRA] from libvirt, got %d argument(s)", len(args))}
	}
	name, op, sub := args[0], args[1], args[2]
	var mode string
	switch {
	case op == "prepare" && sub == "begin":
		mode = "prepare"
	case (op == "migrate" || op == "restore") && sub == "begin":
		mode = "check"
	case (op == "started" || op == "reconnect") && sub == "begin":
		mode = "running"
	case op == "release" && sub == "end":
		mode = "release"
	default:
		return nil
	}
	failClosed := mode == "prepare" || mode == "check"
	problem := func(err error) error {
		if failClosed {
			return err
		}
		h.Log.Warn("libvirt hook: "+err.Error(), "domain", name, "op", op, "subop", sub)
		return nil
	}
	if rerr == nil && len(data) > MaxDomainXML {
		rerr = fmt.Errorf("larger than %d bytes", MaxDomainXML)
	}
	if rerr != nil {
		return problem(&Refusal{Msg: fmt.Sprintf("gpuherd cannot read the XML of domain %s: %v", name, rerr)})
	}
	g, err := ParseDomain(data)
	var dup *DuplicateMetadataError
	switch {
	case errors.As(err, &dup):
		return problem(&Refusal{Msg: dup.Error()})
	case err != nil:
		return problem(&Refusal{Msg: fmt.Sprintf("gpuherd cannot read the XML of domain %s: %v", name, err)})
	}
	var managed []string
	for _, addr := range g.PCI {
		if h.Devices.Managed(addr) {
			managed = append(managed, addr)
		}
	}
	if !g.HasMetadata && len(managed) == 0 {
		return nil // not a gpuherd domain
	}
	id := g.ClaimID()
	if err := ledger.ValidateID(id); err != nil {
		return problem(&Refusal{Msg: api.NotClaimedMessage(fmt.Sprintf("%q", id), managed) +
			" (the domain's name is not a claim ID); " + metadataFix(g, managed, nil)})
	}
	var rebinds []string
	for _, addr := range managed {
		if slices.Contains(g.LibvirtManaged, addr) {
			rebinds = append(rebinds, addr)
		}
	}
	if len(rebinds) > 0 && mode != "release" {
		// libvirt would detach the device at start and re-attach it to its
		// host driver at stop, behind the ledger. A running domain is only
		// logged: its GPUs are in use.
		if err := problem(&Refusal{Msg: fmt.Sprintf("domain %s passes %s with managed='yes': libvirt would rebind them at its stop, and gpuherd owns their binding; use managed='no' (gpuherd get %s -o libvirt)",
			g.Name, strings.Join(rebinds, ", "), id)}); err != nil {
			return err
		}
	}
	if g.UUID == "" {
		return problem(&Refusal{Msg: fmt.Sprintf("domain %s has no <uuid>, and gpuherd marks its claim in use by the domain's UUID: give the domain one (libvirt assigns it at define: virsh define the XML rather than pass it by hand)", g.Name)})
	}

	if mode == "release" {
		end, err := h.Agent.EndUse(ctx, id, g.UUID, g.Metadata.ReleaseOnStop)
		if err != nil {
			return problem(h.agentError(g, id, err))
		}
		if end.Released {
			h.Log.Info("libvirt hook: claim released at domain stop", "domain", g.Name, "claim", id)
		} else if end.Reason != "" {
			h.Log.Info("libvirt hook: "+end.Reason, "domain", g.Name, "claim", id)
		}
		return nil
	}
	req := api.UseRequest{
		DomainUUID:   g.UUID,
		DomainName:   g.Name,
		PCIAddresses: g.PCI,
		CheckOnly:    mode == "check",
		Started:      mode == "running",
	}
	if _, err := h.Agent.UseClaim(ctx, id, req); err != nil {
		return problem(h.agentError(g, id, err))
	}
	return nil
}

// agentError turns the agent's answer into the line libvirt shows.
func (h *Hook) agentError(g Guest, id string, err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		if ae.Code == api.CodeNotClaimed && !g.HasMetadata {
			return &Refusal{Msg: ae.Message + "; " + metadataFix(g, ae.PCIAddresses, ae.HeldBy)}
		}
		return &Refusal{Msg: ae.Message}
	}
	if errors.Is(err, api.ErrAgentDown) {
		return &Refusal{Msg: fmt.Sprintf("gpuherd cannot check the GPUs of domain %s (claim %s): the agent is not running (no answer on %s); start it: systemctl start gpuherd", g.Name, id, h.Socket)}
	}
	return &Refusal{Msg: fmt.Sprintf("gpuherd cannot check the GPUs of domain %s (claim %s): %v", g.Name, id, err)}
}

// metadataFix tells the operator of a domain that passes this server's
// GPUs addrs without gpuherd's metadata (so its name was taken as the
// claim ID) how to name the claim: virsh metadata with gpuherd's namespace
// and the element it takes, or the <metadata> that gpuherd get prints.
// The claim is the one that holds the GPUs when exactly one does.
func metadataFix(g Guest, addrs, holders []string) string {
	claim := "CLAIM"
	if len(holders) == 1 {
		claim = holders[0]
	}
	dom := shellQuote(g.Name)
	fix := fmt.Sprintf("domain %s passes this server's GPUs %s without gpuherd metadata, so its name was taken as the claim ID; name the claim: virsh metadata %s --config --uri %s --key %s --set '<claim id=\"%s\"/>', or paste the <metadata> element of `gpuherd get %s -o libvirt` into the domain (virsh edit %s)",
		dom, strings.Join(addrs, ", "), dom, Namespace, prefix, claim, claim, dom)
	if claim == "CLAIM" {
		fix += "; CLAIM is the ID the VM's GPUs were claimed under (gpuherd claims)"
	}
	return fix
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// letters, digits and . _ - : (a domain name may hold spaces).
func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
