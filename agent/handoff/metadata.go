package handoff

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"

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

// DuplicateMetadataError is a domain whose <metadata> holds more than one
// gpuherd claim element: which one the domain runs on cannot be told.
type DuplicateMetadataError struct {
	Domain string
	Claims []string // the id of each element, in document order
}

func (e *DuplicateMetadataError) Error() string {
	ids := make([]string, len(e.Claims))
	for i, id := range e.Claims {
		ids[i] = fmt.Sprintf("%q", id)
	}
	return fmt.Sprintf("domain %s has %d gpuherd claim elements in its <metadata> (id %s): keep the one naming the claim it runs on (virsh edit %s)",
		e.Domain, len(e.Claims), strings.Join(ids, ", "), e.Domain)
}

// parseMetadata finds gpuherd's element among the children of the domain's
// <metadata> in the whole document data, so that every namespace
// declaration in scope counts: on <domain> (where Python's ElementTree
// moves it, as ns0), on <metadata>, on the element itself, or a default
// namespace. An element is gpuherd's by its namespace URI and local name
// alone; its prefix, attribute order, whitespace and comments do not
// matter, and an element "claim" of another namespace is not gpuherd's.
// ok is false when there is none; more than one is an error.
func parseMetadata(name string, data []byte) (m Metadata, ok bool, err error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var found []Metadata
	depth, inMetadata := 0, false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Metadata{}, false, fmt.Errorf("domain metadata: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			switch {
			case depth == 2 && t.Name.Local == "metadata":
				inMetadata = true
			case depth == 3 && inMetadata && t.Name.Space == Namespace && t.Name.Local == "claim":
				m, err := claimAttrs(t.Attr)
				if err != nil {
					return Metadata{}, false, err
				}
				found = append(found, m)
			}
		case xml.EndElement:
			if depth == 2 {
				inMetadata = false
			}
			depth--
		}
	}
	switch len(found) {
	case 0:
		return Metadata{}, false, nil
	case 1:
		return found[0], true, nil
	}
	dup := &DuplicateMetadataError{Domain: name}
	for _, f := range found {
		dup.Claims = append(dup.Claims, f.Claim)
	}
	return Metadata{}, false, dup
}

// claimAttrs reads the attributes of gpuherd's element. They are in no
// namespace, as gpuherd writes them; a namespace declaration (xmlns:id=…)
// or an attribute of another namespace is not one of them.
func claimAttrs(attrs []xml.Attr) (Metadata, error) {
	var m Metadata
	for _, a := range attrs {
		if a.Name.Space != "" {
			continue
		}
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
				return Metadata{}, fmt.Errorf("gpuherd metadata: release-on-stop=%q: use yes or no", a.Value)
			}
		}
	}
	return m, nil
}
