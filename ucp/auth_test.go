package ucp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// keyedPair connects a client context (keyA) to a listening context (keyB) over tcp;
// it returns the client's Connect error (and the listener, for its counters).
func keyedPair(t *testing.T, keyA, keyB []byte) (*pair, *Listener, error) {
	t.Helper()
	cfg := map[string]string{"TLS": "tcp"}
	return listenPair(t, ContextParams{Config: cfg, AuthKey: keyA}, ContextParams{Config: cfg, AuthKey: keyB})
}

func TestAuthRefusesPeersWithoutTheKey(t *testing.T) {
	before := Live()
	other := []byte("another key, also 32 bytes long!")
	for _, c := range []struct {
		name       string
		keyA, keyB []byte
	}{
		{"no key", nil, testKey},
		{"wrong key", other, testKey},
		{"server without key", testKey, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, l, err := keyedPair(t, c.keyA, c.keyB)
			require.ErrorIs(t, err, ErrAuth, "%v", err)
			require.Nil(t, p.epA)
			require.Nil(t, p.epB, "the server made an endpoint for an unauthenticated peer")
			if c.keyB != nil {
				require.Eventually(t, func() bool { return l.Refused() == 1 }, 5*time.Second, time.Millisecond)
			}
		})
	}
	p, l, err := keyedPair(t, testKey, testKey)
	require.NoError(t, err)
	require.Zero(t, l.Refused())
	require.True(t, p.ctxA.Authenticated())
	// The endpoints carry messages both ways.
	msg := pattern(1000, 1)
	s, err := p.epA.TagSendNbx(msg, 7, nil)
	require.NoError(t, err)
	buf := make([]byte, 1000)
	r, err := p.b.TagRecvNbx(buf, 7, ^uint64(0), nil)
	require.NoError(t, err)
	p.wait(t, s, r)
	require.Equal(t, checksum(msg), checksum(buf))
	require.NoError(t, l.Close())
	p.close(t)
	require.Equal(t, before, Live())
}

// A client that sends bytes of its own choosing gets exactly its fixed-size hello
// read and compared, and is disconnected: nothing it sent is parsed, nothing reaches
// UCX, and no request is queued.
func TestListenerReadsNothingFromUnauthenticatedPeers(t *testing.T) {
	ctx, err := NewContext(ContextParams{Config: map[string]string{"TLS": "tcp"}, AuthKey: testKey})
	require.NoError(t, err)
	defer ctx.Close()
	w, err := ctx.NewWorker(WorkerParams{})
	require.NoError(t, err)
	l, err := w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	inputs := [][]byte{
		nil,
		{0x0f}, // the 1-byte worker address that aborted UCX
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}, // the 9-byte rkey payload that crashed it
		bytes.Repeat([]byte{0xff}, hsClientHello),
		append([]byte(hsMagic+"\x01"), bytes.Repeat([]byte{7}, hsClientHello+4096)...),
		pattern(1<<20, 3),
	}
	for i, in := range inputs {
		c, err := net.Dial("tcp", l.Addr())
		require.NoError(t, err)
		hello := make([]byte, hsServerHello)
		_, err = io.ReadFull(c, hello)
		require.NoError(t, err)
		require.Equal(t, hsMagic, string(hello[:len(hsMagic)]))
		go func() { _, _ = c.Write(in) }()
		if len(in) < hsClientHello {
			_ = c.(*net.TCPConn).CloseWrite()
		}
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		rest, err := io.ReadAll(c)
		require.Empty(t, rest, "input %d: the server answered an unauthenticated peer", i)
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "input %d: the server kept the connection", i)
		_ = c.Close()
		require.Eventually(t, func() bool { return l.Refused() == i+1 }, 5*time.Second, time.Millisecond)
	}
	w.mu.Lock()
	require.Empty(t, l.backlog)
	require.Empty(t, w.eps)
	w.mu.Unlock()
	require.NoError(t, l.Close())
}

func TestListenBeyondLoopbackNeedsKey(t *testing.T) {
	open, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer open.Close()
	w, err := open.NewWorker(WorkerParams{})
	require.NoError(t, err)
	_, err = w.Listen(":0", nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Contains(t, err.Error(), "AllowUnauthenticated")
	require.Contains(t, err.Error(), AuthKeyFileEnv)
	l, err := w.Listen(":0", &ListenerParams{AllowUnauthenticated: true})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l, err = w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	require.NoError(t, l.Close())

	keyed, err := NewContext(ContextParams{AuthKey: testKey})
	require.NoError(t, err)
	defer keyed.Close()
	kw, err := keyed.NewWorker(WorkerParams{})
	require.NoError(t, err)
	l, err = kw.Listen(":0", nil)
	require.NoError(t, err)
	require.NoError(t, l.Close())

	_, err = NewContext(ContextParams{AuthKey: []byte("short")})
	require.ErrorIs(t, err, ErrInvalidParam)
}

func TestAuthKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ucpx.key")
	key, err := GenerateAuthKey()
	require.NoError(t, err)
	require.NoError(t, WriteAuthKeyFile(path, key))
	require.Error(t, WriteAuthKeyFile(path, key), "overwrote a key file")
	got, err := ReadAuthKeyFile(path)
	require.NoError(t, err)
	require.Equal(t, key, got)
	t.Setenv(AuthKeyFileEnv, path)
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	require.True(t, c.Authenticated())
	require.NoError(t, c.Close())

	require.NoError(t, os.Chmod(path, 0o644))
	_, err = NewContext(ContextParams{})
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Contains(t, err.Error(), "chmod 600")
	bad := filepath.Join(dir, "bad.key")
	require.NoError(t, os.WriteFile(bad, []byte("not hex"), 0o600))
	t.Setenv(AuthKeyFileEnv, bad)
	_, err = NewContext(ContextParams{})
	require.ErrorIs(t, err, ErrInvalidParam)
}

