package protocol

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
)

// A stale Put (an earlier user's second one) after the buffer's memory was lent again
// gave it back under its new user, and the next Get lent it a second time.
func TestPoolStalePutAfterRelend(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	s := NewPool(b)
	defer s.Close()
	m, err := s.Get(100)
	require.NoError(t, err)
	s.Put(m)
	s.Put(m) // a repeated Put: taken once
	require.Zero(t, s.Lent())
	u2, err := s.Get(100)
	require.NoError(t, err)
	require.Equal(t, addrOf(m), addrOf(u2), "the memory is reused")
	s.Put(m) // the first user's stale Put, after the memory was lent again
	require.Equal(t, 1, s.Lent(), "a stale Put returns nothing")
	u3, err := s.Get(100)
	require.NoError(t, err)
	require.NotEqual(t, addrOf(u2), addrOf(u3), "one buffer lent to two users")
	s.Put(u2)
	s.Put(u3)
	require.Zero(t, s.Lent())
}

func addrOf(b *Buffer) uintptr { return uintptr(unsafe.Pointer(&b.Bytes()[0])) }
