package handoff

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Namespace is the XML namespace of gpuherd's element in a domain's
// <metadata>; libvirt keeps an element of any namespace through define and
// dumpxml and hands it to hooks.
const Namespace = "https://github.com/gpuherd/gpuherd/xmlns/libvirt/1"

// prefix is the namespace prefix gpuherd writes; readers go by Namespace.
const prefix = "gpuherd"

// Metadata is what gpuherd keeps in a domain: the claim its GPUs belong to,
// the server that holds the claim, and whether stopping the domain
// releases the claim.
type Metadata struct {
	Claim         string
	Server        string
	ReleaseOnStop bool
}

// MetadataOf is the metadata of a domain that runs on claim c.
func MetadataOf(c api.Claim, o Options) Metadata {
	return Metadata{Claim: c.ID, Server: c.Node, ReleaseOnStop: o.ReleaseOnStop}
}

// marshal writes <gpuherd:claim xmlns:gpuherd="..." id= server= release-on-stop=/>.
func (m Metadata) marshal() ([]byte, error) {
	var b bytes.Buffer
	enc := xml.NewEncoder(&b)
	start := xml.StartElement{
		Name: xml.Name{Local: prefix + ":claim"},
		Attr: []xml.Attr{
			{Name: xml.Name{Local: "xmlns:" + prefix}, Value: Namespace},
			{Name: xml.Name{Local: "id"}, Value: m.Claim},
			{Name: xml.Name{Local: "server"}, Value: m.Server},
			{Name: xml.Name{Local: "release-on-stop"}, Value: yesNo(m.ReleaseOnStop)},
		},
	}
	if err := enc.EncodeToken(start); err != nil {
		return nil, fmt.Errorf("metadata of claim %s: %w", m.Claim, err)
	}
	if err := enc.EncodeToken(start.End()); err != nil {
		return nil, fmt.Errorf("metadata of claim %s: %w", m.Claim, err)
	}
	if err := enc.Flush(); err != nil {
		return nil, fmt.Errorf("metadata of claim %s: %w", m.Claim, err)
	}
	// An element with no content reads better self-closed.
	return bytes.Replace(b.Bytes(), []byte("></"+prefix+":claim>"), []byte("/>"), 1), nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// parseMetadata finds gpuherd's element among the children of a domain's
// <metadata> (inner is their XML); ok is false when there is none.
func parseMetadata(inner string) (m Metadata, ok bool, err error) {
	dec := xml.NewDecoder(bytes.NewReader([]byte(inner)))
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return Metadata{}, false, nil
		}
		if err != nil {
			return Metadata{}, false, fmt.Errorf("domain metadata: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			if depth != 1 || t.Name.Space != Namespace || t.Name.Local != "claim" {
				continue
			}
			for _, a := range t.Attr {
				switch a.Name.Local {
				case "id":
					m.Claim = a.Value
				case "server":
					m.Server = a.Value
				case "release-on-stop":
					switch a.Value {
					case "yes":
						m.ReleaseOnStop = true
					case "no", "":
					default:
						return Metadata{}, false, fmt.Errorf("gpuherd metadata: release-on-stop=%q: use yes or no", a.Value)
					}
				}
			}
			return m, true, nil
		case xml.EndElement:
			depth--
		}
	}
}
