package keyedlock

import (
	"sync"
	"testing"
)

func TestKeyedLocksSerialiseAndForget(t *testing.T) {
	var (
		l       Set
		wg      sync.WaitGroup
		inside  = map[string]int{}
		mu      sync.Mutex
		overlap bool
	)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := []string{"a", "b", "c"}[i%3:]
			unlock := l.Lock(keys...)
			mu.Lock()
			for _, k := range keys {
				inside[k]++
				if inside[k] > 1 {
					overlap = true
				}
			}
			mu.Unlock()
			mu.Lock()
			for _, k := range keys {
				inside[k]--
			}
			mu.Unlock()
			unlock()
		}()
	}
	wg.Wait()
	if overlap {
		t.Error("two holders of one key at once")
	}
	if n := len(l.locks); n != 0 {
		t.Errorf("%d lock entries left after every holder released", n)
	}
}
