package ucp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The exporter's rules for import notices and acknowledgements from a peer in another
// process, message by message: a notice no newer than the last taken is refused (and
// counted), an acknowledgement settles the importer only if it covers its last notice.
func TestRevokeNoticeFreshness(t *testing.T) {
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer c.Close()
	w, err := c.NewWorker(WorkerParams{})
	require.NoError(t, err)
	m, err := c.MemAlloc(64)
	require.NoError(t, err)
	_, err = m.PackRkey()
	require.NoError(t, err)
	peer := [idLen]byte{1, 2, 3}
	imp := func() *importer {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := *m.importers[peer]
		return &i
	}
	notice := func(typ byte, count, seq uint64) {
		c.noteHeld(w, peer, control{typ: typ, value: m.keyID, count: count, seq: seq})
	}
	stale := staleControls.Load()

	notice(ctlImport, 1, 10)
	notice(ctlImport, 2, 12)
	require.Equal(t, 2, imp().count)
	notice(ctlImport, 1, 11) // overtaken on another endpoint
	notice(ctlImport, 2, 12) // the same again
	require.Equal(t, 2, imp().count)
	notice(ctlRelease, 1, 13)
	notice(ctlRelease, 1, 13) // replayed
	require.Equal(t, 1, imp().count)
	require.Equal(t, stale+3, staleControls.Load())
	require.False(t, imp().settled())

	c.noteAck(peer, m.keyID, 12) // older than the last notice (13)
	require.False(t, imp().settled())
	require.Equal(t, stale+4, staleControls.Load())
	c.noteAck(peer, m.keyID, 13)
	require.True(t, imp().settled())
	notice(ctlImport, 2, 14) // a key unpacked after the acknowledgement
	require.False(t, imp().settled(), "an acknowledgement covered a later import")
	c.noteAck(peer, m.keyID, 13) // replayed
	require.False(t, imp().settled())
	notice(ctlRelease, 0, 15)
	require.True(t, imp().settled(), "an importer that holds nothing is not waited for")
	notice(ctlImport, 1, 14) // a replay of the last import
	require.Equal(t, 0, imp().count)

	// The records go with the region: Close waits for nobody here.
	require.NoError(t, m.Close())
}
