// Package controlplane runs a Kubernetes control plane inside the test
// process: an embedded etcd, kube-apiserver, kube-scheduler (with the
// DynamicResources plugin) and the ResourceClaim controller, all of release
// v1.37.2. No kubelet runs; pods are only scheduled, which is what DRA
// allocation tests need. Everything it starts stops on the TB's cleanup and
// everything it writes lives in temporary directories.
//
// It lives in a Go module of its own (tools/kube) so that the product module
// never requires k8s.io/kubernetes.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	klogtesting "k8s.io/klog/v2/ktesting"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// Options tunes Start. The zero value is a working control plane.
type Options struct {
	// APIServerFlags are appended to the kube-apiserver command line, e.g.
	// "--feature-gates=SomeGate=true" or "--runtime-config=...". The
	// defaults already serve resource.k8s.io/v1 with DynamicResourceAllocation
	// (GA, on by default in v1.37).
	APIServerFlags []string

	// Verbosity is the klog verbosity of the log output that the components
	// write through tb.Log (contextual logging). 0 keeps only the important
	// messages; 4 and up is very chatty.
	Verbosity int

	// StartTimeout bounds the whole start-up. Default: 2 minutes.
	StartTimeout time.Duration

	// NoScheduler leaves out kube-scheduler, for tests that bind by hand.
	NoScheduler bool

	// NoClaimController leaves out the ResourceClaim controller.
	NoClaimController bool
}

// ControlPlane is a running control plane; see Start.
type ControlPlane struct {
	// Config reaches kube-apiserver with full (loopback, system:masters)
	// rights. Callers may copy it, not change it.
	Config *rest.Config
	// Client is a clientset built from Config.
	Client kubernetes.Interface

	dir       string
	startTime time.Duration

	stopOnce sync.Once
	stops    []func() // in the order they must run
}

// defaultWaitTimeout bounds the helpers' waits when the caller's context has
// no deadline of its own, so that a broken test fails instead of hanging.
const defaultWaitTimeout = time.Minute

// Start runs etcd, kube-apiserver, kube-scheduler and the ResourceClaim
// controller and returns once the apiserver is healthy and the scheduler's
// and controller's informers have synced. It calls tb.Fatal when anything
// fails to come up. All of it stops when tb's cleanups run (or on Stop).
func Start(tb TB, opts Options) *ControlPlane {
	tb.Helper()
	cp, err := start(tb, opts)
	if err != nil {
		tb.Fatalf("start control plane: %v", err)
	}
	return cp
}

func start(tb TB, opts Options) (_ *ControlPlane, finalErr error) {
	began := time.Now()
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	// Component logs go through tb.Log (so go test shows them only for
	// failing or verbose tests), at the verbosity the caller chose: the
	// ktesting default (5) makes the apiserver alone log megabytes.
	logger := klogtesting.NewLogger(tb, klogtesting.NewConfig(klogtesting.Verbosity(opts.Verbosity)))
	// (The logger registers a cleanup that ends its output; registering
	// Stop after it makes Stop run first, so shutdown is still logged.)
	dir, err := os.MkdirTemp("", "controlplane-")
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{dir: dir}
	// Registered first so that it runs last, after every component stopped.
	cp.stops = append(cp.stops, func() { _ = os.RemoveAll(dir) })
	tb.Cleanup(cp.Stop)
	defer func() {
		if finalErr != nil {
			cp.Stop()
		}
	}()

	baseCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	cp.stops = append([]func(){cancel}, cp.stops...)

	startCtx, cancelStart := context.WithTimeout(baseCtx, opts.StartTimeout)
	defer cancelStart()

	endpoint, stopEtcd, err := startEtcd(startCtx, filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	cp.stops = append([]func(){stopEtcd}, cp.stops...)

	// A random prefix, as the Kubernetes integration tests do, keeps the keys
	// of two apiservers apart even if they ever share one etcd.
	storage := storagebackend.NewDefaultConfig(filepath.Join("/", string(uuid.NewUUID()), "registry"), nil)
	storage.Transport.ServerList = []string{endpoint}

	flags := []string{
		// The loopback address the test server advertises is not a
		// reachable endpoint for the "kubernetes" Service.
		"--endpoint-reconciler-type=none",
		// No ServiceAccount controller creates the "default" account that
		// this admission plugin would require of every pod.
		"--disable-admission-plugins=ServiceAccount",
	}
	flags = append(flags, opts.APIServerFlags...)
	// StartTestServer wants a ktesting.TContext for its logger and
	// cancellation; InitCtx wraps ours instead of ktesting.Init's, whose
	// default verbosity is far too chatty.
	tCtx := ktesting.InitCtx(baseCtx, tb)
	serverOpts := kubeapiservertesting.NewDefaultTestServerOptions()
	// The invariant check scrapes apiserver metrics for the e2e suite's
	// expectations; it has nothing to say about these tests.
	serverOpts.DisableInvariantChecks = true
	// No client-certificate and front-proxy authentication: clients here
	// use the loopback token, and the front-proxy client certificate the
	// aggregator would load makes client-go start a certificate reloader
	// in its process-wide transport cache that never stops.
	serverOpts.EnableCertAuth = false
	server, err := kubeapiservertesting.StartTestServer(tCtx, serverOpts, flags, storage)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	cp.stops = append([]func(){server.TearDownFn}, cp.stops...)

	cp.Config = rest.CopyConfig(server.ClientConfig)
	cp.Client, err = kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}

	if !opts.NoScheduler {
		stop, err := startScheduler(baseCtx, startCtx, cp.Client, cp.Config)
		if err != nil {
			return nil, fmt.Errorf("kube-scheduler: %w", err)
		}
		cp.stops = append([]func(){stop}, cp.stops...)
	}
	if !opts.NoClaimController {
		stop, err := startClaimController(baseCtx, startCtx, cp.Client)
		if err != nil {
			return nil, fmt.Errorf("resourceclaim controller: %w", err)
		}
		cp.stops = append([]func(){stop}, cp.stops...)
	}
	cp.startTime = time.Since(began)
	tb.Logf("control plane up in %v (apiserver %s)", cp.startTime.Round(time.Millisecond), cp.Config.Host)
	return cp, nil
}

