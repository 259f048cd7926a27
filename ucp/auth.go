package ucp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/protocol"
)

// The trust boundary (README, "Trust model"). A context holds a pre-shared secret, or
// none. Every byte a peer sends before it proved it holds the secret is read into
// fixed-size buffers and only compared: the handshake's first client frame is a nonce
// and a MAC. Worker addresses, rkeys and the revocation protocol travel sealed
// (AES-256-GCM under a key derived from the secret, the sender's identity bound in as
// associated data), so what UCX parses came from a key holder. Without a secret the
// same formats are used with a public key: they catch corruption, not forgery, and
// listening is limited to loopback unless ListenerParams.AllowUnauthenticated.

var (
	// ErrAuth: the peer did not prove it holds the context's auth key (wrong or missing
	// key), or sealed bytes (rkey, worker address, handshake frame) fail their MAC or
	// name a sender other than the endpoint's peer.
	ErrAuth = errs.New("ucp: authentication failed")
	// ErrRevoked: the remote key was revoked by the memory's owner (MemH.Close on the
	// exporting side); the region may have been reused and the key is unusable.
	ErrRevoked = errs.New("ucp: remote key revoked by its owner")
)

// AuthKeyFileEnv names the environment variable read by NewContext when
// ContextParams.AuthKey is empty: the path of a key file written by `ucpx keygen`
// (hex text, mode 0600).
const AuthKeyFileEnv = "UCPX_AUTH_KEY_FILE"

// MinAuthKeyLen is the shortest auth key accepted (bytes).
const MinAuthKeyLen = 16

// GenerateAuthKey returns a new random 32-byte auth key.
func GenerateAuthKey() ([]byte, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("generate auth key: %w", err)
	}
	return k, nil
}

// WriteAuthKeyFile writes key as hex to path, readable by its owner only; it refuses
// to overwrite an existing file.
func WriteAuthKeyFile(path string, key []byte) error {
	if len(key) < MinAuthKeyLen {
		return fmt.Errorf("auth key of %d bytes, want at least %d: %w", len(key), MinAuthKeyLen, ErrInvalidParam)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, hex.EncodeToString(key))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadAuthKeyFile reads a key file written by WriteAuthKeyFile (`ucpx keygen`). A file
// that others may read is refused, as ssh refuses such private keys.
func ReadAuthKeyFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("auth key file: %v: %w", err, ErrInvalidParam)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("auth key file %s has mode %v: others may read it (chmod 600 %s): %w", path, st.Mode().Perm(), path, ErrInvalidParam)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth key file: %v: %w", err, ErrInvalidParam)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < MinAuthKeyLen {
		return nil, fmt.Errorf("auth key file %s: want at least %d bytes as hex (ucpx keygen writes one): %w", path, MinAuthKeyLen, ErrInvalidParam)
	}
	return key, nil
}

// trust is a context's side of the boundary: its identity and keys.
type trust struct {
	keyed  bool
	master [32]byte // derived from the auth key, or the public key without one
	seal   sealer   // rkeys, worker addresses, revocation messages
	id     [idLen]byte
	boot   [idLen]byte // this machine's boot, for same-host peer watching
	pid    uint32
	host   protocol.HostIdentity // for Endpoint.Reach: boot, IPC namespace, device
}

// publicKey stands in for a secret when none is configured: the formats stay the same,
// and corruption is still caught.
var publicKey = []byte("ucpx: no auth key configured (public)")

func newTrust(key []byte) (*trust, error) {
	t := &trust{keyed: len(key) > 0, boot: bootID(), pid: uint32(os.Getpid())}
	if t.keyed && len(key) < MinAuthKeyLen {
		return nil, fmt.Errorf("AuthKey of %d bytes, want at least %d: %w", len(key), MinAuthKeyLen, ErrInvalidParam)
	}
	if !t.keyed {
		key = publicKey
	}
	copy(t.master[:], macOf(key, "ucpx auth v1"))
	t.seal = newSealer(t.master[:], "ucpx seal v1")
	if _, err := rand.Read(t.id[:]); err != nil {
		return nil, err
	}
	// Where /proc does not tell (not Linux), the identity stays zero: peers then see
	// no device path (ReachNone), never a wrong one.
	t.host, _ = protocol.LocalHostIdentity(nil)
	return t, nil
}

// loadAuthKey is ContextParams.AuthKey, else the key file named by UCPX_AUTH_KEY_FILE.
func loadAuthKey(key []byte) ([]byte, error) {
	if len(key) > 0 {
		return append([]byte(nil), key...), nil
	}
	if path := os.Getenv(AuthKeyFileEnv); path != "" {
		return ReadAuthKeyFile(path)
	}
	return nil, nil
}

// Authenticated reports whether the context has an auth key: peers must prove they
// hold it, and sealed bytes are keyed with it.
func (c *Context) Authenticated() bool {
	if c == nil {
		return false
	}
	return c.trust.keyed
}

