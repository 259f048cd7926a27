package ucp

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// Sealed envelopes: the bytes peers exchange (packed rkeys, worker addresses, the
// revocation protocol's messages, handshake frames). UCX parses rkeys and addresses
// without bounds checks, so garbage would crash this process inside UCX; the seal
// makes sure that what reaches UCX was made by a holder of the auth key, and a
// structural check (checkRkeyPayload, checkAddressPayload) stops what is malformed even
// then.
//
//	magic  [4]byte   what the envelope holds (and, for frames, the direction)
//	sender [16]byte  the sealing context's identity (associated data)
//	nonce  [12]byte
//	box    []byte    AES-256-GCM of the contents, with its 16-byte tag
//
// The contents are encrypted: a packed rkey's region address and UCX's own bytes are
// not exposed on the wire.
const (
	idLen        = 16
	sealMagicLen = 4
	sealNonceLen = 12
	sealTagLen   = 16
	sealHead     = sealMagicLen + idLen + sealNonceLen
	sealOverhead = sealHead + sealTagLen
	maxSealed    = maxFrame

	rkeyMagic    = "UCR2"
	addressMagic = "UCA2"
	controlMagic = "UCV3" // 3: every control message carries a freshness sequence (25 bytes)

	rkeyFixed      = 8 + 8 + 8 // key id, base, length
	maxRkeyPayload = 4 << 10
	minAddrPayload = 16
	maxAddrPayload = maxFrame - sealOverhead - infoFixed
)

type sealer struct{ aead cipher.AEAD }