// With the key, rkeys and addresses that were resealed, forged, altered or replayed
// by another peer are refused before UCX sees them.
func TestSealedKeysRefuseForgery(t *testing.T) {
	p, _, err := keyedPair(t, testKey, testKey)
	require.NoError(t, err)
	m, err := p.ctxB.MemAlloc(4096)
	require.NoError(t, err)
	packed, err := m.PackRkey()
	require.NoError(t, err)
	require.NotContains(t, string(packed), string(le64(uint64(m.Address()))), "the region's address travels in clear")

	// Every single-byte mutation fails.
	for i := range packed {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			bad := bytes.Clone(packed)
			bad[i] ^= x
			_, err := p.epA.UnpackRkey(bad)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrInvalidParam) || errors.Is(err, ErrAuth), "%v", err)
		}
	}
	for _, n := range []int{0, 1, sealOverhead - 1, len(packed) - 1} {
		_, err := p.epA.UnpackRkey(packed[:n])
		require.ErrorIs(t, err, ErrInvalidParam)
	}
	// Resealed by someone without the key (the public key) with the victim's address.
	pub := newSealer(mustTrust(t, nil).master[:], "ucpx seal v1")
	forged := sealRkey(pub, p.ctxB.trust.id, m.keyID, 0x1000, 1<<40, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0})
	_, err = p.epA.UnpackRkey(forged)
	require.ErrorIs(t, err, ErrAuth)
	// Sealed with the right key by a key holder, but malformed for UCX: stopped by the
	// shape check (the 9-byte payload that crashed ucp_ep_rkey_unpack).
	kb := p.ctxB.trust
	for _, payload := range [][]byte{
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0},
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 200},
		{1, 0, 0, 0, 0, 0, 0, 0, 40},
	} {
		_, err = p.epA.UnpackRkey(sealRkey(kb.seal, kb.id, m.keyID, 0x1000, 64, payload))
		require.ErrorIs(t, err, ErrInvalidParam)
	}
	_, err = p.epA.UnpackRkey(sealRkey(kb.seal, kb.id, m.keyID, ^uint64(0)-10, 64, nil))
	require.ErrorIs(t, err, ErrInvalidParam)
	// A genuine key of another peer (C) replayed on the connection to B.
	c, err := NewContext(ContextParams{AuthKey: testKey})
	require.NoError(t, err)
	defer c.Close()
	mc, err := c.MemAlloc(64)
	require.NoError(t, err)
	pc, err := mc.PackRkey()
	require.NoError(t, err)
	_, err = p.epA.UnpackRkey(pc)
	require.ErrorIs(t, err, ErrAuth)
	// The genuine key works.
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	require.Equal(t, uint64(m.Address()), rk.Base())
	require.NoError(t, rk.Close())

	// Worker addresses.
	addr, err := p.b.Address()
	require.NoError(t, err)
	for i := range addr {
		bad := bytes.Clone(addr)
		bad[i] ^= 0x40
		_, err := p.a.ConnectAddress(bad, nil)
		require.ErrorIs(t, err, ErrInvalidAddr)
		require.True(t, errors.Is(err, ErrInvalidParam) || errors.Is(err, ErrAuth), "%v", err)
	}
	self := peerInfo{id: kb.id, pid: 1, addr: []byte{0x0f}} // the 1-byte address that aborted UCX
	_, err = p.a.ConnectAddress(sealAddress(kb.seal, &self), nil)
	require.ErrorIs(t, err, ErrInvalidAddr)
	_, err = p.a.ConnectAddress(sealAddress(pub, &peerInfo{id: kb.id, addr: bytes.Repeat([]byte{1}, 64)}), nil)
	require.ErrorIs(t, err, ErrAuth)
	require.NoError(t, m.Close())
	require.NoError(t, mc.Close())
}

func mustTrust(t *testing.T, key []byte) *trust {
	tr, err := newTrust(key)
	require.NoError(t, err)
	return tr
}

func le64(v uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return b
}
