package ucp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Many goroutines on both workers of a pair, each pair of them with its own tags,
// mixing every way of waiting the API offers: fused blocking calls, nbx operations
// waited for with Wait, with Test polling and with callbacks, eager and rendezvous
// sizes, beside a goroutine that only progresses and one that sleeps in WaitForEvents.
// Every reply is checked; a lost completion or wake-up shows as a timeout.
func TestWorkerStress(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		const goroutines, rounds = 4, 150
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		sizes := []int{0, 8, 4096, 65536, 1 << 20}
		errc := make(chan error, 2*goroutines)
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			ping, pong := uint64(0x5000+g<<4), uint64(0x5000+g<<4+1)
			wg.Add(2)
			go func() { // a: sends, waits for the echo
				defer wg.Done()
				rng := rand.New(rand.NewSource(int64(g)))
				rbuf := make([]byte, 1<<20)
				for i := 0; i < rounds; i++ {
					n := sizes[rng.Intn(len(sizes))]
					msg := pattern(n, int64(g*rounds+i))
					how := rng.Intn(4)
					got, err := stressExchange(ctx, p, how, msg, ping, rbuf, pong)
					if err != nil {
						err = fmt.Errorf("how %d size %d: %w", how, n, err)
					}
					if err == nil && !bytes.Equal(rbuf[:got], msg) {
						err = fmt.Errorf("reply of %d bytes differs", n)
					}
					if err != nil {
						errc <- fmt.Errorf("a%d round %d: %w", g, i, err)
						return
					}
				}
			}()
			go func() { // b: echoes
				defer wg.Done()
				rng := rand.New(rand.NewSource(int64(100 + g)))
				buf := make([]byte, 1<<20)
				for i := 0; i < rounds; i++ {
					how := rng.Intn(3)
					n, err := stressRecv(ctx, p.b, how, buf, ping)
					if err != nil {
						err = fmt.Errorf("how %d: %w", how, err)
					}
					if err == nil {
						err = p.epB.TagSend(ctx, buf[:n], pong)
					}
					if err != nil {
						errc <- fmt.Errorf("b%d round %d: %w", g, i, err)
						return
					}
				}
			}()
		}
		stop := make(chan struct{})
		var aux sync.WaitGroup
		aux.Add(2)
		go func() { // a goroutine that only progresses a
			defer aux.Done()
			untilClosed(stop, func() {
				p.a.Progress()
				time.Sleep(50 * time.Microsecond)
			})
		}()
		go func() { // one that sleeps on b's events, then progresses
			defer aux.Done()
			untilClosed(stop, func() {
				_ = p.b.WaitForEvents(ctx, time.Millisecond)
				p.b.Progress()
			})
		}()
		wg.Wait()
		close(stop)
		aux.Wait()
		close(errc)
		var errs []error
		for err := range errc {
			errs = append(errs, err)
		}
		require.NoError(t, errors.Join(errs...))
	})
}

// stressExchange sends msg with tag ping and receives the reply (tag pong) into rbuf
// in one of four ways (fused; nbx and Wait; nbx and Test polling; nbx and callbacks),
// returning the reply's length.
func stressExchange(ctx context.Context, p *pair, how int, msg []byte, ping uint64, rbuf []byte, pong uint64) (int, error) {
	if how == 0 {
		n, _, err := p.epA.TagSendRecv(ctx, msg, ping, rbuf, pong, ^uint64(0))
		return n, err
	}
	var prm *RequestParam
	var done chan struct{}
	if how == 3 {
		done = make(chan struct{}, 2)
		prm = &RequestParam{Callback: func(*Request) { done <- struct{}{} }}
	}
	r, err := p.a.TagRecvNbx(rbuf, pong, ^uint64(0), prm)
	if err != nil {
		return 0, err
	}
	s, err := p.epA.TagSendNbx(msg, ping, prm)
	if err != nil {
		return 0, err
	}
	switch how {
	case 1:
		if err := s.Wait(ctx); err != nil {
			return 0, err
		}
		err = r.Wait(ctx)
	case 2:
		for _, q := range []*Request{s, r} {
			for {
				ok, terr := q.Test()
				if ok || terr != nil || ctx.Err() != nil {
					err = errors.Join(terr, ctx.Err())
					break
				}
			}
		}
	case 3:
		// As in UCX, an operation that completed in the call runs no callback; one
		// still pending when the call returned runs it exactly once.
		for _, q := range []*Request{s, r} {
			if q.Done() {
				continue
			}
			select {
			case <-done:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		for !(s.Done() && r.Done()) && err == nil {
			select { // the other callback may be the one that came
			case <-done:
			case <-time.After(time.Millisecond):
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		err = errors.Join(err, s.Err(), r.Err())
	}
	return r.Length(), err
}

// stressRecv receives a message with tag into buf in one of three ways (fused; nbx
// and Wait; nbx and a callback), returning its length.
func stressRecv(ctx context.Context, w *Worker, how int, buf []byte, tag uint64) (int, error) {
	switch how {
	case 0:
		n, _, err := w.TagRecv(ctx, buf, tag, ^uint64(0))
		return n, err
	case 1:
		r, err := w.TagRecvNbx(buf, tag, ^uint64(0), nil)
		if err == nil {
			err = r.Wait(ctx)
		}
		if err != nil {
			return 0, err
		}
		return r.Length(), nil
	}
	done := make(chan *Request, 1)
	r, err := w.TagRecvNbx(buf, tag, ^uint64(0), &RequestParam{Callback: func(r *Request) { done <- r }})
	if err != nil {
		return 0, err
	}
	if r.Done() { // completed in the call: no callback
		return r.Length(), r.Err()
	}
	select {
	case r := <-done:
		return r.Length(), r.Err()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Active messages from three goroutines at once, eager and rendezvous, while another
// goroutine sleeps on the receiver's events and progresses it: every message reaches
// the handler intact (rendezvous data pulled with RecvData).
func TestActiveMessageStress(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var bad, good atomic.Int64
		require.NoError(t, p.b.SetAmHandler(9, func(m *AmMessage) {
			want := pattern(m.Length(), int64(m.Header[0]))
			if m.IsRendezvous() {
				buf := make([]byte, m.Length())
				r, err := m.RecvData(buf, nil)
				if err != nil {
					bad.Add(1)
					return
				}
				go func() {
					if r.Wait(ctx) != nil || !bytes.Equal(buf, want) {
						bad.Add(1)
					} else {
						good.Add(1)
					}
				}()
				return
			}
			if !bytes.Equal(m.Data(), want) {
				bad.Add(1)
			} else {
				good.Add(1)
			}
		}))
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			untilClosed(stop, func() { _ = p.b.WaitForEvents(ctx, time.Millisecond); p.b.Progress() })
		}()
		errc := make(chan error, 4)
		for g := 0; g < 3; g++ {
			go func() {
				for i := 0; i < 200; i++ {
					n := []int{0, 8, 1000, 70000}[(i+g)%4]
					seed := byte(i)
					s, err := p.epA.AmSendNbx(9, []byte{seed}, pattern(n, int64(seed)), nil)
					if err == nil {
						err = s.Wait(ctx)
					}
					if err != nil {
						errc <- fmt.Errorf("g%d i%d: %w", g, i, err)
						return
					}
				}
				errc <- nil
			}()
		}
		for g := 0; g < 3; g++ {
			require.NoError(t, <-errc)
		}
		require.Eventually(t, func() bool { return good.Load()+bad.Load() == 600 }, 20*time.Second, time.Millisecond, "good %d bad %d", good.Load(), bad.Load())
		close(stop)
		<-done
		require.Zero(t, bad.Load())
	})
}