func newSealer(key []byte, label string) sealer {
	k := macOf(key, label) // 32 bytes: AES-256
	block, err := aes.NewCipher(k)
	if err != nil {
		panic(err) // cannot happen: the key has a valid length
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return sealer{aead: aead}
}

func (s sealer) seal(magic string, sender [idLen]byte, plain []byte) []byte {
	out := make([]byte, sealHead, sealOverhead+len(plain))
	copy(out, magic)
	copy(out[sealMagicLen:], sender[:])
	if _, err := rand.Read(out[sealMagicLen+idLen : sealHead]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return s.aead.Seal(out, out[sealMagicLen+idLen:sealHead], plain, out[:sealMagicLen+idLen])
}

// open checks and decrypts an envelope: ErrInvalidParam for what is not an envelope of
// this kind, ErrAuth for one that fails its MAC (forged, resealed, mutated, or sealed
// under another key).
func (s sealer) open(magic string, b []byte) (sender [idLen]byte, plain []byte, err error) {
	if len(b) < sealOverhead || len(b) > maxSealed || string(b[:sealMagicLen]) != magic {
		return sender, nil, fmt.Errorf("%d bytes are not a sealed ucpx %s: %w", len(b), sealKind(magic), ErrInvalidParam)
	}
	plain, err = s.aead.Open(nil, b[sealMagicLen+idLen:sealHead], b[sealHead:], b[:sealMagicLen+idLen])
	if err != nil {
		// Both: bad input to the call, and a failed authentication.
		return sender, nil, fmt.Errorf("sealed %s fails its MAC (forged, altered, or sealed under another auth key): %w: %w", sealKind(magic), ErrAuth, ErrInvalidParam)
	}
	copy(sender[:], b[sealMagicLen:])
	return sender, plain, nil
}

func sealKind(magic string) string {
	switch magic {
	case rkeyMagic:
		return "rkey"
	case addressMagic:
		return "worker address"
	case controlMagic:
		return "control message"
	}
	return "handshake frame"
}

// rkeyInfo is an opened rkey envelope.
type rkeyInfo struct {
	sender       [idLen]byte
	keyID        uint64
	base, length uint64
	payload      []byte
	// ipc: the key is of a device region, exported for CUDA IPC (ipc.go).
	ipc *protocol.IPCMessage
	// shared: the key is of shared signal words (sharedwords.go); payload is UCX's.
	shared *streamcore.SharedWords
}

func sealRkey(s sealer, sender [idLen]byte, keyID, base, length uint64, payload []byte) []byte {
	plain := make([]byte, rkeyFixed+len(payload))
	binary.LittleEndian.PutUint64(plain, keyID)
	binary.LittleEndian.PutUint64(plain[8:], base)
	binary.LittleEndian.PutUint64(plain[16:], length)
	copy(plain[rkeyFixed:], payload)
	return s.seal(rkeyMagic, sender, plain)
}

// openRkey opens and checks a packed rkey: sealed by a key holder, a region that does
// not wrap, and a UCX payload of the expected shape.
func openRkey(s sealer, b []byte) (rkeyInfo, error) {
	sender, plain, err := s.open(rkeyMagic, b)
	if err != nil {
		return rkeyInfo{}, err
	}
	if len(plain) <= rkeyFixed {
		return rkeyInfo{}, fmt.Errorf("rkey without UCX payload: %w", ErrInvalidParam)
	}
	k := rkeyInfo{
		sender: sender,
		keyID:  binary.LittleEndian.Uint64(plain),
		base:   binary.LittleEndian.Uint64(plain[8:]),
		length: binary.LittleEndian.Uint64(plain[16:]),
	}
	if k.length == 0 || k.base+k.length < k.base {
		return rkeyInfo{}, fmt.Errorf("rkey region [%#x, +%d) is empty or wraps: %w", k.base, k.length, ErrInvalidParam)
	}
	k.payload = plain[rkeyFixed:]
	if isSharedWordsPayload(k.payload) {
		sw, inner, err := decodeSharedWordsPayload(k.payload, k.length)
		if err != nil {
			return rkeyInfo{}, err
		}
		k.shared, k.payload = &sw, inner
		return k, nil
	}
	if isIPCPayload(k.payload) {
		m, err := decodeIPCPayload(k.payload, k.base, k.length)
		if err != nil {
			return rkeyInfo{}, err
		}
		k.ipc = &m
		return k, nil
	}
	return k, checkRkeyPayload(k.payload)
}

// checkRkeyPayload walks UCX 1.13's packed rkey layout (ucp_rkey_pack_uct): an 8-byte
// map of memory domains, a memory type byte, then per domain in the map a size byte
// and that many bytes; what follows (system device distances) is UCX's. A payload that
// cannot hold what its map announces would make ucp_ep_rkey_unpack read past it.
func checkRkeyPayload(p []byte) error {
	if len(p) < 9 || len(p) > maxRkeyPayload {
		return fmt.Errorf("UCX rkey payload of %d bytes: %w", len(p), ErrInvalidParam)
	}
	mdMap := binary.LittleEndian.Uint64(p)
	if mdMap == 0 || p[8] >= 16 {
		return fmt.Errorf("UCX rkey payload: md map %#x, memory type %d: %w", mdMap, p[8], ErrInvalidParam)
	}
	off := 9
	for i := 0; i < bits.OnesCount64(mdMap); i++ {
		if off >= len(p) {
			return fmt.Errorf("UCX rkey payload truncated (md %d of %d): %w", i, bits.OnesCount64(mdMap), ErrInvalidParam)
		}
		off += 1 + int(p[off])
		if off > len(p) {
			return fmt.Errorf("UCX rkey payload truncated (md %d): %w", i, ErrInvalidParam)
		}
	}
	return nil
}

// checkAddressPayload bounds a UCX worker address: UCX's parser asserts on (or reads
// past) a short one.
func checkAddressPayload(p []byte) error {
	if len(p) < minAddrPayload || len(p) > maxAddrPayload {
		return fmt.Errorf("UCX worker address of %d bytes: %w", len(p), ErrInvalidParam)
	}
	return nil
}

func sealAddress(s sealer, self *peerInfo) []byte {
	return s.seal(addressMagic, self.id, self.encode())
}

// openAddress opens a sealed worker address.
func openAddress(s sealer, b []byte) (peerInfo, error) {
	sender, plain, err := s.open(addressMagic, b)
	if err != nil {
		return peerInfo{}, err
	}
	return decodePeerInfo(sender, plain)
}
