package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config says how this agent takes part in the gossip cluster. Zero values
// take memberlist's LAN defaults.
type Config struct {
	NodeName          string        // unique server name; defaults to the hostname
	BindAddr          string        // address to listen on; defaults to 0.0.0.0
	BindPort          int           // UDP and TCP port (memberlist's usual is 7946); 0 picks a free one, see LocalAddr
	AdvertiseAddr     string        // address others reach us at; see AdvertiseAddr()
	AdvertisePort     int           // port others reach us at; defaults to the bound port
	Join              []string      // seeds, host or host:port (port defaults to BindPort)
	JoinRetryInterval time.Duration // first wait between join attempts; doubles up to a minute; default 1s
	JoinRetryMax      int           // attempts before Join gives up; 0 = until its context ends
	KeyFile           string        // gossip key file (see LoadKeyring); required unless Insecure
	Insecure          bool          // allow unencrypted gossip, for labs only
	RememberDeparted  time.Duration // how long Members lists dead and left members; default 1h
	Log               *slog.Logger
	Tune              func(*memberlist.Config) // last say over memberlist's config; for tests
	// Rebroadcast is when a changed summary is advertised again after the
	// change; nil is DefaultRebroadcast, an empty slice never.
	Rebroadcast []time.Duration

	catchUp catchUpTimings // zero: defaultCatchUp; for tests
}

// Cluster is this agent's membership in the gossip cluster: it advertises
// the local capacity summary and keeps the view of every other server's.
// It is safe for concurrent use.
type Cluster struct {
	log     *slog.Logger
	local   func() Summary
	seeds   []string
	retry   time.Duration
	retries int
	keyring *memberlist.Keyring // nil when insecure
	keyMu   sync.Mutex          // serialises ReloadKeys
	view    *view
	ml      *memberlist.Memberlist
	pub     *publisher
	catchUp *catchUp
	refresh refresher
	// selfIP and selfPort are the advertised gossip address, read once at
	// start: memberlist's LocalNode returns its live record, which it
	// rewrites on every UpdateNode without a lock the caller could take.
	selfIP   net.IP
	selfPort uint16

	metaMu sync.Mutex
	meta   []byte // encoded summary NodeMeta hands to memberlist

	lifeMu   sync.Mutex  // serialises Leave and Shutdown
	closing  atomic.Bool // Leave or Shutdown has begun: no more publishing or joining
	left     bool
	shutdown bool
}

const defaultRememberDeparted = time.Hour

// New starts a gossip member that advertises the summary local returns (see
// Publish). It listens at once but talks to nobody until Join.
func New(cfg Config, local func() Summary) (*Cluster, error) {
	if local == nil {
		return nil, errors.New("gossip: no local capacity summary source")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "gossip")

	mc := memberlist.DefaultLANConfig()
	if cfg.NodeName != "" {
		mc.Name = cfg.NodeName
	} else if mc.Name == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("gossip: no node name given and the hostname is unknown: %w", err)
		}
		mc.Name = host
	}
	if cfg.BindAddr != "" {
		mc.BindAddr = cfg.BindAddr
	}
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	if cfg.AdvertisePort == 0 {
		// memberlist advertises AdvertisePort as given; 0 would be unreachable.
		mc.AdvertisePort = cfg.BindPort
	}

	c := &Cluster{
		log:     log,
		local:   local,
		seeds:   cfg.Join,
		retry:   cfg.JoinRetryInterval,
		retries: cfg.JoinRetryMax,
	}
	if c.retry <= 0 {
		c.retry = time.Second
	}
	remember := cfg.RememberDeparted
	if remember <= 0 {
		remember = defaultRememberDeparted
	}
	c.view = newView(mc.Name, remember)

	switch {
	case cfg.KeyFile != "":
		kr, err := LoadKeyring(cfg.KeyFile)
		if err != nil {
			return nil, err
		}
		c.keyring = kr
		mc.Keyring = kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	case cfg.Insecure:
		log.Warn("gossip is not encrypted: any host that reaches the gossip port can join and read capacity (--insecure-gossip)")
	default:
		return nil, errors.New("gossip: no gossip key: set --gossip-key-file to a file holding a base64 AES key (mode 0600), or pass --insecure-gossip to run unencrypted")
	}

	meta, err := local().Encode()
	if err != nil {
		return nil, fmt.Errorf("gossip: encode the initial capacity summary: %w", err)
	}
	c.meta = meta

	// The summaries that travel are a few hundred bytes on a LAN: compressing
	// every gossip packet costs more CPU than the bandwidth it saves.
	// memberlist still reads compressed packets from members that send them.
	mc.EnableCompression = false

	cu := cfg.catchUp
	if cu.quiet == 0 {
		cu.quiet, cu.most, cu.gap = defaultCatchUp.quiet, defaultCatchUp.most, defaultCatchUp.gap
	}
	c.catchUp = newCatchUp(c, cu, log)

	d := delegate{c: c}
	mc.Delegate, mc.Events, mc.Ping, mc.Alive = d, d, d, d
	mc.Logger = newMemberlistLogger(log, c.view.suspect)
	mc.LogOutput = nil
	if cfg.Tune != nil {
		cfg.Tune(mc)
	}
	var own *transport
	if mc.Transport == nil {
		t, err := newTransport(mc.BindAddr, mc.BindPort, log)
		if err != nil {
			return nil, err
		}
		mc.Transport, own = t, t
		if mc.BindPort == 0 {
			mc.BindPort = t.port
			if mc.AdvertisePort == 0 {
				mc.AdvertisePort = t.port
			}
		}
	}

	ml, err := memberlist.Create(mc)
	if err != nil {
		if own != nil {
			_ = own.Shutdown()
		}
		return nil, fmt.Errorf("gossip: start memberlist on %s:%d: %w", mc.BindAddr, cfg.BindPort, err)
	}
	c.ml = ml
	self := ml.LocalNode()
	c.selfIP, c.selfPort = slices.Clone(self.Addr), self.Port
	again := cfg.Rebroadcast
	if again == nil {
		again = DefaultRebroadcast
	}
	c.pub = startPublisher(c, mc.GossipInterval, again, log)
	c.catchUp.start()
	log.Info("gossip started", "node", mc.Name, "addr", c.LocalAddr(), "encrypted", c.keyring != nil)
	return c, nil
}

