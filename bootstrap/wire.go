package bootstrap

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The rendezvous protocol: after the handshake (auth.go), both sides exchange frames
//
//	u32 length (big endian, of what follows) | u8 op | u32 id | payload
//
// The client's id names the request a reply answers; the server pushes events with
// id 0. opCancel names the Wait it withdraws by its id and gets no reply; a client
// sends it only to a server whose reply to hello announced featCancel, so old and new
// clients and servers work together. Every length is bounded before anything is allocated, so a peer's bytes cost
// at most MaxFrame of memory per connection and never a crash (FuzzDecode).

// Limits of the protocol.
const (
	// MaxKey is the longest key of the Store.
	MaxKey = 512
	// MaxValue is the largest value of the Store (a worker address is a few hundred
	// bytes over tcp).
	MaxValue = 1 << 20
	// MaxFrame bounds a frame: a Set of the longest key and largest value.
	MaxFrame = 1 + 4 + 2 + MaxKey + 4 + MaxValue
	// MaxRanks bounds a job's size.
	MaxRanks = 1 << 20
)

type op uint8

const (
	opHello   op = iota + 1 // c->s: rank u32, size u32
	opSet                   // c->s: key, value
	opGet                   // c->s: key, wait u8
	opBarrier               // c->s: generation u64
	opBye                   // c->s: leaving on purpose
	opOK                    // s->c: value (may be empty)
	opErr                   // s->c: code u8, rank u32, message
	opFailed                // s->c event: rank u32 (left without Bye)
	opCancel                // c->s: withdraw the Wait of this id (no reply); sent only to a server whose hello reply has featCancel
	opLast
)

// Features a server announces in the value of its reply to hello (a server that
// replies with an empty value has none; a client that knows none ignores the value).
const (
	featCancel = 1 << 0 // opCancel withdraws a Wait
)

// Error codes of opErr.
const (
	codeInvalid  = 1 // a malformed or out-of-range request
	codeNotFound = 2 // Get of a key nobody set
	codeRank     = 3 // a rank failed (rank field): the barrier cannot complete
	codeTaken    = 4 // Hello: another connection holds this rank
	codeFull     = 5 // the store is full
	codeLeft     = 6 // a rank left the job (rank field, Bye): the barrier cannot complete
)

type frame struct {
	op      op
	id      uint32
	rank    uint32
	size    uint32
	gen     uint64
	wait    bool
	code    uint8
	key     string
	value   []byte
	message string
}

// errMalformed is what decoding garbage returns.
func errMalformed(format string, args ...any) error {
	return fmt.Errorf("bootstrap: malformed frame: "+format+": %w", append(args, ErrProtocol)...)
}

// readFrame reads one frame; it allocates only once the length is known to be within
// MaxFrame.
func readFrame(r io.Reader) (frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 5 || n > MaxFrame {
		return frame{}, errMalformed("length %d outside [5, %d]", n, MaxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	return decodeFrame(b)
}

// decodeFrame parses a frame's bytes (after the length).
func decodeFrame(b []byte) (frame, error) {
	if len(b) < 5 || len(b) > MaxFrame {
		return frame{}, errMalformed("%d bytes", len(b))
	}
	f := frame{op: op(b[0]), id: binary.BigEndian.Uint32(b[1:5])}
	d := decoder{b: b[5:]}
	switch f.op {
	case opHello:
		f.rank, f.size = d.u32(), d.u32()
		if d.ok() && (f.size == 0 || f.size > MaxRanks || f.rank >= f.size) {
			return frame{}, errMalformed("rank %d of %d", f.rank, f.size)
		}
	case opSet:
		f.key = d.key()
		f.value = d.bytes(MaxValue)
	case opGet:
		f.key = d.key()
		w := d.u8()
		if d.ok() && w > 1 {
			return frame{}, errMalformed("wait flag %d", w)
		}
		f.wait = w == 1
	case opBarrier:
		f.gen = d.u64()
	case opBye, opCancel:
	case opOK:
		f.value = d.bytes(MaxValue)
	case opErr:
		f.code, f.rank = d.u8(), d.u32()
		f.message = string(d.bytes(1024))
	case opFailed:
		f.rank = d.u32()
	default:
		return frame{}, errMalformed("unknown op %d", f.op)
	}
	if d.err != nil {
		return frame{}, d.err
	}
	if len(d.b) != 0 {
		return frame{}, errMalformed("op %d: %d trailing bytes", f.op, len(d.b))
	}
	return f, nil
}

// encode appends the frame, with its length, to dst.
func (f *frame) encode(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(f.op))
	dst = binary.BigEndian.AppendUint32(dst, f.id)
	switch f.op {
	case opHello:
		dst = binary.BigEndian.AppendUint32(dst, f.rank)
		dst = binary.BigEndian.AppendUint32(dst, f.size)
	case opSet:
		dst = appendKey(dst, f.key)
		dst = appendBytes(dst, f.value)
	case opGet:
		dst = appendKey(dst, f.key)
		if f.wait {
			dst = append(dst, 1)
		} else {
			dst = append(dst, 0)
		}
	case opBarrier:
		dst = binary.BigEndian.AppendUint64(dst, f.gen)
	case opOK:
		dst = appendBytes(dst, f.value)
	case opErr:
		dst = append(dst, f.code)
		dst = binary.BigEndian.AppendUint32(dst, f.rank)
		msg := f.message
		if len(msg) > 1024 {
			msg = msg[:1024]
		}
		dst = appendBytes(dst, []byte(msg))
	case opFailed:
		dst = binary.BigEndian.AppendUint32(dst, f.rank)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// okHeader is the encoding of an opOK frame of id with a value of n bytes, up to the
// value: a value queued by reference follows it.
func okHeader(id uint32, n int) []byte {
	hdr := make([]byte, 0, 4+1+4+4)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(1+4+4+n))
	hdr = append(hdr, byte(opOK))
	hdr = binary.BigEndian.AppendUint32(hdr, id)
	return binary.BigEndian.AppendUint32(hdr, uint32(n))
}

func appendKey(dst []byte, k string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(k)))
	return append(dst, k...)
}

func appendBytes(dst, v []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
	return append(dst, v...)
}

// checkKey is what Set/Get/Wait accept: 1..MaxKey bytes.
func checkKey(k string) error {
	if len(k) == 0 || len(k) > MaxKey {
		return fmt.Errorf("bootstrap: key of %d bytes (want 1..%d): %w", len(k), MaxKey, ErrInvalidParam)
	}
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) ok() bool { return d.err == nil }

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = errMalformed("want %d bytes, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) key() string {
	v := d.take(2)
	if v == nil {
		return ""
	}
	n := int(binary.BigEndian.Uint16(v))
	if n == 0 || n > MaxKey {
		d.err = errMalformed("key of %d bytes", n)
		return ""
	}
	return string(d.take(n))
}

func (d *decoder) bytes(limit int) []byte {
	v := d.take(4)
	if v == nil {
		return nil
	}
	n := binary.BigEndian.Uint32(v)
	if n > uint32(limit) {
		d.err = errMalformed("value of %d bytes (limit %d)", n, limit)
		return nil
	}
	out := d.take(int(n))
	if out == nil {
		return nil
	}
	return append([]byte{}, out...)
}
