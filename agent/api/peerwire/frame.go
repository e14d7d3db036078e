// Package peerwire carries the peer API's HTTP requests between agents in
// length-prefixed frames on one mutual-TLS connection per pair, instead of
// HTTP/2. It is chosen by ALPN (Proto) on the same listener, so a server
// still answers HTTP/2 and HTTP/1.1 clients, and a client falls back to
// HTTP/2 on a server that does not offer it.
//
// Why: every claim makes several peer calls, and HTTP/2's framing, header
// compression, flow control and per-stream goroutines cost more CPU than
// the handlers they carry (docs/protocol.md, "Peer wire"). The handlers,
// the requests and the answers are the same http.Handler and http.Request
// as over HTTP/2: only the bytes on the wire differ.
//
// A frame is
//
//	u32 length of what follows | u8 kind | u32 stream | payload
//
// with the payload of each kind:
//
//	request:  u8 method length, method, u16 target length, target
//	          (path and query), headers, body (the rest)
//	response: u16 status, headers, body (the rest)
//	cancel:   nothing (the caller gave up on that stream)
//	goaway:   nothing; the stream is the last one the server read, and it
//	          reads no more: every later stream was never seen and may be
//	          sent again on another connection
//	reset:    nothing; the server gives no answer to that stream (its
//	          handler panicked or aborted): an error for the caller, whose
//	          outcome is unknown, as an HTTP/2 stream reset is
//	ping:     nothing; the server answers pong with the same stream (a
//	          caller whose call timed out with nothing heard since checks
//	          that the connection still carries anything)
//	pong:     nothing
//
// and headers as u16 count, then per header u16 name length, name, u16
// value length, value. Every number is big-endian.
package peerwire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"

	"golang.org/x/net/http/httpguts"
)

// Proto is the ALPN name of this wire.
const Proto = "gpuherd-peer/1"

// Frame kinds.
const (
	kindRequest  byte = 1
	kindResponse byte = 2
	kindCancel   byte = 3
	kindGoAway   byte = 4
	kindPing     byte = 5
	kindPong     byte = 6
	kindReset    byte = 7
)

const (
	// frameHeader is the length, kind and stream of every frame.
	frameHeader = 4 + 1 + 4
	// MaxHeaderBytes bounds the method, target and headers of one frame,
	// as the HTTP/2 listener's MaxHeaderBytes does.
	MaxHeaderBytes = 16 << 10
	// maxHeaders bounds the number of headers of one frame.
	maxHeaders = 64
	// MaxResponseBytes bounds a response's body: the largest peer answer
	// (the registry's list at 10,000 servers) is a few MiB.
	MaxResponseBytes = 64 << 20
	// connBuffer is each connection's read and write buffer, on both
	// ends. A frame is a few hundred bytes; a longer one is read and
	// written through. An agent of a 1,000-server cluster may hold a
	// connection to every other (the registry's leader does), so the
	// buffers, not the frames, are what a connection costs.
	connBuffer = 4 << 10
	// maxDiscard bounds a request over the server's limit that it reads
	// past to answer 413 on its stream; a longer one ends the connection.
	maxDiscard = 64 << 20
)

// errProtocol is a frame that breaks this format: the connection closes.
type errProtocol string

func (e errProtocol) Error() string { return "peer wire: " + string(e) }

// frame is one frame read.
type frame struct {
	kind   byte
	stream uint32
	body   []byte // the payload
}

// errOversized is a frame over the limit that was read past (its payload
// dropped), with its kind and stream, so that its stream can be answered.
type errOversized struct {
	kind   byte
	stream uint32
	size   uint32
}

func (e *errOversized) Error() string {
	return fmt.Sprintf("peer wire: frame of %d bytes over the limit", e.size)
}