// currentMeta is the encoded summary memberlist advertises.
func (c *Cluster) currentMeta() []byte {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	return c.meta
}

// Members returns every member this agent knows of, itself included, sorted
// by name; dead and left members stay listed for Config.RememberDeparted.
// The slice is shared with other callers until the view next changes: read
// it (ranging copies each member), never modify it.
func (c *Cluster) Members() []Member {
	return c.view.list()
}

// Member returns the member called name as Members lists it, and whether
// it is listed, without copying the whole view.
func (c *Cluster) Member(name string) (Member, bool) {
	return c.view.member(name)
}

// Subscribe returns a channel that receives a value when the view may have
// changed (several changes in a row arrive as one), and a function that ends
// the subscription and closes the channel. Re-read Members after each value.
func (c *Cluster) Subscribe() (<-chan struct{}, func()) {
	return c.view.subscribe(false)
}

// SubscribeMembers is Subscribe for changes of membership only: a member
// joining, going, changing state or address, or changing anything in its
// summary but its capacity (free counts and ledger revision), which every
// claim anywhere in the cluster changes.
func (c *Cluster) SubscribeMembers() (<-chan struct{}, func()) {
	return c.view.subscribe(true)
}

// HealthScore is memberlist's awareness score: 0 is healthy; higher means
// this agent misses its own probe deadlines (overloaded host or network).
func (c *Cluster) HealthScore() int {
	return c.ml.GetHealthScore()
}

// LocalAddr returns the ip:port this agent advertises for gossip.
func (c *Cluster) LocalAddr() string {
	return net.JoinHostPort(c.selfIP.String(), strconv.Itoa(int(c.selfPort)))
}

// Leave announces a graceful departure and waits up to timeout for it to go
// out, so others list this server as "left" rather than "dead". The agent
// keeps answering gossip until Shutdown.
func (c *Cluster) Leave(timeout time.Duration) error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.shutdown {
		return errors.New("gossip: leave after shutdown")
	}
	if c.left {
		return nil
	}
	c.left = true
	c.closing.Store(true)
	deadline := time.Now().Add(timeout)
	// No re-advertising after this point: memberlist would drop it anyway,
	// and UpdateNode would then wait out its whole timeout.
	c.pub.stop()
	c.catchUp.stop()

	// memberlist does not tell others whether a member left or died, so the
	// summary says it first; members that miss it will show "dead".
	s := c.local()
	s.Leaving = true
	meta, err := s.Encode()
	if err != nil {
		c.log.Warn("cannot announce the leave in the capacity summary; others may show this server as dead", "err", err)
	} else {
		c.metaMu.Lock()
		c.meta = meta
		c.metaMu.Unlock()
		// At most half the time: the leave message itself matters more.
		// (memberlist reads a zero timeout as "wait forever", hence the floor.)
		wait := max(min(timeout/2, time.Until(deadline)), time.Millisecond)
		if err := c.ml.UpdateNode(wait); err != nil {
			c.log.Debug("leave intent not confirmed before the leave itself", "err", err)
		}
	}
	if err := c.ml.Leave(max(time.Until(deadline), time.Millisecond)); err != nil {
		return fmt.Errorf("gossip: leave: %w; the others will notice this server as dead instead", err)
	}
	c.log.Info("left the gossip cluster")
	return nil
}

// Shutdown stops gossip without a leave message (call Leave first for a
// graceful exit). It is safe to call more than once.
func (c *Cluster) Shutdown() error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.shutdown {
		return nil
	}
	c.shutdown = true
	c.closing.Store(true)
	c.pub.stop()
	c.catchUp.stop()
	err := c.ml.Shutdown()
	c.catchUp.wait() // an exchange in flight fails now that memberlist is down
	c.refresh.drain()
	if err != nil {
		return fmt.Errorf("gossip: shutdown: %w", err)
	}
	return nil
}
