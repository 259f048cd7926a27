package bootstrap

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/ucpx/ucpx/ucp"
)

// EnvAuthKeyFile names the file holding the job's pre-shared key: the same variable
// and file (hex, mode 0600, `ucpx keygen`) that ucp.NewContext reads, so one key
// authenticates the rendezvous and seals the worker addresses published in it.
const EnvAuthKeyFile = ucp.AuthKeyFileEnv

// MinKeyLen is the shortest key accepted.
const MinKeyLen = ucp.MinAuthKeyLen

const (
	handshakeMagic   = "UCPXRDV1"
	handshakeTimeout = 10 * time.Second
	nonceLen         = 32
	macLen           = sha256.Size
)

// LoadKey reads the key named by UCPX_AUTH_KEY_FILE (ucp.ReadAuthKeyFile): nil
// without the variable.
func LoadKey() ([]byte, error) {
	name := os.Getenv(EnvAuthKeyFile)
	if name == "" {
		return nil, nil
	}
	k, err := ucp.ReadAuthKeyFile(name)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %s: %w", EnvAuthKeyFile, err)
	}
	return k, nil
}

// NewKey returns a random 32-byte key (ucp.GenerateAuthKey).
func NewKey() []byte {
	k, err := ucp.GenerateAuthKey()
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k
}

// rendezvousKey separates the rendezvous's proofs from ucp's handshake under the
// same secret.
func rendezvousKey(key []byte) []byte {
	if key == nil {
		return nil
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ucpx bootstrap rendezvous v1"))
	return m.Sum(nil)
}

func proof(key []byte, who string, a, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(who))
	m.Write(a)
	m.Write(b)
	return m.Sum(nil)
}

// serverHandshake runs the server's side: a mutual HMAC-SHA256 challenge-response
// when key is set (the client proves it first, so a client without the key never
// learns anything), a plain greeting otherwise. Fixed sizes, one deadline.
func serverHandshake(c net.Conn, key []byte) error {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	var sn [nonceLen]byte
	_, _ = rand.Read(sn[:])
	hello := append([]byte(handshakeMagic), boolByte(key != nil))
	hello = append(hello, sn[:]...)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	in := make([]byte, len(handshakeMagic)+1+nonceLen+macLen)
	if _, err := io.ReadFull(c, in); err != nil {
		return fmt.Errorf("bootstrap: handshake: %v: %w", err, ErrProtocol)
	}
	if string(in[:len(handshakeMagic)]) != handshakeMagic {
		return fmt.Errorf("bootstrap: handshake: not a ucpx rendezvous client: %w", ErrProtocol)
	}
	cn := in[len(handshakeMagic)+1 : len(handshakeMagic)+1+nonceLen]
	mac := in[len(handshakeMagic)+1+nonceLen:]
	reply := []byte{0}
	if key != nil {
		if in[len(handshakeMagic)] != 1 || !hmac.Equal(mac, proof(key, "client", sn[:], cn)) {
			_, _ = c.Write([]byte{1})
			return fmt.Errorf("bootstrap: rendezvous client without the job's key: %w", ErrAuth)
		}
		reply = append(reply, proof(key, "server", cn, sn[:])...)
	}
	_, err := c.Write(reply)
	return err
}

// clientHandshake is the client's side; a client with a key refuses a server that
// cannot prove it holds the key too.
func clientHandshake(c net.Conn, key []byte) error {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	in := make([]byte, len(handshakeMagic)+1+nonceLen)
	if n, err := io.ReadFull(c, in); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			// Closed unheard: a rendezvous with too many connections not joined yet.
			return fmt.Errorf("%w: %v", errDropped, err)
		}
		return fmt.Errorf("bootstrap: handshake: %v: %w", err, ErrProtocol)
	}
	if string(in[:len(handshakeMagic)]) != handshakeMagic {
		return fmt.Errorf("bootstrap: handshake: not a ucpx rendezvous server: %w", ErrProtocol)
	}
	serverKeyed := in[len(handshakeMagic)] == 1
	sn := in[len(handshakeMagic)+1:]
	if serverKeyed && key == nil {
		return fmt.Errorf("bootstrap: the rendezvous requires a key (set %s): %w", EnvAuthKeyFile, ErrAuth)
	}
	if !serverKeyed && key != nil {
		return fmt.Errorf("bootstrap: the rendezvous server has no key and cannot prove it belongs to the job: %w", ErrAuth)
	}
	var cn [nonceLen]byte
	_, _ = rand.Read(cn[:])
	out := append([]byte(handshakeMagic), boolByte(key != nil))
	out = append(out, cn[:]...)
	if key != nil {
		out = append(out, proof(key, "client", sn, cn[:])...)
	} else {
		out = append(out, make([]byte, macLen)...)
	}
	if _, err := c.Write(out); err != nil {
		return handshakeLost(err)
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return handshakeLost(err)
	}
	if st[0] != 0 {
		return fmt.Errorf("bootstrap: the rendezvous refused this process's key: %w", ErrAuth)
	}
	if key != nil {
		mac := make([]byte, macLen)
		if _, err := io.ReadFull(c, mac); err != nil {
			return handshakeLost(err)
		}
		if !hmac.Equal(mac, proof(key, "server", cn[:], sn)) {
			return fmt.Errorf("bootstrap: the rendezvous server does not hold the job's key: %w", ErrAuth)
		}
	}
	return nil
}

// handshakeLost is the error of a handshake whose connection failed after the
// greeting: closed by the rendezvous (evicted while joining: errDropped, dial tries
// again), or anything else (a protocol error).
func handshakeLost(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: handshake: %v", errDropped, err)
	}
	return fmt.Errorf("bootstrap: handshake: %v: %w", err, ErrProtocol)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// loopbackOnly reports whether addr ("host:port") names only loopback addresses.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
