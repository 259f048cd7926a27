package ucp

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// Fuzz targets for every decoder a peer's bytes reach: sealed envelopes (rkeys, worker
// addresses, revocation messages), the UCX payload shape checks, and both sides of the
// handshake. `make fuzz` runs each for a few seconds; the corpus under
// testdata/fuzz holds the inputs that crashed UCX before sealing.

var fuzzTrust = func() *trust {
	t, err := newTrust([]byte("fuzzing key, 32 bytes long......"))
	if err != nil {
		panic(err)
	}
	return t
}()

// refused reports whether err is one of the errors a decoder may give.
func refused(err error) bool {
	return errors.Is(err, ErrInvalidParam) || errors.Is(err, ErrAuth)
}

func FuzzOpenRkey(f *testing.F) {
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00})
	f.Add(sealRkey(fuzzTrust.seal, fuzzTrust.id, 1, 0x1000, 64, []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 9, 9}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := openRkey(fuzzTrust.seal, b); err != nil && !refused(err) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		// The same bytes as a key holder's sealed contents: the shape checks.
		if len(b) >= rkeyFixed {
			sealed := fuzzTrust.seal.seal(rkeyMagic, fuzzTrust.id, b)
			k, err := openRkey(fuzzTrust.seal, sealed)
			if err != nil && !refused(err) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			if err == nil && (checkRkeyPayload(k.payload) != nil || k.length == 0) {
				t.Fatal("accepted a key its own checks refuse")
			}
		}
		if err := checkRkeyPayload(b); err != nil && !refused(err) {
			t.Fatal(err)
		}
	})
}

func FuzzOpenAddress(f *testing.F) {
	f.Add([]byte{0x0f})
	f.Add(sealAddress(fuzzTrust.seal, &peerInfo{id: fuzzTrust.id, pid: 42, addr: bytes.Repeat([]byte{3}, 40)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := openAddress(fuzzTrust.seal, b); err != nil && !refused(err) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		p, err := decodePeerInfo(fuzzTrust.id, b)
		if err != nil && !refused(err) {
			t.Fatal(err)
		}
		if err == nil && checkAddressPayload(p.addr) != nil {
			t.Fatal("accepted an address its own check refuses")
		}
	})
}

func FuzzControl(f *testing.F) {
	f.Add(fuzzTrust.seal.seal(controlMagic, fuzzTrust.id, encodeControl(ctlRevoke, 7)))
	f.Add([]byte("UCV3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, _, err := decodeControl(fuzzTrust.seal, b); err != nil && !refused(err) {
			t.Fatal(err)
		}
		if _, _, _, err := decodeControl(fuzzTrust.seal, fuzzTrust.seal.seal(controlMagic, fuzzTrust.id, b)); err != nil && !refused(err) {
			t.Fatal(err)
		}
	})
}

// fuzzConn feeds a handshake from b and swallows what it writes.
type fuzzConn struct{ r io.Reader }

func (c *fuzzConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *fuzzConn) Write(p []byte) (int, error) { return len(p), nil }

// FuzzHandshakeServer: whatever a client sends, the server refuses it (nobody without
// the key can produce the client's MAC for the server's fresh nonce).
func FuzzHandshakeServer(f *testing.F) {
	f.Add([]byte{0x0f})
	f.Add(append([]byte(hsMagic+"\x01"), bytes.Repeat([]byte{0}, hsClientHello)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h := &handshake{t: fuzzTrust, rw: &fuzzConn{bytes.NewReader(b)}}
		self := peerInfo{id: fuzzTrust.id, addr: bytes.Repeat([]byte{1}, 32)}
		if _, err := h.server(&self); err == nil {
			t.Fatal("a client without the key passed the handshake")
		}
	})
}

// FuzzHandshakeClient: whatever a server sends, the client fails cleanly.
func FuzzHandshakeClient(f *testing.F) {
	f.Add(append([]byte(hsMagic+"\x01"), bytes.Repeat([]byte{9}, hsNonce+hsMAC+8)...))
	f.Add([]byte(hsMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		h := &handshake{t: fuzzTrust, rw: &fuzzConn{bytes.NewReader(b)}}
		self := peerInfo{id: fuzzTrust.id, addr: bytes.Repeat([]byte{1}, 32)}
		if _, err := h.client(&self); err == nil {
			t.Fatal("a server without the key passed the handshake")
		}
		// After a genuine start, the frames: bounded, sealed, checked.
		h2 := &handshake{t: fuzzTrust, rw: &fuzzConn{bytes.NewReader(b)}}
		h2.start()
		if _, err := h2.readInfo(serverInfoSeal); err == nil {
			t.Fatal("an unsealed frame was accepted")
		}
		h3 := &handshake{t: fuzzTrust, rw: &fuzzConn{bytes.NewReader(b)}}
		h3.start()
		if err := h3.readDecision(); err == nil {
			t.Fatal("an unsealed decision was accepted")
		}
	})
}

// FuzzDecodePull: a pulled message's descriptor (its plain text, after the envelope
// opened) never panics the decoder, and what it accepts lies inside the input and
// encodes back to the same bytes.
func FuzzDecodePull(f *testing.F) {
	f.Add(encodePull(5, AmReply|pullNoPeerErrFlag, 9, 64, 4096, []byte("key"), []byte("address"), []byte("hdr")))
	f.Add(encodePull(0, pullHelloFlag, 0, 0, 0, nil, []byte("address"), nil))
	f.Add(make([]byte, pullFixed))
	f.Fuzz(func(t *testing.T, plain []byte) {
		id, flags, ref, packed, addr, header, ok := decodePull(plain)
		if !ok {
			return
		}
		if ref.length > 1<<62 || len(packed)+len(addr)+len(header)+pullFixed != len(plain) {
			t.Fatalf("accepted an inconsistent descriptor: length %d, parts %d+%d+%d of %d", ref.length, len(packed), len(addr), len(header), len(plain))
		}
		again := encodePull(id, AmSendFlags(flags), ref.op, ref.off, ref.length, packed, addr, header)
		if !bytes.Equal(again, plain) {
			t.Fatalf("decode/encode changed the descriptor")
		}
	})
}
