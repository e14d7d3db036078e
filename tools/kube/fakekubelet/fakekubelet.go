// Package fakekubelet plays the kubelet's part against a DRA kubelet plugin
// over the plugin's real Unix sockets: plugin registration
// (pluginregistration/v1 GetInfo and NotifyRegistrationStatus), then the DRA
// node service (dra/v1 NodePrepareResources and NodeUnprepareResources), and
// what the container runtime would do with the CDI device IDs that come back
// (ApplyCDI).
package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// callTimeout bounds each gRPC call when the caller's context has no
// deadline; the kubelet uses a similar per-call timeout.
const callTimeout = 45 * time.Second

// Plugin is a DRA plugin the fake kubelet registered and can call.
type Plugin struct {
	// Info is the plugin's GetInfo answer: Type "DRAPlugin", Name (the
	// driver name), Endpoint (the DRA socket path) and SupportedVersions
	// (gRPC service names such as "v1.DRAPlugin").
	Info *registerapi.PluginInfo

	conn   *grpc.ClientConn
	client drapb.DRAPluginClient
}

func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, callTimeout)
}

func dialUnix(path string) (*grpc.ClientConn, error) {
	// The kubelet dials "unix:<path>" without TLS in the same way.
	return grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// Register does what the kubelet's plugin manager does when a socket shows
// up in its plugins_registry directory: it calls GetInfo on the
// registration socket, checks that the plugin is a DRA plugin offering the
// v1 DRA service (the version a v1.37 kubelet prefers), connects to its
// endpoint and reports the outcome with NotifyRegistrationStatus. A
// rejected plugin gets PluginRegistered=false with the reason, as from a
// real kubelet, and Register returns the error.
func Register(ctx context.Context, registrationSocket string) (*Plugin, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	regConn, err := dialUnix(registrationSocket)
	if err != nil {
		return nil, fmt.Errorf("dial registration socket %s: %w", registrationSocket, err)
	}
	defer func() { _ = regConn.Close() }()
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo on %s: %w", registrationSocket, err)
	}
	p, verr := connect(info)
	status := &registerapi.RegistrationStatus{PluginRegistered: verr == nil}
	if verr != nil {
		status.Error = verr.Error()
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, status); err != nil {
		if p != nil {
			_ = p.Close()
		}
		return nil, errors.Join(verr, fmt.Errorf("NotifyRegistrationStatus on %s: %w", registrationSocket, err))
	}
	if verr != nil {
		return nil, verr
	}
	return p, nil
}

func connect(info *registerapi.PluginInfo) (*Plugin, error) {
	if info.Type != registerapi.DRAPlugin {
		return nil, fmt.Errorf("plugin %q has type %q, want %q", info.Name, info.Type, registerapi.DRAPlugin)
	}
	if info.Name == "" {
		return nil, errors.New("plugin has no name")
	}
	if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		return nil, fmt.Errorf("plugin %q offers %q, not %q", info.Name, info.SupportedVersions, drapb.DRAPluginService)
	}
	if !filepath.IsAbs(info.Endpoint) {
		return nil, fmt.Errorf("plugin %q endpoint %q is not an absolute socket path", info.Name, info.Endpoint)
	}
	if fi, err := os.Stat(info.Endpoint); err != nil || fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("plugin %q endpoint %q is not a socket (%v)", info.Name, info.Endpoint, err)
	}
	conn, err := dialUnix(info.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("dial DRA endpoint %s: %w", info.Endpoint, err)
	}
	return &Plugin{Info: info, conn: conn, client: drapb.NewDRAPluginClient(conn)}, nil
}

// Close closes the connection to the DRA endpoint.
func (p *Plugin) Close() error { return p.conn.Close() }

func pbClaims(claims []*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, 0, len(claims))
	for _, c := range claims {
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Uid: string(c.UID), Name: c.Name})
	}
	return out
}

// Device is one prepared device from a NodePrepareResources answer.
type Device struct {
	RequestNames []string
	PoolName     string
	DeviceName   string
	CDIDeviceIDs []string
	ShareID      string
}

// Prepared is the answer for one claim.
type Prepared struct {
	Devices []Device
	// Err is the plugin's per-claim error; the kubelet retries such claims.
	Err string
}

// CDIDeviceIDs returns all CDI device IDs of the answer, in order, without
// duplicates: what the kubelet hands the container runtime for a container
// that uses every request of the claim.
func (p Prepared) CDIDeviceIDs() []string {
	var ids []string
	for _, d := range p.Devices {
		for _, id := range d.CDIDeviceIDs {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// Prepare calls NodePrepareResources for claims, passing each claim's
// namespace, UID and name as the kubelet does (the plugin reads the rest
// from the API server). It returns the answer per claim UID and fails when
// the call fails or a claim gets no answer.
func (p *Plugin) Prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[types.UID]Prepared, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	resp, err := p.client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pbClaims(claims)})
	if err != nil {
		return nil, fmt.Errorf("NodePrepareResources: %w", err)
	}
	out := make(map[types.UID]Prepared, len(claims))
	for _, c := range claims {
		r, ok := resp.Claims[string(c.UID)]
		if !ok {
			return nil, fmt.Errorf("NodePrepareResources: no answer for claim %s/%s (%s)", c.Namespace, c.Name, c.UID)
		}
		prep := Prepared{Err: r.Error}
		for _, d := range r.Devices {
			prep.Devices = append(prep.Devices, Device{
				RequestNames: d.RequestNames,
				PoolName:     d.PoolName,
				DeviceName:   d.DeviceName,
				CDIDeviceIDs: d.CdiDeviceIds,
				ShareID:      d.GetShareId(),
			})
		}
		out[c.UID] = prep
	}
	return out, nil
}

// Unprepare calls NodeUnprepareResources for claims and returns the error
// string the plugin reported per claim UID ("" for success).
func (p *Plugin) Unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[types.UID]string, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	resp, err := p.client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims(claims)})
	if err != nil {
		return nil, fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	out := make(map[types.UID]string, len(claims))
	for _, c := range claims {
		r, ok := resp.Claims[string(c.UID)]
		if !ok {
			return nil, fmt.Errorf("NodeUnprepareResources: no answer for claim %s/%s (%s)", c.Namespace, c.Name, c.UID)
		}
		out[c.UID] = r.Error
	}
	return out, nil
}
