package bootstrap

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzDecode feeds a peer's bytes to the frame reader: it must return a frame or an
// error (never panic, never allocate past MaxFrame), and a frame it accepts must
// encode back to the bytes it came from.
func FuzzDecode(f *testing.F) {
	for _, fr := range []frame{
		{op: opHello, id: 1, rank: 3, size: 4},
		{op: opSet, id: 2, key: "ucpx/addr/0", value: []byte("addr")},
		{op: opGet, id: 3, key: "k", wait: true},
		{op: opBarrier, id: 4, gen: 7},
		{op: opBye, id: 5},
		{op: opOK, id: 6, value: []byte("v")},
		{op: opErr, id: 7, code: codeRank, rank: 2, message: "rank 2 failed"},
		{op: opFailed, rank: 9},
		{op: opCancel, id: 8},
		{op: opErr, id: 9, code: codeLeft, rank: 1, message: "rank 1 left the job"},
	} {
		f.Add(fr.encode(nil))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{0, 0, 0, 9, byte(opSet), 0, 0, 0, 1, 0xff, 0xff, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			start := len(b) - r.Len()
			fr, err := readFrame(r)
			if err != nil {
				if !errors.Is(err, ErrProtocol) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			end := len(b) - r.Len()
			if got := fr.encode(nil); !bytes.Equal(got, b[start:end]) {
				t.Fatalf("frame %+v re-encodes to %x, came from %x", fr, got, b[start:end])
			}
		}
	})
}
