package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Client talks to an agent's API: over its unix socket, or over HTTPS with
// mutual TLS (NewRemoteClient).
type Client struct {
	base   string // scheme and authority
	target string // what to name in errors: the socket or host:port
	http   *http.Client
	// timeout bounds each call, answer read included, through its
	// context: http.Client's own Timeout would start a goroutine and a
	// timer per call for a transport of its own kind (the peer wire).
	timeout time.Duration
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:    4,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{base: "http://gpuherd", target: socket, http: &http.Client{Transport: tr}}
}

// NewRemoteClient talks to an agent's API at addr (host:port) over HTTPS
// with mutual TLS.
func NewRemoteClient(addr string, cfg *tls.Config) *Client {
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, IdleConnTimeout: 30 * time.Second}
	return &Client{base: "https://" + addr, target: addr, http: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Status returns the server's GPUs.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var v Status
	return v, c.do(ctx, http.MethodGet, "/status", nil, &v)
}

// Claim claims GPUs for id; calling it again with the same request is a no-op.
func (c *Client) Claim(ctx context.Context, id string, req ClaimRequest) (Claim, error) {
	var v Claim
	return v, c.do(ctx, http.MethodPut, "/claims/"+segment(id), req, &v)
}

// Get returns one claim.
func (c *Client) Get(ctx context.Context, id string) (Claim, error) {
	var v Claim
	return v, c.do(ctx, http.MethodGet, "/claims/"+segment(id), nil, &v)
}

// Claims lists the claims of the platform; Partial says whether a server
// did not answer.
func (c *Client) Claims(ctx context.Context) (ClaimList, error) {
	var v ClaimList
	return v, c.do(ctx, http.MethodGet, "/claims", nil, &v)
}

// Release frees a claim's GPUs.
func (c *Client) Release(ctx context.Context, id string) (Claim, error) {
	var v Claim
	return v, c.do(ctx, http.MethodDelete, "/claims/"+segment(id), releaseBody(ctx), &v)
}

// Drain stops new claims on a GPU.
func (c *Client) Drain(ctx context.Context, addr, reason string) (GPU, error) {
	var v GPU
	return v, c.do(ctx, http.MethodPut, "/gpus/"+segment(addr)+"/drain", DrainRequest{Reason: reason}, &v)
}

// Undrain offers a drained GPU again.
func (c *Client) Undrain(ctx context.Context, addr string) (GPU, error) {
	var v GPU
	return v, c.do(ctx, http.MethodDelete, "/gpus/"+segment(addr)+"/drain", nil, &v)
}

// Availability lists every model of the catalog with its free count.
func (c *Client) Availability(ctx context.Context) (Availability, error) {
	var v Availability
	return v, c.do(ctx, http.MethodGet, "/availability", nil, &v)
}

// Resize changes a claim's GPUs (model or count), in place or by a move.
func (c *Client) Resize(ctx context.Context, id string, req ResizeRequest) (Claim, error) {
	var v Claim
	return v, c.do(ctx, http.MethodPost, "/claims/"+segment(id)+"/resize", req, &v)
}

// Members lists the servers of the platform.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	var v []Member
	return v, c.do(ctx, http.MethodGet, "/members", nil, &v)
}

// DrainServer cordons the agent's server.
func (c *Client) DrainServer(ctx context.Context, reason string) (Member, error) {
	var v Member
	return v, c.do(ctx, http.MethodPut, "/drain", ServerDrainRequest{Reason: reason}, &v)
}

// UndrainServer lifts the cordon.
func (c *Client) UndrainServer(ctx context.Context) (Member, error) {
	var v Member
	return v, c.do(ctx, http.MethodDelete, "/drain", nil, &v)
}

// CreateGroup creates a node group, all of it or nothing.
func (c *Client) CreateGroup(ctx context.Context, name string, req GroupRequest) (Group, error) {
	var v Group
	return v, c.do(ctx, http.MethodPut, "/groups/"+segment(name), req, &v)
}

// GetGroup returns a node group with its claims.
func (c *Client) GetGroup(ctx context.Context, name string) (Group, error) {
	var v Group
	return v, c.do(ctx, http.MethodGet, "/groups/"+segment(name), nil, &v)
}

// ResizeGroup changes the GPUs of every node of a group.
func (c *Client) ResizeGroup(ctx context.Context, name string, req ResizeRequest) (Group, error) {
	var v Group
	return v, c.do(ctx, http.MethodPost, "/groups/"+segment(name)+"/resize", req, &v)
}

// RepairGroup places again the node claims of a group that no server
// holds (released directly), with the GPUs of its other nodes.
func (c *Client) RepairGroup(ctx context.Context, name string) (Group, error) {
	var v Group
	return v, c.do(ctx, http.MethodPost, "/groups/"+segment(name)+"/repair", nil, &v)
}

// DeleteGroup releases every node's claim and forgets the group.
func (c *Client) DeleteGroup(ctx context.Context, name string) (Group, error) {
	var v Group
	return v, c.do(ctx, http.MethodDelete, "/groups/"+segment(name), nil, &v)
}

// Version returns the agent's build.
func (c *Client) Version(ctx context.Context) (VersionInfo, error) {
	var v VersionInfo
	return v, c.do(ctx, http.MethodGet, "/version", nil, &v)
}

// segment escapes one path segment. "." and ".." are escaped too, or the
// server would clean them away and route the call elsewhere; the agent then
// refuses them as IDs with a clear error.
func segment(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}

// ErrAgentDown means nothing answers at the agent's address: its socket,
// or a remote agent's host:port.
var ErrAgentDown = errors.New("agent not reachable")

// ErrPermission means the socket refused this user.
var ErrPermission = errors.New("permission denied")

// remote reports whether the client talks to an agent over the network.
func (c *Client) remote() bool { return strings.HasPrefix(c.base, "https://") }

// rootCause is the innermost error of a failed request, without the URL
// that http.Client adds ("Get \"https://...\": dial tcp ...").
func rootCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+"/"+Version+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("talking to the agent on %s: %w", c.target, err)
		}
		if c.remote() {
			// Another server's agent: the local socket and its flags have
			// nothing to do with it.
			return fmt.Errorf("%w at %s: the gpuherd agent on that server is down or cannot be reached (%w)", ErrAgentDown, c.target, rootCause(err))
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w on %s (is `gpuherd agent` running? set --socket or GPUHERD_SOCKET)", ErrAgentDown, c.target)
		}
		if errors.Is(err, syscall.EACCES) {
			return fmt.Errorf("%w on %s: run as root or as a member of the socket's group", ErrPermission, c.target)
		}
		return fmt.Errorf("%w: talking to the agent on %s: %w", ErrAgentDown, c.target, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the agent's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var eb ErrorBody
		if err := json.Unmarshal(data, &eb); err != nil || eb.Error == nil {
			return fmt.Errorf("agent answered %s: %s", resp.Status, truncate(string(data), 200))
		}
		eb.Error.Status = resp.StatusCode
		return eb.Error
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding the agent's answer: %w", err)
	}
	return nil
}
