package vfio_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/vfio"
)

// stuckTimeout is the write deadline of these tests: short, since every one
// of them waits it out at least once.
const stuckTimeout = 50 * time.Millisecond

// within runs f and fails the test if it has not returned by limit: the
// property under test is that the Binder never hangs its caller.
func within[T any](t *testing.T, limit time.Duration, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(limit):
		t.Fatalf("call did not return within %s", limit)
		panic("unreachable")
	}
}

type bindResult struct {
	res vfio.Result
	err error
}

func TestBindStuckUnbind(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), gpu(gpuB, 30, "nvidia"))
	b := vfio.NewBinder(vfio.New(k), vfio.WithWriteTimeout(stuckTimeout))
	if err := k.Hold(gpuA); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Unhold(gpuA) }) // never leave the write goroutine behind

	start := time.Now()
	r := within(t, 5*time.Second, func() bindResult { res, err := b.Bind(testCtx(t), gpuA); return bindResult{res, err} })
	var se *vfio.StuckError
	if !errors.Is(r.err, vfio.ErrStuck) || !errors.As(r.err, &se) {
		t.Fatalf("Bind error = %v, want ErrStuck", r.err)
	}
	if elapsed := time.Since(start); elapsed < stuckTimeout {
		t.Errorf("Bind gave up after %s, before its %s deadline", elapsed, stuckTimeout)
	}
	if se.Address != gpuA || !strings.Contains(se.Op, "driver/unbind") || se.Timeout != stuckTimeout {
		t.Errorf("StuckError = %+v, want %s, the unbind, %s", se, gpuA, stuckTimeout)
	}
	if got := b.Stuck(); !slices.Equal(got, []string{gpuA}) {
		t.Errorf("Stuck() = %v, want [%s]", got, gpuA)
	}

	// While the unbind hangs, nothing more is written to the device...
	from := len(k.Writes())
	for _, call := range []func() error{
		func() error { _, err := b.Bind(testCtx(t), gpuA); return err },
		func() error { _, err := b.Release(testCtx(t), gpuA, vfio.IdleNVIDIA); return err },
		func() error { _, err := b.Release(testCtx(t), gpuA, vfio.IdleNone); return err },
	} {
		err := within(t, 5*time.Second, call)
		if !errors.As(err, &se) || !se.Refused {
			t.Errorf("call on a stuck device = %v, want a refusing StuckError", err)
		}
	}
	wantWrites(t, k, from)

	// ...while other devices are served as usual.
	if r := within(t, 5*time.Second, func() bindResult { res, err := b.Bind(testCtx(t), gpuB); return bindResult{res, err} }); r.err != nil {
		t.Fatal(r.err)
	}
	if got, _ := driverOf(t, k, gpuB); got != vfio.DriverVFIO {
		t.Errorf("other GPU on %q while the first is stuck, want vfio-pci", got)
	}

	// Whoever held the card lets go: the leaked write returns, the device
	// is no longer stuck, and the next Bind finishes the job.
	k.Unhold(gpuA)
	if err := b.WaitUnstuck(testCtx(t), gpuA); err != nil {
		t.Fatalf("WaitUnstuck: %v", err)
	}
	if got := b.Stuck(); len(got) != 0 {
		t.Errorf("Stuck() = %v after the write returned", got)
	}
	if got, ov := driverOf(t, k, gpuA); got != "" || ov != vfio.DriverVFIO {
		t.Errorf("after the late unbind: on %q override %q, want unbound with override vfio-pci", got, ov)
	}
	res, err := b.Bind(testCtx(t), gpuA)
	if err != nil {
		t.Fatalf("Bind after unstuck: %v", err)
	}
	if want := []vfio.Change{{gpuA, "", vfio.DriverVFIO}}; !slices.Equal(res.Changes, want) {
		t.Errorf("Changes = %v, want %v", res.Changes, want)
	}
}

func TestBindStuckRollsBackTheRestOfTheGroup(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"))
	b := vfio.NewBinder(vfio.New(k), vfio.WithWriteTimeout(stuckTimeout))
	if err := k.Hold(audioA); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Unhold(audioA) })

	r := within(t, 5*time.Second, func() bindResult { res, err := b.Bind(testCtx(t), gpuA); return bindResult{res, err} })
	// The GPU is put back; the audio function cannot be while its unbind
	// is pending, and the error says so.
	if !errors.Is(r.err, vfio.ErrStuck) || !strings.Contains(r.err.Error(), "rollback incomplete") ||
		!strings.Contains(r.err.Error(), audioA+" left as it is") {
		t.Fatalf("Bind error = %v, want ErrStuck and an incomplete rollback naming %s", r.err, audioA)
	}
	if got, ov := driverOf(t, k, gpuA); got != "nvidia" || ov != "" {
		t.Errorf("GPU on %q override %q after rollback, want nvidia and none", got, ov)
	}
	if len(r.res.Changes) != 0 {
		t.Errorf("Changes = %v, want none (GPU rolled back, audio not yet unbound)", r.res.Changes)
	}
	k.Unhold(audioA)
	if err := b.WaitUnstuck(testCtx(t), audioA); err != nil {
		t.Fatal(err)
	}
}

func TestBindContextEndsTheWait(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"))
	if err := k.Hold(gpuA); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Unhold(gpuA) })
	entered := make(chan struct{})
	f := &faultFS{FS: k, write: func(name string, data []byte) (bool, error) {
		if strings.HasSuffix(name, "/unbind") {
			close(entered)
		}
		return false, nil
	}}
	b := vfio.NewBinder(vfio.New(f), vfio.WithWriteTimeout(time.Hour))
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() { <-entered; cancel() }()

	r := within(t, 5*time.Second, func() bindResult { res, err := b.Bind(ctx, gpuA); return bindResult{res, err} })
	if !errors.Is(r.err, vfio.ErrStuck) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Bind error = %v, want ErrStuck and context.Canceled", r.err)
	}
	if got := b.Stuck(); !slices.Equal(got, []string{gpuA}) {
		t.Errorf("Stuck() = %v, want [%s]: the abandoned write is still pending", got, gpuA)
	}
	k.Unhold(gpuA)
	if err := b.WaitUnstuck(testCtx(t), gpuA); err != nil {
		t.Fatal(err)
	}
}
