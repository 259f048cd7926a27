package goid

import (
	"sync"
	"testing"
)

func TestCurrent(t *testing.T) {
	me := Current()
	if me == 0 || Current() != me || !Is(me) || Is(0) {
		t.Fatalf("Current: %d, then %d", me, Current())
	}
	ids := make([]uint64, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = Current()
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{me: true}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("id %d seen twice: %v (this goroutine %d)", id, ids, me)
		}
		seen[id] = true
	}
}