func macOf(key []byte, label string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	for _, p := range parts {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(p)))
		m.Write(n[:])
		m.Write(p)
	}
	return m.Sum(nil)
}

// bootID identifies where this process's pids mean something (zero if unknown): a
// pid names the same process only on the same boot of the same machine and in the
// same PID namespace (containers and simulated hosts of one machine share the boot
// id but not their pids).
func bootID() (id [idLen]byte) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return id
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil || ns == "" {
		return id
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(string(b)) + "\x00" + ns))
	copy(id[:], h[:])
	return id
}

// The handshake, before anything else crosses a connection:
//
//	server -> client  hello:  magic[8] flags[1] nonceS[32]                 (fixed size)
//	client -> server  hello:  magic[8] flags[1] nonceC[32] macC[32]        (fixed size)
//	server -> client  macS[32], then frame(info of the server)
//	client -> server  frame(info of the client)
//	server -> client  frame(decision), once the request was accepted or rejected
//
// macC = HMAC(K, "client", nonceS, nonceC) and macS = HMAC(K, "server", ...): each
// side proves it holds K for this connection's nonces. The server reads exactly the
// client's fixed-size hello and compares its MAC before it reads or interprets any
// other byte; a client that fails is disconnected. Frames are length-prefixed
// (bounded) and sealed with a key derived from K and both nonces, bound to the
// direction: a frame of one connection is worthless on another.
const (
	hsMagic        = "UCPXHS01"
	hsFlagKeyed    = 1
	hsNonce        = 32
	hsMAC          = 32
	hsServerHello  = len(hsMagic) + 1 + hsNonce
	hsClientHello  = len(hsMagic) + 1 + hsNonce + hsMAC
	maxFrame       = 64 << 10
	infoFixed      = 4 + idLen + protocol.HostIdentitySize // pid, boot, host (the identity is the sealed frame's sender)
	serverInfoSeal = "UCHS"
	clientInfoSeal = "UCHC"
	decisionSeal   = "UCHD"
	decisionAccept = 1
	decisionReject = 2
)

// peerInfo is what a handshake or a sealed worker address tells about a peer.
type peerInfo struct {
	id   [idLen]byte
	pid  uint32
	boot [idLen]byte
	host protocol.HostIdentity
	addr []byte // UCX's worker address, authenticated
}

func (p *peerInfo) encode() []byte {
	out := make([]byte, 4+idLen, infoFixed+len(p.addr))
	binary.LittleEndian.PutUint32(out, p.pid)
	copy(out[4:], p.boot[:])
	out, _ = p.host.AppendBinary(out)
	return append(out, p.addr...)
}

// decodePeerInfo parses an opened info frame or address envelope; addr is checked by
// the caller (checkAddressPayload).
func decodePeerInfo(sender [idLen]byte, b []byte) (peerInfo, error) {
	if len(b) <= infoFixed {
		return peerInfo{}, fmt.Errorf("peer info of %d bytes: %w", len(b), ErrInvalidParam)
	}
	p := peerInfo{id: sender, pid: binary.LittleEndian.Uint32(b)}
	copy(p.boot[:], b[4:])
	host, err := protocol.DecodeHostIdentity(b[4+idLen : infoFixed])
	if err != nil {
		return peerInfo{}, fmt.Errorf("peer info: %w", err)
	}
	p.host = host
	p.addr = append([]byte(nil), b[infoFixed:]...)
	return p, checkAddressPayload(p.addr)
}

// handshake is one side of a connection's handshake.
type handshake struct {
	t       *trust
	rw      io.ReadWriter
	nonceS  [hsNonce]byte
	nonceC  [hsNonce]byte
	session sealer
}

var errHandshakeRefused = errors.New("the server closed the connection during the handshake (wrong or missing auth key?)")

func (h *handshake) flags() byte {
	if h.t.keyed {
		return hsFlagKeyed
	}
	return 0
}

func (h *handshake) mac(label string) []byte {
	return macOf(h.t.master[:], label, h.nonceS[:], h.nonceC[:])
}

func (h *handshake) start() {
	h.session = newSealer(h.mac("session"), "ucpx session v1")
}

// server runs the server's side up to reading the client's info.
func (h *handshake) server(self *peerInfo) (peerInfo, error) {
	if _, err := rand.Read(h.nonceS[:]); err != nil {
		return peerInfo{}, err
	}
	hello := make([]byte, 0, hsServerHello)
	hello = append(append(append(hello, hsMagic...), h.flags()), h.nonceS[:]...)
	if _, err := h.rw.Write(hello); err != nil {
		return peerInfo{}, fmt.Errorf("handshake: %v: %w", err, ErrConnectionReset)
	}
	var in [hsClientHello]byte
	if _, err := io.ReadFull(h.rw, in[:]); err != nil {
		return peerInfo{}, fmt.Errorf("handshake: client hello: %v: %w", err, ErrAuth)
	}
	copy(h.nonceC[:], in[len(hsMagic)+1:])
	// Only the MAC decides; the magic and flags are covered by comparing them whole.
	want := append(append([]byte(hsMagic), h.flags()), h.nonceC[:]...)
	want = append(want, h.mac("client")...)
	if !hmac.Equal(in[:], want) {
		return peerInfo{}, fmt.Errorf("handshake: the client does not hold this listener's auth key: %w", ErrAuth)
	}
	h.start()
	if _, err := h.rw.Write(h.mac("server")); err != nil {
		return peerInfo{}, fmt.Errorf("handshake: %v: %w", err, ErrConnectionReset)
	}
	if err := h.writeFrame(serverInfoSeal, self.encode()); err != nil {
		return peerInfo{}, err
	}
	return h.readInfo(clientInfoSeal)
}

