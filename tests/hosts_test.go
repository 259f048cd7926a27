package tests

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/internal/testenv/netns"
	"github.com/ucpx/ucpx/ucp"
)

// Tests across simulated hosts (internal/testenv/netns): each rank is this test binary
// re-executed inside a host's namespaces with -test.run=^TestHostsRank$, the scenario
// in UCPX_HOSTS_SCENARIO and the job in UCPX_RANK/UCPX_SIZE/UCPX_RENDEZVOUS; a rank
// reports through lines "HOSTS <rank> <word> ..." on its standard output and fails
// its own test (exit status) on a wrong checksum or error kind.

const (
	envScenario = "UCPX_HOSTS_SCENARIO"
	rdvPort     = 29500
)

// hostRank is one rank's process.
type hostRank struct {
	rank  int
	host  *netns.Host
	cmd   *exec.Cmd
	lines chan string // "HOSTS" lines, as they come
	mu    sync.Mutex
	out   strings.Builder
	done  chan struct{}
	err   error
}

// startRanks starts one process per entry of placement (the host index of each rank)
// running scenario, rank 0's host serving the rendezvous.
func startRanks(t *testing.T, c *netns.Cluster, placement []int, scenario string, env ...string) []*hostRank {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, ucp.WriteAuthKeyFile(keyFile, bootstrap.NewKey()))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	ranks := make([]*hostRank, len(placement))
	for r, hi := range placement {
		h := c.Hosts[hi]
		cmd := h.Command(ctx, exe, "-test.run=^TestHostsRank$", "-test.count=1", "-test.timeout=3m")
		cmd.Env = append(cmd.Env, env...)
		cmd.Env = append(cmd.Env, envScenario+"="+scenario,
			bootstrap.EnvRank+"="+strconv.Itoa(r), bootstrap.EnvSize+"="+strconv.Itoa(len(placement)),
			bootstrap.EnvRendezvous+"="+c.Hosts[placement[0]].IP+":"+strconv.Itoa(rdvPort),
			bootstrap.EnvAuthKeyFile+"="+keyFile,
			"UCPX_HOSTS_PLACEMENT="+fmt.Sprint(placement))
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		hr := &hostRank{rank: r, host: h, cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
		cmd.Stderr = writerTo{hr}
		require.NoError(t, cmd.Start())
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				l := sc.Text()
				hr.mu.Lock()
				hr.out.WriteString(l + "\n")
				hr.mu.Unlock()
				if strings.HasPrefix(l, "HOSTS ") {
					hr.lines <- l
				}
			}
			hr.err = cmd.Wait()
			close(hr.lines)
			close(hr.done)
		}()
		ranks[r] = hr
	}
	t.Cleanup(func() {
		for _, hr := range ranks {
			_ = hr.cmd.Process.Kill()
			<-hr.done
		}
	})
	return ranks
}

type writerTo struct{ hr *hostRank }

func (w writerTo) Write(b []byte) (int, error) {
	hr := w.hr
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return hr.out.Write(b)
}

func (hr *hostRank) output() string {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return hr.out.String()
}

// expect waits for the rank's next report line and returns its fields after word.
func (hr *hostRank) expect(t *testing.T, word string, timeout time.Duration) []string {
	t.Helper()
	select {
	case l, ok := <-hr.lines:
		if !ok {
			<-hr.done
			t.Fatalf("rank %d exited (%v) before reporting %s:\n%s", hr.rank, hr.err, word, hr.output())
		}
		f := strings.Fields(l)
		require.GreaterOrEqual(t, len(f), 3, "rank %d: %q", hr.rank, l)
		require.Equal(t, word, f[2], "rank %d: %q\n%s", hr.rank, l, hr.output())
		return f[3:]
	case <-time.After(timeout):
		t.Fatalf("rank %d did not report %s within %v:\n%s", hr.rank, word, timeout, hr.output())
	}
	return nil
}

