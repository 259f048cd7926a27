package prepare

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzUnmarshalHandshake: a peer's prepare-phase message never panics the decoder;
// what it accepts has a role, a partition count in range (none only for a refusal,
// which carries no keys), and marshals back to the same bytes; what it refuses is
// ErrInvalidParam.
func FuzzUnmarshalHandshake(f *testing.F) {
	f.Add((&handshake{role: sender, tag: 7, parts: 8, length: 4096, wordBase: 0x1000, wordKey: []byte("key"), ackBase: 0x2000, ackKey: []byte("ack")}).marshal())
	f.Add((&handshake{role: receiver, tag: 7, index: 1, parts: 1, length: 64, base: 0x3000, bufKey: []byte("buf"), wordKey: []byte("w")}).marshal())
	f.Add((&handshake{role: receiver, tag: 7, index: 2, length: 64}).marshal()) // a refusal
	f.Add((&handshake{role: sender, tag: 7, index: 3}).marshal())               // a freed request's refusal
	f.Add([]byte("ucpxprep"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := unmarshalHandshake(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidParam) {
				t.Fatalf("refused with %v, want ErrInvalidParam", err)
			}
			return
		}
		if (h.role != sender && h.role != receiver) || h.parts > maxPartitions {
			t.Fatalf("accepted role %d with %d partitions", h.role, h.parts)
		}
		if h.refused() && len(h.bufKey)+len(h.wordKey)+len(h.ackKey) != 0 {
			t.Fatal("accepted a refusal with keys")
		}
		if !bytes.Equal(h.marshal(), b) {
			t.Fatal("unmarshal/marshal changed the message")
		}
	})
}
