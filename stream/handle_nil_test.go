package stream

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
)

// Nil handles and out-of-range words answer with errors or zero values, never a
// crash: every stream call that takes a word refuses a nil one.
func TestNilHandles(t *testing.T) {
	testenv.NilMethods(t, (*Word)(nil), (*WordBlock)(nil), (*Awaitable)(nil))

	b := NewHostBackend()
	defer b.Close()
	words, err := b.AllocWords(2)
	require.NoError(t, err)
	defer words.Close()
	require.Nil(t, words.Word(-1))
	require.Nil(t, words.Word(2))
	require.NotNil(t, words.Word(1))
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	bad := words.Word(2)
	require.ErrorIs(t, s.WriteValue(bad, 1), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitValue(bad, 1, GEQ), ErrInvalidArgument)
	require.ErrorIs(t, s.WriteThenWait(bad, 1, words.Word(0), 1, GEQ), ErrInvalidArgument)
	require.ErrorIs(t, s.CopyWord(words.Word(0), bad), ErrInvalidArgument)
	require.NoError(t, s.Synchronize())

	var a *Awaitable
	require.ErrorIs(t, a.Wait(context.Background()), ErrInvalidArgument)
}

// The host backend's handles, open and closed, answer zero arguments with errors.
func TestHandlesTakeZeroArguments(t *testing.T) {
	for _, closed := range []bool{false, true} {
		b := NewHostBackend()
		s, err := b.NewStream()
		require.NoError(t, err)
		w, err := b.AllocWords(2)
		require.NoError(t, err)
		e, err := b.NewEvent()
		require.NoError(t, err)
		handles := []any{b, s, w, e, w.Word(0)}
		if !closed {
			testenv.ZeroArgs(t, map[string]bool{"Close": true}, handles...)
			testenv.ExtremeArgs(t, map[string]bool{"Close": true}, handles...)
		}
		require.NoError(t, e.Close())
		require.NoError(t, s.Close())
		require.NoError(t, w.Close())
		require.NoError(t, b.Close())
		if closed {
			testenv.ZeroArgs(t, map[string]bool{"Load": true, "Store": true, "Add": true, "CompareAndSwap": true}, handles...)
		}
	}
}
