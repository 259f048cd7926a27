package stream

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A load that reads what a store wrote is ordered after the storer's earlier work, and
// the race detector sees it (race.go): each case hands a buffer from one goroutine to
// another through a word only, and both touch it with copies (the detector checks a
// copy's whole range). Both goroutines stay alive until the second access, since the
// detector may not report an access of a goroutine that already ended. Under -race a
// missing edge fails the test; without it they only check the data.

const raceTestSize = 4096

func raceTestData(seed byte) []byte {
	b := make([]byte, raceTestSize)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return b
}

// handOff runs publish on a goroutine of its own, which writes buf and then stores
// into the word; the calling goroutine waits with await and then reads buf.
func handOff(t *testing.T, publish func(buf []byte), await func()) {
	t.Helper()
	buf := make([]byte, raceTestSize)
	hold := make(chan struct{})
	go func() {
		publish(buf)
		<-hold // running until the read below
	}()
	await()
	got := bytes.Clone(buf)
	close(hold)
	require.Equal(t, raceTestData(1), got)
}

func spinUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "the word never changed")
		runtime.Gosched()
	}
}

func TestWordOrdersForRaceDetector(t *testing.T) {
	b := NewHostBackend()
	defer b.Close()
	words, err := b.AllocWords(1)
	require.NoError(t, err)
	defer words.Close()
	w := words.Word(0)
	write := func(buf []byte) { copy(buf, raceTestData(1)) }

	t.Run("Store-Load", func(t *testing.T) {
		w.Store(0)
		handOff(t, func(buf []byte) { write(buf); w.Store(1) }, func() { spinUntil(t, func() bool { return w.Load() == 1 }) })
	})
	t.Run("Add-Load", func(t *testing.T) {
		w.Store(0)
		handOff(t, func(buf []byte) { write(buf); w.Add(1) }, func() { spinUntil(t, func() bool { return w.Load() == 1 }) })
	})
	t.Run("CompareAndSwap-Load", func(t *testing.T) {
		w.Store(0)
		handOff(t, func(buf []byte) { write(buf); w.CompareAndSwap(0, 1) }, func() { spinUntil(t, func() bool { return w.Load() == 1 }) })
	})
	t.Run("Store-CompareAndSwap", func(t *testing.T) {
		w.Store(0)
		handOff(t, func(buf []byte) { write(buf); w.Store(1) }, func() { spinUntil(t, func() bool { return w.CompareAndSwap(1, 2) }) })
	})
}

// Host streams: a host function writes, WriteValue stores; another stream's WaitValue
// (and WriteThenWait's wait, and PollValue) holds until then, and its host function
// reads. The two executors share nothing but the word. Each case has host functions
// of its own: the detector reports one race per pair of stacks only once.
func TestHostStreamWaitsOrderForRaceDetector(t *testing.T) {
	cases := []struct {
		name  string
		wait  func(s Stream, w, other *Word) error
		write func(buf []byte)
		read  func(buf []byte) []byte
	}{
		{"WaitValue", func(s Stream, w, _ *Word) error { return s.WaitValue(w, 1, GEQ) },
			func(buf []byte) { copy(buf, raceTestData(1)) }, func(buf []byte) []byte { return bytes.Clone(buf) }},
		{"PollValue", func(s Stream, w, _ *Word) error { return s.PollValue(w, 1) },
			func(buf []byte) { copy(buf, raceTestData(1)) }, func(buf []byte) []byte { return bytes.Clone(buf) }},
		{"WriteThenWait", func(s Stream, w, other *Word) error { return s.WriteThenWait(other, 1, w, 1, EQ) },
			func(buf []byte) { copy(buf, raceTestData(1)) }, func(buf []byte) []byte { return bytes.Clone(buf) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := NewHostBackend()
			defer b.Close()
			words, err := b.AllocWords(2)
			require.NoError(t, err)
			defer words.Close()
			producer, err := b.NewStream()
			require.NoError(t, err)
			consumer, err := b.NewStream()
			require.NoError(t, err)

			buf := make([]byte, raceTestSize)
			var got []byte
			require.NoError(t, c.wait(consumer, words.Word(0), words.Word(1)))
			require.NoError(t, consumer.LaunchHostFunc(func() { got = c.read(buf) }))
			require.NoError(t, producer.LaunchHostFunc(func() { c.write(buf) }))
			require.NoError(t, producer.WriteValue(words.Word(0), 1))
			require.NoError(t, consumer.Synchronize())
			require.NoError(t, producer.Synchronize())
			require.Equal(t, raceTestData(1), got)
		})
	}
}
