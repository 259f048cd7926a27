package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The report names the transports used and the peer error handling the endpoints
// use: --tls overrides --transport's set, and --peer-err auto follows the set used
// (`--tls tcp` reported transport shm and no peer error handling).
func TestTransportFollowsTheSetUsed(t *testing.T) {
	for _, tc := range []struct {
		transport, tls, peerErr string
		wantTLS, wantTransport  string
		wantPE                  bool
	}{
		{"shm", "", "auto", "shm", "shm", false},
		{"tcp", "", "auto", "tcp", "tcp", true},
		{"shm", "tcp", "auto", "tcp", "tcp", true},
		{"tcp", "shm", "auto", "shm", "shm", false},
		{"shm", "posix,sysv,cma,self", "auto", "posix,sysv,cma,self", "shm", false},
		{"shm", "tcp,shm", "auto", "tcp,shm", "tcp,shm", false},
		{"shm", "rc,self", "auto", "rc,self", "rc,self", false},
		{"shm", "tcp", "off", "tcp", "tcp", false},
		{"shm", "", "on", "shm", "shm", true},
	} {
		tls, tr, pe, err := resolveTransport(tc.transport, tc.tls, tc.peerErr)
		require.NoError(t, err, "%+v", tc)
		assert.Equal(t, tc.wantTLS, tls, "%+v", tc)
		assert.Equal(t, tc.wantTransport, tr, "%+v", tc)
		assert.Equal(t, tc.wantPE, pe, "%+v", tc)
	}

	st, out, errs := run(t, "perf", "--tls", "tcp", "--tests", "tag_lat", "--sizes", "8,64", "--iters", "50", "--warmup", "5", "--timeout", "60s", "--json")
	require.Zero(t, st, "stderr:\n%s", errs)
	var rep perfReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "%s", out)
	assert.Equal(t, "tcp", rep.Transport)
	assert.Equal(t, "tcp", rep.TLS)
	assert.Equal(t, "tcp", rep.PeerTLS)
	assert.True(t, rep.PeerErrorHandling)
}
