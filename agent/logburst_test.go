package agent

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/logging"
)

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// 5,000 junk UDP packets at the gossip port: memberlist warns about each,
// and the agent's log (through logging.RateLimit, as the daemon's is) keeps
// a handful of lines and counts the rest.
func TestJunkGossipPacketsAreRateLimited(t *testing.T) {
	var out syncBuffer
	const perWindow, window = 5, 300 * time.Millisecond
	h := logging.NewRateLimit(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), perWindow, window)
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.GossipAddr, cfg.AdvertiseAddr, cfg.PeerAddr = "127.0.0.1:0", "127.0.0.1", "127.0.0.1:0"
	cfg.InsecureGossip = true
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = clusterFiles(t, dir, "test-node")
	a, err := New(context.Background(), cfg, slog.New(h), WithSysfs(machine(t, "l40s-4", dir).Kernel, nil), WithGossipTune(fastGossip))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	conn, err := net.Dial("udp", a.cluster.g.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const packets = 5000
	start := time.Now()
	for i := range packets {
		// An unknown message type, as a port scanner or a stray client sends.
		if _, err := conn.Write([]byte{0xee, byte(i), byte(i >> 8), 'j', 'u', 'n', 'k'}); err != nil {
			t.Fatal(err)
		}
	}
	suppressed := regexp.MustCompile(`suppressed=(\d+)`)
	count := func() (lines, counted int) {
		for _, l := range strings.Split(out.String(), "\n") {
			if !strings.Contains(l, "component=memberlist") {
				continue
			}
			lines++
			counted++
			if m := suppressed.FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[1])
				counted += n - 1 // the summary line stands for n suppressed ones
			}
		}
		return lines, counted
	}
	// UDP may drop some of them on a busy machine: most must arrive.
	waitFor(t, "memberlist's warnings counted", 10*time.Second, func() bool {
		_, counted := count()
		return counted >= packets*8/10
	})
	lines, counted := count()
	took := time.Since(start)
	// The limit is per kind of warning (its text and attributes): a
	// handful of each per window while the packets were read (on a
	// loaded machine that takes several windows), and a summary each:
	// far below one line per packet.
	kinds := map[string]bool{}
	msg := regexp.MustCompile(`msg="([^"]*)"`)
	for _, l := range strings.Split(out.String(), "\n") {
		if m := msg.FindStringSubmatch(l); m != nil && strings.Contains(l, "component=memberlist") {
			kinds[strings.TrimSuffix(m[1], " (repeated; count in suppressed)")] = true
		}
	}
	allowed := len(kinds) * (int(took/window) + 3) * (perWindow + 1)
	t.Logf("%d junk packets: %d warnings of %d kinds counted in %d log lines over %v (at most %d)", packets, counted, len(kinds), lines, took.Round(time.Millisecond), allowed)
	if lines > allowed {
		t.Errorf("%d log lines for %d junk packets in %v; want at most %d per kind and window of %v", lines, packets, took.Round(time.Millisecond), perWindow+1, window)
	}
}
