// Command gpuherd-demo runs a small gpuherd platform on this machine and
// walks through what its users see.
//
// It makes a CA, node certificates and a gossip key with the real gpuherd
// binary, starts four agents on simulated servers (a DGX H100, four L40S,
// four A100 PCIe, two RTX 6000 Pro) that gossip on loopback and talk to each
// other over mutual TLS, then runs a scripted scenario with the gpuherd CLI:
// claims spread over the servers, a model running out, requests no single
// server can hold, a restart on the old server, resizes, node groups and the
// drain of a whole server. Every command is printed with its output, as a
// transcript a person can follow, and the key facts of every step are
// checked: the demo exits non-zero, naming the step, when one did not behave.
//
// Everything lives in a fresh temporary directory, removed at the end unless
// --keep is given. Every process the demo starts is stopped when it ends,
// fails or is interrupted.
//
// Usage:
//
//	make demo    # or: bin/gpuherd-demo --gpuherd bin/gpuherd [--keep]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Exit codes of the demo.
const (
	exitOK          = 0
	exitFailed      = 1 // a step did not behave, or the platform did not start
	exitUsage       = 2
	exitInterrupted = 130
)

// options are the demo's command-line settings.
type options struct {
	gpuherd string // the gpuherd binary
	keep    bool   // keep the temporary directory
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := mainCode(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// mainCode parses args, runs the demo and returns the exit code.
func mainCode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpuherd-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts options
	fs.StringVar(&opts.gpuherd, "gpuherd", "bin/gpuherd", "`PATH` of the gpuherd binary to run (make build makes bin/gpuherd)")
	fs.BoolVar(&opts.keep, "keep", false, "keep the temporary directory (certificates, data, agent logs)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpuherd-demo [--gpuherd PATH] [--keep]")
		fmt.Fprintln(stderr, "Starts four gpuherd agents on simulated servers and walks through a scenario.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpuherd-demo: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return exitUsage
	}
	start := time.Now()
	err := run(ctx, opts, stdout)
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "\nDemo finished in %s: every step behaved as expected.\n", time.Since(start).Round(100*time.Millisecond))
		return exitOK
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "gpuherd-demo: interrupted; every process it started was stopped")
		return exitInterrupted
	default:
		fmt.Fprintln(stderr, "gpuherd-demo: FAILED: "+err.Error())
		return exitFailed
	}
}
