package controlplane

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
)

// TB is what Start needs from its caller: the method set of testing.TB
// without its unexported method, which is also exactly what Kubernetes'
// ktesting.TB asks for. *testing.T and *testing.B satisfy it, and so does
// Standalone, for programs (demos, tools) that are not run by go test.
type TB interface {
	Attr(key, value string)
	Chdir(dir string)
	Cleanup(func())
	Error(args ...any)
	Errorf(format string, args ...any)
	Fail()
	FailNow()
	Failed() bool
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Helper()
	Log(args ...any)
	Logf(format string, args ...any)
	Name() string
	Setenv(key, value string)
	Skip(args ...any)
	Skipf(format string, args ...any)
	SkipNow()
	Skipped() bool
	TempDir() string
}

// Standalone is a TB for code outside go test. Like testing.T it collects
// cleanups and runs them last-in first-out, and FailNow (so Fatal and Fatalf)
// ends the function given to Run; as with testing.T, FailNow must only be
// called from that function's goroutine.
type Standalone struct {
	name string
	out  io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	skipped  bool
	tempRoot string
	tempSeq  int
}

// stopRun is the panic value FailNow and SkipNow use to unwind to Run.
type stopRun struct{}

// NewStandalone returns a Standalone called name that writes Log output to
// out (os.Stderr when nil).
func NewStandalone(name string, out io.Writer) *Standalone {
	if out == nil {
		out = os.Stderr
	}
	return &Standalone{name: name, out: out}
}

// Run calls fn with s, then runs all cleanups fn registered, also when fn
// fails or panics. It returns an error when fn failed (Error, Fatal...).
func (s *Standalone) Run(fn func(tb TB)) (err error) {
	defer func() {
		r := recover()
		s.runCleanups()
		if r != nil {
			if _, ok := r.(stopRun); !ok {
				panic(r)
			}
		}
		if s.Failed() {
			err = fmt.Errorf("%s failed", s.name)
		}
	}()
	fn(s)
	return nil
}

func (s *Standalone) runCleanups() {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			root := s.tempRoot
			s.tempRoot = ""
			s.mu.Unlock()
			if root != "" {
				_ = os.RemoveAll(root)
			}
			return
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		// A cleanup that calls FailNow must not skip the remaining ones.
		func() {
			defer func() {
				if r := recover(); r != nil {
					if _, ok := r.(stopRun); !ok {
						panic(r)
					}
				}
			}()
			f()
		}()
	}
}

// Attr logs the attribute, as testing.T does in verbose mode.
func (s *Standalone) Attr(key, value string) { s.Logf("=== ATTR %s %s", key, value) }

// Chdir changes the working directory until the cleanups run.
func (s *Standalone) Chdir(dir string) {
	old, err := os.Getwd()
	if err != nil {
		s.Fatal(err)
	}
	if err := os.Chdir(dir); err != nil {
		s.Fatal(err)
	}
	s.Cleanup(func() { _ = os.Chdir(old) })
}

// Cleanup registers f to run when Run returns.
func (s *Standalone) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

// Error logs and marks the run failed.
func (s *Standalone) Error(args ...any) { s.Log(args...); s.Fail() }

// Errorf logs and marks the run failed.
func (s *Standalone) Errorf(format string, args ...any) { s.Logf(format, args...); s.Fail() }

// Fail marks the run failed.
func (s *Standalone) Fail() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed = true
}

// FailNow marks the run failed and unwinds to Run.
func (s *Standalone) FailNow() {
	s.Fail()
	panic(stopRun{})
}

// Failed says whether the run failed.
func (s *Standalone) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Fatal is Log followed by FailNow.
func (s *Standalone) Fatal(args ...any) { s.Log(args...); s.FailNow() }

// Fatalf is Logf followed by FailNow.
func (s *Standalone) Fatalf(format string, args ...any) { s.Logf(format, args...); s.FailNow() }

// Helper does nothing: there is no test output to attribute.
func (s *Standalone) Helper() {}

// Log writes its arguments as fmt.Sprintln does, with the caller's position.
func (s *Standalone) Log(args ...any) { s.write(fmt.Sprintln(args...)) }

// Logf writes its arguments as fmt.Sprintf does, with the caller's position.
func (s *Standalone) Logf(format string, args ...any) { s.write(fmt.Sprintf(format, args...) + "\n") }

func (s *Standalone) write(msg string) {
	where := ""
	if _, file, line, ok := runtime.Caller(2); ok {
		where = fmt.Sprintf("%s:%d: ", shortFile(file), line)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprint(s.out, where+msg)
}

func shortFile(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			return path[i+1:]
		}
	}
	return path
}

// Name is the name given to NewStandalone.
func (s *Standalone) Name() string { return s.name }

// Setenv sets an environment variable until the cleanups run.
func (s *Standalone) Setenv(key, value string) {
	old, had := os.LookupEnv(key)
	if err := os.Setenv(key, value); err != nil {
		s.Fatal(err)
	}
	s.Cleanup(func() {
		if had {
			_ = os.Setenv(key, old)
		} else {
			_ = os.Unsetenv(key)
		}
	})
}

// Skip is Log followed by SkipNow.
func (s *Standalone) Skip(args ...any) { s.Log(args...); s.SkipNow() }

// Skipf is Logf followed by SkipNow.
func (s *Standalone) Skipf(format string, args ...any) { s.Logf(format, args...); s.SkipNow() }

// SkipNow marks the run skipped and unwinds to Run.
func (s *Standalone) SkipNow() {
	s.mu.Lock()
	s.skipped = true
	s.mu.Unlock()
	panic(stopRun{})
}

// Skipped says whether SkipNow was called.
func (s *Standalone) Skipped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped
}

// TempDir returns a new directory that is removed after the cleanups ran.
func (s *Standalone) TempDir() string {
	dir, err := s.newTempDir()
	if err != nil {
		s.Fatal(err)
	}
	return dir
}

func (s *Standalone) newTempDir() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tempRoot == "" {
		root, err := os.MkdirTemp("", "controlplane-")
		if err != nil {
			return "", err
		}
		s.tempRoot = root
	}
	s.tempSeq++
	dir := fmt.Sprintf("%s/%03d", s.tempRoot, s.tempSeq)
	return dir, os.Mkdir(dir, 0o700)
}