// readFrame reads one frame whose payload is at most max bytes. A longer
// one, up to maxDiscard, is read past and reported as *errOversized.
func readFrame(r *bufio.Reader, max int) (frame, error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 5 {
		return frame{}, errProtocol(fmt.Sprintf("frame of %d bytes is shorter than its kind and stream", n))
	}
	over := int64(n)-5 > int64(max)
	if over && int64(n)-5 > maxDiscard {
		return frame{}, errProtocol(fmt.Sprintf("frame of %d bytes is over the limit of %d", n, max+5))
	}
	if _, err := io.ReadFull(r, hdr[4:]); err != nil {
		return frame{}, noEOF(err)
	}
	f := frame{kind: hdr[4], stream: binary.BigEndian.Uint32(hdr[5:])}
	if over {
		if _, err := io.CopyN(io.Discard, r, int64(n)-5); err != nil {
			return frame{}, noEOF(err)
		}
		return f, &errOversized{kind: f.kind, stream: f.stream, size: n}
	}
	f.body = make([]byte, n-5)
	if _, err := io.ReadFull(r, f.body); err != nil {
		return frame{}, noEOF(err)
	}
	return f, nil
}

// noEOF is err, with a frame cut short named as such.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendFrameHeader starts a frame in b; finishFrame writes its length.
func appendFrameHeader(b []byte, kind byte, stream uint32) []byte {
	b = append(b, 0, 0, 0, 0, kind)
	return binary.BigEndian.AppendUint32(b, stream)
}

func finishFrame(b []byte) []byte {
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// emptyFrame is a frame of kind on stream without a payload.
func emptyFrame(kind byte, stream uint32) []byte {
	return finishFrame(appendFrameHeader(make([]byte, 0, frameHeader), kind, stream))
}

// appendHeaders writes h, or fails when it is over the limits.
func appendHeaders(b []byte, h http.Header) ([]byte, error) {
	count := 0
	for _, vs := range h {
		count += len(vs)
	}
	if count > maxHeaders {
		return nil, fmt.Errorf("peer wire: %d headers, over the limit of %d", count, maxHeaders)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(count))
	size := 0
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("peer wire: header name %.64q is not a token", k)
		}
		for _, v := range vs {
			if size += len(k) + len(v) + 4; size > MaxHeaderBytes {
				return nil, fmt.Errorf("peer wire: headers over %d bytes", MaxHeaderBytes)
			}
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("peer wire: header %.64q has a control character in its value", k)
			}
			b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
			b = append(b, k...)
			b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
			b = append(b, v...)
		}
	}
	return b, nil
}

// decoder reads a payload field by field; the first short read sticks.
type decoder struct {
	b   []byte
	err error
	// used counts the bytes of method, target and headers read.
	used int
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = errProtocol(what)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail(what + " cut short")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	d.used += n
	return v
}

func (d *decoder) u8(what string) int {
	v := d.take(1, what)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (d *decoder) u16(what string) int {
	v := d.take(2, what)
	if v == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(v))
}

func (d *decoder) str16(what string) string {
	return string(d.take(d.u16(what), what))
}

// headers reads a header block, canonicalizing the names as net/http's
// servers do, and checking every name and value as they do.
func (d *decoder) headers() http.Header {
	n := d.u16("header count")
	if n > maxHeaders {
		d.fail(fmt.Sprintf("%d headers, over the limit of %d", n, maxHeaders))
		return nil
	}
	h := make(http.Header, n)
	if d.used > MaxHeaderBytes {
		d.fail(fmt.Sprintf("method and target over %d bytes", MaxHeaderBytes))
		return nil
	}
	for range n {
		k := d.str16("header name")
		v := d.str16("header value")
		if d.err != nil {
			return nil
		}
		if d.used > MaxHeaderBytes {
			d.fail(fmt.Sprintf("headers over %d bytes", MaxHeaderBytes))
			return nil
		}
		if !httpguts.ValidHeaderFieldName(k) {
			d.fail(fmt.Sprintf("header name %.64q is not a token", k))
			return nil
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			d.fail(fmt.Sprintf("header %.64q has a control character in its value", k))
			return nil
		}
		h.Add(textproto.CanonicalMIMEHeaderKey(k), v)
	}
	return h
}