// waitAll waits for every rank to exit and requires success.
func waitAll(t *testing.T, ranks []*hostRank) {
	t.Helper()
	for _, hr := range ranks {
		select {
		case <-hr.done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("rank %d on %s still running:\n%s", hr.rank, hr.host.Name, hr.output())
		}
		require.NoError(t, hr.err, "rank %d on %s:\n%s", hr.rank, hr.host.Name, hr.output())
		for _, l := range strings.Split(hr.output(), "\n") {
			if strings.Contains(l, "UCX  WARN") || strings.Contains(l, "UCX  ERROR") {
				t.Logf("rank %d: %s", hr.rank, l)
			}
		}
		require.Contains(t, hr.output(), "PASS", "rank %d did not run its scenario:\n%s", hr.rank, hr.output())
	}
}

// Tag, AM, RMA, atomics, stream- and graph-triggered operations and prepared
// partitions between two ranks on two hosts, every payload checksummed.
func TestHostsOps(t *testing.T) {
	c := netns.New(t, 2, nil)
	before, err := c.Hosts[1].Stats()
	require.NoError(t, err)
	ranks := startRanks(t, c, []int{0, 1}, "ops")
	for _, hr := range ranks {
		got := hr.expect(t, "ops", time.Minute)
		require.Equal(t, []string{"tag", "am", "rma", "atomic", "stream", "graph", "prepare"}, got)
	}
	waitAll(t, ranks)
	after, err := c.Hosts[1].Stats()
	require.NoError(t, err)
	// Each rank sends opsBytes of tag data alone; all of it came over eth0.
	require.Greater(t, after.RxBytes-before.RxBytes, uint64(opsBytes), "traffic did not cross host1's eth0")
}

// A three-host ring allgather driven by host streams: every step is a stream-ordered
// receive and send, every iteration checksummed on the stream.
func TestHostsStreamRingAllgather(t *testing.T) {
	c := netns.New(t, 3, nil)
	ranks := startRanks(t, c, []int{0, 1, 2}, "ring")
	var sums []string
	for _, hr := range ranks {
		got := hr.expect(t, "ring", time.Minute)
		require.Len(t, got, 2)
		require.Equal(t, strconv.Itoa(ringIters), got[0], "iterations checked")
		sums = append(sums, got[1])
	}
	require.Equal(t, sums[0], sums[1])
	require.Equal(t, sums[0], sums[2])
	waitAll(t, ranks)
}

// Two ranks per host: UCX picks shared memory inside a host and tcp between hosts
// (endpoints without peer error handling, which UCX 1.13 needs for shared memory).
// Counted on eth0: a same-host transfer leaves no trace there, a cross-host one
// does.
func TestHostsMixedPlacement(t *testing.T) {
	c := netns.New(t, 2, nil)
	ranks := startRanks(t, c, []int{0, 0, 1, 1}, "mixed")
	same := ranks[0].expect(t, "same-host", time.Minute)
	cross := ranks[0].expect(t, "cross-host", time.Minute)
	// Fields: eth0 tx bytes, lo tx bytes during the transfer of mixedBytes.
	t.Logf("%d B rank 0 -> rank 1 (same host): eth0 tx %s B, lo tx %s B; rank 0 -> rank 2 (other host): eth0 tx %s B, lo tx %s B",
		mixedBytes, same[0], same[1], cross[0], cross[1])
	u := func(s string) uint64 { v, err := strconv.ParseUint(s, 10, 64); require.NoError(t, err); return v }
	require.Less(t, u(same[0]), uint64(mixedBytes/8), "a same-host transfer went over eth0")
	require.Less(t, u(same[1]), uint64(mixedBytes/8), "a same-host transfer went over loopback tcp, not shared memory")
	require.GreaterOrEqual(t, u(cross[0]), uint64(mixedBytes), "a cross-host transfer did not use eth0")
	for _, hr := range ranks[1:] {
		hr.expect(t, "mixed", time.Minute)
	}
	waitAll(t, ranks)
}

