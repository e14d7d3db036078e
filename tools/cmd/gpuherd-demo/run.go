package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// run sets the platform up in a fresh directory, plays the scenario and
// tears everything down again, whatever happens.
func run(ctx context.Context, opts options, w io.Writer) (err error) {
	bin, err := findBinary(opts.gpuherd)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gpuherd-demo-")
	if err != nil {
		return err
	}
	// The real path, so that every path the agents print starts with $D.
	if real, rerr := filepath.EvalSymlinks(dir); rerr == nil {
		dir = real
	}
	defer func() {
		if opts.keep {
			fmt.Fprintf(w, "\nKept %s: certificates, the agents' data and their logs (agent.log in each server's directory).\n", dir)
			return
		}
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = fmt.Errorf("removing %s: %w", dir, rerr)
		}
	}()

	t := newTranscript(w, bin, dir)
	p := newPlatform(t, dir)
	defer func() {
		fmt.Fprintf(w, "\nStopping the agents (SIGTERM: each leaves the gossip cluster gracefully)...\n")
		p.stop(w)
		if err != nil && ctx.Err() == nil {
			// What the agents said is most of what there is to know.
			for _, s := range p.servers {
				if tail := p.tail(s); s.cmd != nil && tail != "" {
					fmt.Fprintln(w, "\n"+tail)
				}
			}
			if !opts.keep {
				fmt.Fprintln(w, "\n(Run with --keep to keep the directory and the full logs.)")
			}
		}
	}()

	fmt.Fprintf(w, "gpuherd demo: four agents on simulated GPU servers, talking over loopback.\n")
	fmt.Fprintf(w, "gpuherd is %s\n", bin)
	fmt.Fprintf(w, "D=%s   # the demo's directory: certificates, data, sockets, logs\n", dir)
	sc := newScenario(p)
	return sc.play(ctx)
}

// findBinary checks that the gpuherd binary exists and returns its
// absolute path.
func findBinary(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("the gpuherd binary %s is missing (build it with `make build`, or pass --gpuherd PATH): %w", path, err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable gpuherd binary", abs)
	}
	return abs, nil
}
