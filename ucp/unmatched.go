package ucp

import (
	"encoding/binary"
	"fmt"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// TagBits is how many low bits of a tag belong to the caller. The bits above carry
// the sending worker's source id, which the receiver's unmatched-data limit charges
// (WorkerParams.UnmatchedLimit): sends set them, receive masks ignore them, and
// SenderTag never shows them. A tag above MaxTag is refused with ErrInvalidParam; a
// mask may have any bits set.
const TagBits = ucx.TagBits

// MaxTag is the largest tag a send or receive accepts.
const MaxTag = 1<<TagBits - 1

// DefaultUnmatchedLimit is WorkerParams.UnmatchedLimit's default: 256 MiB per peer,
// room for a legitimate backlog (a thousand rendezvous messages of any size, or 256 MiB
// of eager data nobody has asked for yet) that still stops a flood.
const DefaultUnmatchedLimit = 256 << 20

// UnmatchedLimitError is how an endpoint fails once its peer passed
// WorkerParams.UnmatchedLimit. It matches ErrExceedsLimit.
type UnmatchedLimitError struct {
	Endpoint string // the endpoint to the peer
	Held     uint64 // what the peer's unmatched messages held when it was cut off
	Limit    uint64
}

func (e *UnmatchedLimitError) Error() string {
	return fmt.Sprintf("ucp: %s: the peer's unmatched messages held %d bytes, over WorkerParams.UnmatchedLimit (%d): they were discarded, and so is what it sends later: %v", e.Endpoint, e.Held, e.Limit, ErrExceedsLimit)
}

func (e *UnmatchedLimitError) Unwrap() error { return ErrExceedsLimit }

// checkTag refuses a tag with bits above MaxTag.
func checkTag(op string, tag uint64) error {
	if tag > MaxTag {
		return opErr(op, ErrInvalidParam, "tag %#x above MaxTag (%#x): the top %d bits carry the sender's source id", tag, uint64(MaxTag), 64-TagBits)
	}
	return nil
}

// sourceOf is the source id a worker's sends carry, from what its peers learn about
// it (the handshake or its sealed address): a MAC, under the context's master secret
// (trust.master: from the auth key), of its identity and its UCX address: 15 bits (the
// tag's top bit marks pulled messages, tagpull.go). Tag messages carry no proof of
// who sent them, so with an auth key a peer that lacks it cannot compute another's id
// and charge its messages to it (its unmatched-data cut-off, tagpull.go's answers by
// tag); without a key anyone can. Two workers share an id with probability 2^-15 per
// pair; they then share one budget.
func sourceOf(t *trust, id [idLen]byte, addr []byte) uint64 {
	sum := macOf(t.master[:], "ucpx source id", id[:], addr)
	return uint64(binary.LittleEndian.Uint16(sum)) & (1<<(63-TagBits) - 1)
}

// startUnmatched sets this worker's source id and its ledger's limit.
func (w *Worker) startUnmatched(limit int64) error {
	if w.ctx.features&FeatureTag == 0 {
		return nil
	}
	self, err := w.selfInfo()
	if err != nil {
		return err
	}
	w.source = sourceOf(w.ctx.trust, self.id, self.addr)
	switch {
	case limit == 0:
		w.unmatchedLimit = DefaultUnmatchedLimit
	case limit < 0:
		w.unmatchedLimit = 0 // off
	default:
		w.unmatchedLimit = uint64(limit)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() { // its context closed meanwhile
		return ErrClosed
	}
	w.raw.SetUnmatched(w.unmatchedLimit, w.source)
	return nil
}

// UnmatchedHeld reports how many bytes messages from ep's peer hold on this worker
// unmatched, as the limit counts them: data up to 256 KiB per message (a larger one
// is a rendezvous header whose data waits at the sender) plus 256 B each. Messages
// count once they sat unexpected for a while (looked at every 16 progress calls that
// progressed something), so a message matched quickly never does.
func (ep *Endpoint) UnmatchedHeld() uint64 {
	if ep == nil {
		return 0
	}
	w := ep.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ep.peerKnown || w.closed.Load() {
		return 0
	}
	return w.raw.UnmatchedHeld(ep.source)
}

// cutOffLocked fails every endpoint whose peer has source id src: it sent more
// unmatched data than the limit allows. Its queued messages were discarded already,
// and so will be what it sends later.
func (w *Worker) cutOffLocked(src uint64, held int) {
	for _, ep := range w.eps {
		if !ep.peerKnown || ep.source != src || ep.err != nil || ep.closed {
			continue
		}
		err := &UnmatchedLimitError{Endpoint: ep.String(), Held: uint64(held), Limit: w.unmatchedLimit}
		ep.failLocked(err)
		ep.orphanRecvsLocked()
	}
	// What failing them completed, afterLocked (which drains the events this came
	// from) takes in its next pass.
}