// StartupTime is how long Start took.
func (cp *ControlPlane) StartupTime() time.Duration { return cp.startTime }

// Dir is the control plane's private temporary directory (etcd data,
// kubeconfig); it is removed on Stop.
func (cp *ControlPlane) Dir() string { return cp.dir }

// Stop stops every component, newest first, and removes the temporary
// files. It waits for the components' goroutines. Start registers it as a
// cleanup; calling it earlier (e.g. to check for leaks) is fine.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		for _, stop := range cp.stops {
			stop()
		}
	})
}

// startEtcd runs an embedded single-member etcd on loopback ports the kernel
// picks, so nothing can take them between choosing and binding.
func startEtcd(ctx context.Context, dataDir string) (endpoint string, stop func(), err error) {
	cfg := embed.NewConfig()
	cfg.Name = "controlplane"
	cfg.Dir = dataDir
	// A throwaway single-member store: losing data on a crash is fine and
	// fsync would dominate the apiserver's write latency.
	cfg.UnsafeNoFsync = true
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{local}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// No metrics listener: embed adds none unless ListenMetricsUrls is set.

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return "", nil, err
	case <-ctx.Done():
		e.Close()
		return "", nil, fmt.Errorf("not ready: %w", context.Cause(ctx))
	}
	if len(e.Clients) == 0 {
		e.Close()
		return "", nil, errors.New("no client listener")
	}
	return "http://" + e.Clients[0].Addr().String(), e.Close, nil
}

// startScheduler runs kube-scheduler's default profile (which includes the
// DynamicResources plugin) the way kube-scheduler would, minus leader
// election and its HTTP endpoints.
func startScheduler(ctx, startCtx context.Context, client kubernetes.Interface, config *rest.Config) (stop func(), err error) {
	var cfg schedulerconfig.KubeSchedulerConfiguration
	gvk := schema.GroupVersionKind{Group: "kubescheduler.config.k8s.io", Version: "v1", Kind: "KubeSchedulerConfiguration"}
	// Decoding an empty v1 document applies the v1 defaults: the default
	// profile and plugin set, exactly what a stock kube-scheduler runs.
	if _, _, err := schedulerscheme.Codecs.UniversalDecoder().Decode([]byte(`{}`), &gvk, &cfg); err != nil {
		return nil, fmt.Errorf("default configuration: %w", err)
	}

	ctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "scheduler")))
	informerFactory := scheduler.NewInformerFactory(client, 0, nil)
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
		broadcaster.Shutdown()
		informerFactory.Shutdown()
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()

	sched, err := scheduler.New(ctx, client, informerFactory, nil,
		profile.NewRecorderFactory(broadcaster),
		scheduler.WithKubeConfig(config),
		scheduler.WithProfiles(cfg.Profiles...),
		scheduler.WithPercentageOfNodesToScore(cfg.PercentageOfNodesToScore),
		scheduler.WithParallelism(cfg.Parallelism),
		// Short backoffs: a pod that was unschedulable because a slice or
		// node was not there yet is retried within a second of it appearing.
		scheduler.WithPodInitialBackoffSeconds(1),
		scheduler.WithPodMaxBackoffSeconds(1),
	)
	if err != nil {
		return nil, err
	}
	broadcaster.StartRecordingToSink(ctx.Done())
	informerFactory.Start(ctx.Done())
	for typ, ok := range informerFactory.WaitForCacheSync(startCtx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	if err := sched.WaitForHandlersSync(startCtx); err != nil {
		return nil, fmt.Errorf("event handlers did not sync: %w", err)
	}
	wg.Go(func() { sched.Run(ctx) })
	return stop, nil
}