// Faults across hosts, in one job of three hosts and then a second:
//  1. host2's link goes down while data moves both ways: every pending operation of
//     the survivors on rank 2 fails within the bound, their streams are released, and
//     both name rank 2;
//  2. the link comes back: all three ranks, rank 2 included, form a new job and run
//     a checksummed ring;
//  3. host2 is killed (its ranks with it) with operations pending: the same again.
func TestHostsFaults(t *testing.T) {
	// tcp_retries2=4: unacknowledged data fails its connection after about 6 s (the
	// default 15 takes about 15 minutes); idle endpoints rely on the job's keepalive.
	c := netns.New(t, 3, &netns.Options{TCPRetries2: 4})
	ranks := startRanks(t, c, []int{0, 1, 2}, "faults")
	for _, hr := range ranks {
		hr.expect(t, "pending", time.Minute)
	}
	down := time.Now()
	require.NoError(t, c.Hosts[2].SetLink(false))
	for _, hr := range ranks[:2] {
		got := hr.expect(t, "failed", faultBound+30*time.Second)
		require.Equal(t, "2", got[0], "rank %d names the failed rank", hr.rank)
		at, err := strconv.ParseInt(got[1], 10, 64)
		require.NoError(t, err)
		took := time.Unix(0, at).Sub(down)
		t.Logf("link down: rank %d saw every pending operation on rank 2 fail and its stream released %v after", hr.rank, took.Round(time.Millisecond))
		require.Less(t, took, faultBound, "rank %d: failure noticed after %v, documented bound %v", hr.rank, took, faultBound)
	}
	ranks[2].expect(t, "failed", faultBound+30*time.Second) // rank 2 sees the others fail too
	require.NoError(t, c.Hosts[2].SetLink(true))
	for _, hr := range ranks {
		hr.expect(t, "rejoined", time.Minute)
	}
	for _, hr := range ranks {
		hr.expect(t, "pending", time.Minute)
	}
	killed := time.Now()
	c.Hosts[2].Kill()
	for _, hr := range ranks[:2] {
		got := hr.expect(t, "failed", faultBound+30*time.Second)
		require.Equal(t, "2", got[0])
		at, err := strconv.ParseInt(got[1], 10, 64)
		require.NoError(t, err)
		took := time.Unix(0, at).Sub(killed)
		t.Logf("host killed: rank %d saw every pending operation on rank 2 fail %v after", hr.rank, took.Round(time.Millisecond))
		require.Less(t, took, faultBound)
	}
	waitAll(t, ranks[:2])
}

// Ranks on different simulated hosts are on different hosts for ucp's same-host
// checks too: host1's rank gets the pid that a short-lived process of host0 has
// there; when that process exits, rank 0's endpoint to rank 1 must not fail (a check
// that compared boot ids alone would watch host0's process and report rank 1 dead).
func TestHostsSameHostCheckSeesDifferentHosts(t *testing.T) {
	c := netns.New(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	decoy := c.Hosts[0].Command(ctx, "sh", "-c", "echo $$; exec sleep 4")
	out, err := decoy.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, decoy.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	decoyPid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	// The next pid host1 hands out is the decoy's (ns_last_pid, as CRIU restores pids).
	set := c.Hosts[1].Command(ctx, "sh", "-c", fmt.Sprintf("echo %d > /proc/sys/kernel/ns_last_pid", decoyPid-1))
	require.NoError(t, set.Run())
	ranks := startRanks(t, c, []int{0, 1}, "samehost")
	pids := map[int]string{}
	for _, hr := range ranks {
		pids[hr.rank] = hr.expect(t, "pid", time.Minute)[0]
	}
	t.Logf("rank 0 is pid %s on host0, rank 1 pid %s on host1, the decoy pid %d on host0", pids[0], pids[1], decoyPid)
	require.Equal(t, strconv.Itoa(decoyPid), pids[1], "rank 1 should share its pid with host0's decoy")
	require.NoError(t, decoy.Wait())
	for _, hr := range ranks {
		got := hr.expect(t, "alive", time.Minute)
		require.Equal(t, []string{"failed=[]"}, got, "rank %d", hr.rank)
	}
	waitAll(t, ranks)
}