// client runs the client's side up to reading the server's info (then sends its own).
func (h *handshake) client(self *peerInfo) (peerInfo, error) {
	var in [hsServerHello]byte
	if _, err := io.ReadFull(h.rw, in[:]); err != nil {
		return peerInfo{}, fmt.Errorf("handshake: server hello: %v: %w", err, ErrConnectionReset)
	}
	if string(in[:len(hsMagic)]) != hsMagic {
		return peerInfo{}, fmt.Errorf("handshake: the server does not speak ucpx's handshake: %w", ErrAuth)
	}
	switch f := in[len(hsMagic)]; {
	case f&hsFlagKeyed != 0 && !h.t.keyed:
		return peerInfo{}, fmt.Errorf("handshake: the server requires an auth key; set ContextParams.AuthKey or %s: %w", AuthKeyFileEnv, ErrAuth)
	case f&hsFlagKeyed == 0 && h.t.keyed:
		return peerInfo{}, fmt.Errorf("handshake: the server has no auth key and this context has one; refusing an unauthenticated peer: %w", ErrAuth)
	}
	copy(h.nonceS[:], in[len(hsMagic)+1:])
	if _, err := rand.Read(h.nonceC[:]); err != nil {
		return peerInfo{}, err
	}
	out := append(append([]byte(hsMagic), h.flags()), h.nonceC[:]...)
	if _, err := h.rw.Write(append(out, h.mac("client")...)); err != nil {
		return peerInfo{}, fmt.Errorf("handshake: %v: %w", err, ErrConnectionReset)
	}
	var mac [hsMAC]byte
	if _, err := io.ReadFull(h.rw, mac[:]); err != nil {
		return peerInfo{}, fmt.Errorf("handshake: %v: %w", errHandshakeRefused, ErrAuth)
	}
	if !hmac.Equal(mac[:], h.mac("server")) {
		return peerInfo{}, fmt.Errorf("handshake: the server does not hold this context's auth key: %w", ErrAuth)
	}
	h.start()
	peer, err := h.readInfo(serverInfoSeal)
	if err != nil {
		return peerInfo{}, err
	}
	return peer, h.writeFrame(clientInfoSeal, self.encode())
}

func (h *handshake) readInfo(magic string) (peerInfo, error) {
	sender, plain, err := h.readFrame(magic)
	if err != nil {
		return peerInfo{}, err
	}
	return decodePeerInfo(sender, plain)
}

func (h *handshake) writeFrame(magic string, plain []byte) error {
	sealed := h.session.seal(magic, h.t.id, plain)
	buf := make([]byte, 4, 4+len(sealed))
	binary.LittleEndian.PutUint32(buf, uint32(len(sealed)))
	if _, err := h.rw.Write(append(buf, sealed...)); err != nil {
		return fmt.Errorf("handshake: %v: %w", err, ErrConnectionReset)
	}
	return nil
}

// readFrame reads one length-prefixed sealed frame (only after the peer proved its
// key) and opens it.
func (h *handshake) readFrame(magic string) ([idLen]byte, []byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(h.rw, n[:]); err != nil {
		return [idLen]byte{}, nil, fmt.Errorf("handshake: %v: %w", err, ErrConnectionReset)
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxFrame || size < sealOverhead {
		return [idLen]byte{}, nil, fmt.Errorf("handshake: frame of %d bytes: %w", size, ErrInvalidParam)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(h.rw, buf); err != nil {
		return [idLen]byte{}, nil, fmt.Errorf("handshake: %v: %w", err, ErrConnectionReset)
	}
	return h.session.open(magic, buf)
}

func (h *handshake) writeDecision(accept bool) error {
	d := byte(decisionReject)
	if accept {
		d = decisionAccept
	}
	return h.writeFrame(decisionSeal, []byte{d})
}

// readDecision is the client's last read: whether the server accepted.
func (h *handshake) readDecision() error {
	_, plain, err := h.readFrame(decisionSeal)
	if err != nil {
		return err
	}
	switch {
	case len(plain) == 1 && plain[0] == decisionAccept:
		return nil
	case len(plain) == 1 && plain[0] == decisionReject:
		return fmt.Errorf("the server rejected the connection: %w", ErrRejected)
	}
	return fmt.Errorf("handshake: decision of %d bytes: %w", len(plain), ErrInvalidParam)
}
