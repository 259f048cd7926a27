package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/internal/testenv/netns"
	"github.com/ucpx/ucpx/ucp"
)

var ringOK = regexp.MustCompile(`(?m)^\[(\d)\] rank (\d) of (\d): (\d+) iterations, last checksum ([0-9a-f]{8}) ok$`)

// `ucpx launch -n 4 -- ucpx demo-ring`: four ranks on this host form a ring and agree
// on every iteration's checksum.
func TestLaunchDemoRing(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	t.Setenv(reexecEnv, "1") // the ranks are this test binary, routed to dispatch
	st, out, errs := run(t, "launch", "-n", "4", "--", exe, "demo-ring", "--iters", "20")
	require.Zero(t, st, "launch: %s\n%s", out, errs)
	m := ringOK.FindAllStringSubmatch(out, -1)
	require.Len(t, m, 4, "%s", out)
	for _, l := range m {
		assert.Equal(t, l[1], l[2], "the launcher's prefix names the rank")
		assert.Equal(t, "4", l[3])
		assert.Equal(t, "20", l[4])
		assert.Equal(t, m[0][5], l[5], "every rank ends with the same checksum")
	}
	require.Contains(t, out, "[0] ring of 4 ranks: 20 allgather iterations of 4096 B per rank, every checksum matched")
}

// A failing rank's status is the launcher's, and the others are stopped.
func TestLaunchStopsTheOthers(t *testing.T) {
	start := time.Now()
	st, out, errs := run(t, "launch", "-n", "3", "--grace", "100ms", "--", "sh", "-c",
		`echo "$UCPX_RANK/$UCPX_SIZE $UCPX_RENDEZVOUS key=${UCPX_AUTH_KEY_FILE:+set}"; [ "$UCPX_RANK" = 1 ] && exit 7; exec sleep 60`)
	require.Equal(t, 7, st, "%s\n%s", out, errs)
	require.Contains(t, errs, "rank 1 failed")
	require.Regexp(t, `\[1\] 1/3 127\.0\.0\.1:\d+ key=set`, out)
	require.Less(t, time.Since(start), 50*time.Second, "the sleeping ranks were not stopped")
	st, _, _ = run(t, "launch", "-n", "0", "--", "true")
	require.Equal(t, 2, st)
	st, _, _ = run(t, "launch", "-n", "2")
	require.Equal(t, 2, st)
}

// The same binary runs across two simulated hosts, two ranks on each: the scheduler's
// part (one process per rank, the variables set) is played by the test.
func TestDemoRingAcrossHosts(t *testing.T) {
	c := netns.New(t, 2, nil)
	exe, err := os.Executable()
	require.NoError(t, err)
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, ucp.WriteAuthKeyFile(keyFile, bootstrap.NewKey()))
	rdv := c.Hosts[0].IP + ":29500"
	before, err := c.Hosts[1].Stats()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const size, iters, block = 4, 20, 65536
	outs := make([]string, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := 0; r < size; r++ {
		h := c.Hosts[r/2]
		cmd := h.Command(ctx, exe, "demo-ring", "--iters", strconv.Itoa(iters), "--bytes", strconv.Itoa(block))
		cmd.Env = append(cmd.Env, reexecEnv+"=1", bootstrap.EnvRank+"="+strconv.Itoa(r), bootstrap.EnvSize+"="+strconv.Itoa(size),
			bootstrap.EnvRendezvous+"="+rdv, bootstrap.EnvAuthKeyFile+"="+keyFile)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
		}()
	}
	wg.Wait()
	for r := range outs {
		require.NoError(t, errs[r], "rank %d on %s:\n%s", r, c.Hosts[r/2].Name, outs[r])
		require.Contains(t, outs[r], fmt.Sprintf("rank %d of %d: %d iterations", r, size, iters))
	}
	require.Contains(t, outs[0], "every checksum matched")
	after, err := c.Hosts[1].Stats()
	require.NoError(t, err)
	// Rank 1 (host0) sends every block but its own... to rank 2 (host1): at least
	// (size-1) blocks per iteration crossed host1's eth0.
	require.GreaterOrEqual(t, after.RxBytes-before.RxBytes, uint64((size-1)*iters*block),
		"the ring's traffic between the hosts did not cross eth0")
	require.True(t, strings.Contains(outs[0], "job formed"))
}