// startClaimController runs pkg/controller/resourceclaim, the part of
// kube-controller-manager that creates claims from ResourceClaimTemplates,
// records them in pod.status.resourceClaimStatuses, and removes pods that
// are gone or done from status.reservedFor (which deallocates the claim).
func startClaimController(ctx, startCtx context.Context, client kubernetes.Interface) (stop func(), err error) {
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "resourceclaim-controller")))
	factory := informers.NewSharedInformerFactory(client, 0)
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
	}
	controller, err := resourceclaim.NewController(klog.FromContext(ctx), client,
		factory.Core().V1().Pods(),
		// Only consulted with the (off by default) workload features; the
		// informer is created lazily, so scheduling.k8s.io/v1beta1 need
		// not be served.
		factory.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates(),
	)
	if err != nil {
		stop()
		return nil, err
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(startCtx.Done()) {
		if !ok {
			stop()
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	wg.Go(func() { controller.Run(ctx, 2) })
	return stop, nil
}

// WriteKubeconfig writes a kubeconfig file for Config to path, for
// components (like a DRA kubelet plugin) that take a kubeconfig path.
func (cp *ControlPlane) WriteKubeconfig(path string) error {
	c := cp.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["controlplane"] = &clientcmdapi.Cluster{
		Server:                   c.Host,
		CertificateAuthorityData: c.TLSClientConfig.CAData,
		CertificateAuthority:     c.TLSClientConfig.CAFile,
		TLSServerName:            c.TLSClientConfig.ServerName,
		InsecureSkipTLSVerify:    c.TLSClientConfig.Insecure,
	}
	kc.AuthInfos["controlplane"] = &clientcmdapi.AuthInfo{
		Token:                 c.BearerToken,
		ClientCertificateData: c.TLSClientConfig.CertData,
		ClientKeyData:         c.TLSClientConfig.KeyData,
	}
	kc.Contexts["controlplane"] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: "controlplane"}
	kc.CurrentContext = "controlplane"
	return clientcmd.WriteToFile(*kc, path)
}

// Kubeconfig writes a kubeconfig file into Dir and returns its path.
func (cp *ControlPlane) Kubeconfig() (string, error) {
	path := filepath.Join(cp.dir, "kubeconfig")
	return path, cp.WriteKubeconfig(path)
}

// NodeCapacity is what AddNode gives each node: ample room, so that only
// DRA decides where pods go.
var NodeCapacity = v1.ResourceList{
	v1.ResourcePods:   resource.MustParse("110"),
	v1.ResourceCPU:    resource.MustParse("64"),
	v1.ResourceMemory: resource.MustParse("512Gi"),
}

// AddNode creates a Ready Node called name with NodeCapacity allocatable and
// the usual kubernetes.io/hostname label. No kubelet backs it: pods bound to
// it stay Pending unless the test sets their status (SetPodPhase).
func (cp *ControlPlane) AddNode(ctx context.Context, name string) (*v1.Node, error) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{v1.LabelHostname: name, v1.LabelOSStable: "linux"},
		},
	}
	created, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	// The TaintNodesByCondition admission plugin gives every new node the
	// node.kubernetes.io/not-ready:NoSchedule taint, which the node
	// lifecycle controller lifts once the kubelet reports Ready. Neither
	// runs here, so lift it as that controller would.
	if len(created.Spec.Taints) > 0 {
		created.Spec.Taints = nil
		if created, err = cp.Client.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("untaint node %s: %w", name, err)
		}
	}
	// Status is a subresource; set it explicitly rather than rely on what
	// create keeps of it.
	now := metav1.Now()
	created.Status = v1.NodeStatus{
		Capacity:    NodeCapacity.DeepCopy(),
		Allocatable: NodeCapacity.DeepCopy(),
		Phase:       v1.NodeRunning,
		Conditions: []v1.NodeCondition{{
			Type:               v1.NodeReady,
			Status:             v1.ConditionTrue,
			Reason:             "KubeletReady",
			Message:            "no kubelet: a controlplane test node",
			LastHeartbeatTime:  now,
			LastTransitionTime: now,
		}},
	}
	updated, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("set status of node %s: %w", name, err)
	}
	return updated, nil
}

// CreateNamespace creates a namespace called name.
func (cp *ControlPlane) CreateNamespace(ctx context.Context, name string) error {
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	return err
}
