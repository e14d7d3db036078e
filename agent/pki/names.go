package pki

import (
	"crypto/x509"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
)

// maxNodeName keeps a node name usable as one DNS label's worth of text and
// as a gossip member name.
const maxNodeName = 63

// uriScheme and uriPrefix form the URI SAN that names a node: a SAN of its
// own, so a DNS name given with --host can never be mistaken for an identity.
const (
	uriScheme = "gpuherd"
	uriPrefix = "node:"
)

// nodeNameRE: lower-case letters, digits, dots and dashes, starting and
// ending with a letter or digit so that the name is also a valid DNS SAN.
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

// dnsLabelRE is one label of a DNS name (RFC 1123, case-insensitive).
var dnsLabelRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`)

// ValidateNodeName reports whether name can name a node in a certificate.
func ValidateNodeName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("node name is empty")
	case len(name) > maxNodeName:
		return fmt.Errorf("node name %q is %d characters; at most %d are allowed", name, len(name), maxNodeName)
	case !nodeNameRE.MatchString(name) || strings.Contains(name, ".."):
		return fmt.Errorf("node name %q: use lower-case letters, digits, '.' and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// ValidateHost reports whether h is an IP address or a DNS name that can go
// into a certificate's subject alternative names.
func ValidateHost(h string) error {
	if h == "" {
		return fmt.Errorf("host is empty: give an IP address or a DNS name")
	}
	if strings.ContainsAny(h, "[]%") {
		return fmt.Errorf("host %q: give a bare IP address (no brackets, no zone) or a DNS name", h)
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	name := strings.TrimSuffix(h, ".")
	if len(name) > 253 {
		return fmt.Errorf("host %q is longer than a DNS name may be (253 characters)", h)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) > 63 || !dnsLabelRE.MatchString(label) {
			return fmt.Errorf("host %q is neither an IP address nor a DNS name (labels of letters, digits and '-', at most 63 characters)", h)
		}
	}
	return nil
}

// nodeURI is the URI SAN that carries a node's identity.
func nodeURI(name string) *url.URL {
	return &url.URL{Scheme: uriScheme, Opaque: uriPrefix + name}
}

// NodeName returns the node a certificate was issued to: the name in its
// "gpuherd:node:NAME" URI SAN, which must agree with the common name, or,
// for certificates from a CA that cannot add that URI, the common name alone.
// It does not verify the certificate; callers use it on verified chains.
func NodeName(cert *x509.Certificate) (string, error) {
	var fromURI []string
	for _, u := range cert.URIs {
		if u.Scheme == uriScheme && strings.HasPrefix(u.Opaque, uriPrefix) {
			fromURI = append(fromURI, strings.TrimPrefix(u.Opaque, uriPrefix))
		}
	}
	cn := cert.Subject.CommonName
	var name string
	switch len(fromURI) {
	case 0:
		name = cn
	case 1:
		name = fromURI[0]
		if cn != "" && cn != name {
			return "", fmt.Errorf("certificate %q names node %q in its URI SAN but %q in its common name; reissue it", cn, name, cn)
		}
	default:
		return "", fmt.Errorf("certificate %q names %d nodes in its URI SANs (%s); a certificate must name one node", cn, len(fromURI), strings.Join(fromURI, ", "))
	}
	if err := ValidateNodeName(name); err != nil {
		return "", fmt.Errorf("certificate does not name a node: %w", err)
	}
	return name, nil
}
