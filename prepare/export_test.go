package prepare

import (
	"time"

	"github.com/ucpx/ucpx/ucp"
)

// Fail records err as the peer's failure, as the endpoint's failure hook does.
func Fail(r *Request, err error) { r.fail(err) }

// Staged makes a request with p stage its host buffer as it stages a device buffer
// (a host copy, copies on the request's streams), so the staged protocol runs on host
// streams.
func Staged(p Params) Params { p.stage = true; return p }

func DebugWords(r *Request) (words, landed []uint64) {
	for i := range r.words.Len() {
		words = append(words, r.words.Word(i).Load())
	}
	if r.st != nil && r.st.landed != nil {
		for i := range r.st.landed.Len() {
			landed = append(landed, r.st.landed.Word(i).Load())
		}
	}
	return
}

// Direct reports whether r took the CUDA-IPC path (nothing staged).
func Direct(r *Request) bool { return r.direct && r.st == nil }

// DrainsEagerly reports whether r's worker registry starts its drainer at once (an
// ack was late once).
func DrainsEagerly(r *Request) bool {
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	return r.reg.eagerLeft > 0
}

// MakeEager makes r's worker registry eager for n drains, as a late ack does.
func MakeEager(r *Request, n int) {
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	r.reg.eagerLeft = n
}

// Relaxed is how many times r's worker registry went from eager back to lazy.
func Relaxed(r *Request) int {
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	return r.reg.relaxed
}

// ForgedHandshake is a well-formed sender handshake for tag that no request asked
// for, its keys keyBytes long each.
func ForgedHandshake(tag uint64, keyBytes int) []byte {
	key := make([]byte, keyBytes)
	h := handshake{role: sender, tag: tag, parts: 1, length: 8, bufKey: key, wordKey: key, ackKey: key}
	return h.marshal()
}

// EarlyHeld is how many handshakes w's registry holds for requests not made yet, and
// their size.
func EarlyHeld(w *ucp.Worker) (n, bytes int) {
	v, ok := registries.Load(w)
	if !ok {
		return 0, 0
	}
	g := v.(*registry)
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.early), g.earlyBytes
}

// EarlyHeldPerPeer is how many handshakes w's registry holds for requests not made
// yet from each peer that has any.
func EarlyHeldPerPeer(w *ucp.Worker) []int {
	v, ok := registries.Load(w)
	if !ok {
		return nil
	}
	g := v.(*registry)
	g.mu.Lock()
	defer g.mu.Unlock()
	per := map[*ucp.Endpoint]int{}
	for k := range g.early {
		per[k.peer]++
	}
	var ns []int
	for _, n := range per {
		ns = append(ns, n)
	}
	return ns
}

const MaxEarly, MaxEarlyBytes, MaxEarlyPerPeer = maxEarly, maxEarlyBytes, maxEarlyPerPeer

// FreezeEarlyClock stops the clock w's registry tells the age of kept handshakes by,
// so that none grows old (a test of the bounds must not race their expiry), until
// thaw: then the handshakes kept meanwhile are as old as the freeze.
func FreezeEarlyClock(w *ucp.Worker) (thaw func()) {
	v, ok := registries.Load(w)
	if !ok {
		panic("FreezeEarlyClock: the worker has no prepared requests yet")
	}
	g := v.(*registry)
	frozen := time.Now()
	g.mu.Lock()
	g.clock = func() time.Time { return frozen }
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.clock = time.Now
		g.mu.Unlock()
	}
}

// Failed is r's sticky error, looked at without progressing anything.
func Failed(r *Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// ForgeFailedFlag stores the failure value into sender r's ready flag p, as a peer
// could write it without failing.
func ForgeFailedFlag(r *Request, p int) { r.words.Word(p).Store(failedWord) }
