package ucp

import (
	"encoding/binary"
	"hash/crc32"
)

// Wire envelopes for the bytes peers exchange (packed rkeys, worker addresses). UCX
// parses these without bounds checks: garbage from a peer would crash this process
// inside UCX. The envelope lets ucpx reject it first.
//
//	magic   [4]byte
//	base    uint64   region address (rkeys) or 0
//	length  uint64   region length (rkeys) or 0
//	n       uint32   payload length
//	payload [n]byte  UCX's own bytes
//	crc     uint32   CRC-32C of everything before it
const (
	rkeyMagic    = "UCRK"
	addressMagic = "UCWA"
	envelopeHead = 4 + 8 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encodeEnvelope(magic string, base, length uint64, payload []byte) []byte {
	out := make([]byte, envelopeHead+len(payload)+4)
	copy(out, magic)
	binary.LittleEndian.PutUint64(out[4:], base)
	binary.LittleEndian.PutUint64(out[12:], length)
	binary.LittleEndian.PutUint32(out[20:], uint32(len(payload)))
	copy(out[envelopeHead:], payload)
	binary.LittleEndian.PutUint32(out[len(out)-4:], crc32.Checksum(out[:len(out)-4], castagnoli))
	return out
}

func decodeEnvelope(magic string, b []byte) (base, length uint64, payload []byte, ok bool) {
	if len(b) < envelopeHead+4 || string(b[:4]) != magic {
		return 0, 0, nil, false
	}
	n := binary.LittleEndian.Uint32(b[20:])
	if uint64(n) != uint64(len(b)-envelopeHead-4) || n == 0 {
		return 0, 0, nil, false
	}
	if crc32.Checksum(b[:len(b)-4], castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return 0, 0, nil, false
	}
	return binary.LittleEndian.Uint64(b[4:]), binary.LittleEndian.Uint64(b[12:]), b[envelopeHead : envelopeHead+int(n)], true
}
