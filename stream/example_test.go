package stream_test

import (
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/stream"
)

// A stream channel in miniature: the stream announces operation k by writing the
// trigger word T=k, a proxy goroutine notices, does the work and answers by writing the
// completion word D=k, and the stream waits for D>=k before the work that depends on it.
func Example() {
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	if err != nil {
		panic(err)
	}
	defer s.Close()
	words, err := b.AllocWords(2)
	if err != nil {
		panic(err)
	}
	defer words.Close()
	trigger, completion := words.Word(0), words.Word(1)

	const ops = 3
	go func() { // the proxy
		for k := uint64(1); k <= ops; k++ {
			for trigger.Load() < k {
			}
			fmt.Println("proxy: op", k)
			completion.Store(k)
		}
	}()
	for k := uint64(1); k <= ops; k++ {
		_ = s.WriteValue(trigger, k)
		_ = s.WaitValue(completion, k, stream.GEQ)
		_ = s.LaunchHostFunc(func() { fmt.Println("stream: op", k, "complete") })
	}
	if err := s.Synchronize(); err != nil {
		panic(err)
	}
	fmt.Println("D =", completion.Load())
	// Output:
	// proxy: op 1
	// stream: op 1 complete
	// proxy: op 2
	// stream: op 2 complete
	// proxy: op 3
	// stream: op 3 complete
	// D = 3
}

// Events order work across streams: B's write waits for A's callback.
func ExampleEvent() {
	b, _ := stream.Open(stream.Host)
	defer b.Close()
	a, _ := b.NewStream()
	bs, _ := b.NewStream()
	done, _ := b.NewEvent()
	words, _ := b.AllocWords(1)
	defer words.Close()
	w := words.Word(0)

	_ = a.LaunchHostFunc(func() { fmt.Println("A: work") })
	_ = a.Record(done)
	_ = bs.WaitEvent(done)
	_ = bs.WriteValue(w, 42)
	_ = bs.Synchronize()
	fmt.Println("B wrote", w.Load())
	// Output:
	// A: work
	// B wrote 42
}

// A panic in a host func becomes the stream's sticky error.
func ExamplePanicError() {
	b := stream.NewHostBackend()
	defer b.Close()
	s, _ := b.NewStream()
	_ = s.LaunchHostFunc(func() { panic("callback failed") })
	var pe *stream.PanicError
	if errors.As(s.Synchronize(), &pe) {
		fmt.Println("sticky:", pe.Value)
	}
	err := s.LaunchHostFunc(func() {})
	fmt.Println("later calls fail too:", errors.As(err, &pe))
	// Output:
	// sticky: callback failed
	// later calls fail too: true
}
