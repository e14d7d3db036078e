package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// commandTimeout bounds one gpuherd client command. They take milliseconds
// on simulated servers; the bound only keeps a broken agent from hanging the
// demo.
const commandTimeout = time.Minute

// transcript runs gpuherd commands and prints each with its output, as a
// shell session a person can follow and repeat. Paths inside the demo's
// directory are shown as $D/..., and the binary as "gpuherd".
type transcript struct {
	w   io.Writer
	bin string   // absolute path of the gpuherd binary
	dir string   // the demo's directory, $D
	env []string // environment of every command
}

func newTranscript(w io.Writer, bin, dir string) *transcript {
	var env []string
	for _, kv := range os.Environ() {
		// Every command names its agent with --socket; an inherited
		// GPUHERD_SOCKET must not change what the transcript shows.
		if !strings.HasPrefix(kv, "GPUHERD_SOCKET=") {
			env = append(env, kv)
		}
	}
	return &transcript{w: w, bin: bin, dir: dir, env: env}
}

// result is a finished gpuherd command.
type result struct {
	line string // the command as shown
	out  string // stdout and stderr, in the order they were written
	code int
}

// heading starts a step of the scenario.
func (t *transcript) heading(n int, title string) {
	fmt.Fprintf(t.w, "\n=== %d. %s\n\n", n, title)
}

// say explains, as a shell comment.
func (t *transcript) say(text string) {
	for _, l := range strings.Split(text, "\n") {
		fmt.Fprintln(t.w, "# "+l)
	}
}

// wrapWidth is where a long command line shown in the transcript is
// continued on the next line, before a flag.
const wrapWidth = 100

// command shows a command line, with suffix (a redirection) after it. A long
// one is continued with backslashes, as a person would type it.
func (t *transcript) command(args []string, suffix string) string {
	parts := t.words(args)
	var b strings.Builder
	width := 0
	for i, p := range parts {
		if i > 0 {
			// A flag stays on one line with its value.
			need := len(p)
			if i+1 < len(parts) && !strings.HasPrefix(parts[i+1], "-") {
				need += 1 + len(parts[i+1])
			}
			if strings.HasPrefix(p, "--") && width+1+need > wrapWidth-2 {
				b.WriteString(" \\\n   ")
				width = 3
			}
			b.WriteByte(' ')
			width++
		}
		b.WriteString(p)
		width += len(p)
	}
	fmt.Fprintln(t.w, "$ "+b.String()+suffix)
	return strings.Join(parts, " ")
}

// run runs `gpuherd args...` and shows it with its output and, when it
// is not 0, its exit status. The error is only for a command that could not
// run at all; its exit status is the caller's to judge.
func (t *transcript) run(ctx context.Context, args ...string) (result, error) {
	line := t.command(args, "")
	r, err := t.exec(ctx, args)
	r.line = line
	if err != nil {
		return r, err
	}
	fmt.Fprint(t.w, r.out)
	if r.out != "" && !strings.HasSuffix(r.out, "\n") {
		fmt.Fprintln(t.w)
	}
	if r.code != 0 {
		fmt.Fprintf(t.w, "[exit status %d]\n", r.code)
	}
	return r, nil
}

// quiet runs `gpuherd args...` without showing it: the demo's own polling.
func (t *transcript) quiet(ctx context.Context, args ...string) (result, error) {
	r, err := t.exec(ctx, args)
	r.line = t.format(args)
	return r, err
}

// runTo runs `gpuherd args...` with its standard output written to file
// instead of the screen, and returns what it wrote. The file is a secret:
// it gets mode 0600, which the transcript shows as umask 077.
func (t *transcript) runTo(ctx context.Context, file string, args ...string) ([]byte, error) {
	line := t.format(args)
	fmt.Fprintf(t.w, "$ (umask 077; %s > %s)\n", line, t.path(file))
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, t.bin, args...)
	cmd.Env = t.env
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", line, err, strings.TrimSpace(stderr.String()))
	}
	if err := os.WriteFile(file, stdout.Bytes(), 0o600); err != nil {
		return nil, err
	}
	return stdout.Bytes(), nil
}

func (t *transcript) exec(ctx context.Context, args []string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, t.bin, args...)
	cmd.Env = t.env
	// One writer for both: the output reads as it would in a terminal.
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	r := result{out: out.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil && ee.Exited():
		r.code = ee.ExitCode()
	default:
		return r, fmt.Errorf("running gpuherd %s: %w", strings.Join(args, " "), err)
	}
	return r, nil
}

// format renders args as a shell command line.
func (t *transcript) format(args []string) string {
	return strings.Join(t.words(args), " ")
}

// words is the command line's words, quoted for a shell.
func (t *transcript) words(args []string) []string {
	words := []string{"gpuherd"}
	for _, a := range args {
		words = append(words, t.quote(a))
	}
	return words
}

// path shows p relative to $D when it is inside the demo's directory.
func (t *transcript) path(p string) string {
	if rest, ok := strings.CutPrefix(p, t.dir); ok && (rest == "" || rest[0] == '/') {
		return "$D" + rest
	}
	return p
}

// plainArg needs no quoting in a shell.
var plainArg = regexp.MustCompile(`^[A-Za-z0-9_./:=@%+,-]+$`)

func (t *transcript) quote(a string) string {
	if p := t.path(a); p != a {
		if rest := p[len("$D"):]; rest == "" || plainArg.MatchString(rest) {
			return p
		}
		return `"` + p + `"`
	}
	if plainArg.MatchString(a) {
		return a
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`").Replace(a) + `"`
}

// wantOK is an error unless the command succeeded.
func (r result) wantOK() error {
	if r.code != 0 {
		return fmt.Errorf("`%s` exited %d, want 0: %s", r.line, r.code, strings.TrimSpace(r.out))
	}
	return nil
}

// wantFail is an error unless the command exited with code and its output
// holds every one of texts.
func (r result) wantFail(code int, texts ...string) error {
	if r.code != code {
		return fmt.Errorf("`%s` exited %d, want %d: %s", r.line, r.code, code, strings.TrimSpace(r.out))
	}
	for _, s := range texts {
		if !strings.Contains(r.out, s) {
			return fmt.Errorf("`%s`: output lacks %q: %s", r.line, s, strings.TrimSpace(r.out))
		}
	}
	return nil
}
