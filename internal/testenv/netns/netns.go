// Package netns runs "hosts" for tests: each in its own network, IPC, mount, PID and
// UTS namespaces, with its own /dev/shm, /proc and /sys and one veth link (eth0, its
// own address) to a bridge in a switch namespace of its own. UCX between two such hosts cannot use
// shared memory or CMA (different IPC and PID namespaces, different /dev/shm, a
// different machine id: hostname and MAC differ) and reaches the other host only
// through eth0; processes of one host share all of that, as on a real machine.
//
// Creating namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), unshare and nsenter
// (util-linux) and ip (iproute2). New skips the test where that is impossible, unless
// UCPX_REQUIRE_NETNS=1 (set by .ci/run), which turns the skip into a failure. Nothing
// is created in the caller's network namespace, so clusters of parallel tests (and
// of other processes) never collide, and killing the test process tears every
// namespace down (the holders die with it).
package netns

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// EnvRequire names the variable that turns "cannot create namespaces here" skips
// into failures, so CI cannot silently stop testing across hosts.
const EnvRequire = "UCPX_REQUIRE_NETNS"

// Dev is each host's one network device.
const Dev = "eth0"

// Options tunes a cluster.
type Options struct {
	// TCPRetries2, when positive, sets net.ipv4.tcp_retries2 in every host (a
	// per-namespace sysctl): how many retransmissions of unacknowledged data the kernel
	// tries before it fails the connection (default 15: about 15 minutes).
	TCPRetries2 int
}

// Cluster is a set of simulated hosts on one bridge.
type Cluster struct {
	Hosts []*Host
	sw    *exec.Cmd
}

// Host is one simulated host.
type Host struct {
	Index  int
	Name   string // its hostname, host0, host1, ...
	IP     string // the address of its eth0, 10.77.0.(Index+1)
	holder *exec.Cmd
	pid    int // the namespaces' first process, as the caller sees it
}

// Required reports whether UCPX_REQUIRE_NETNS=1.
func Required() bool { return os.Getenv(EnvRequire) == "1" }

// New starts n hosts (1..200); see the package doc for when it skips.
func New(t testing.TB, n int, opts *Options) *Cluster {
	t.Helper()
	require.True(t, n >= 1 && n <= 200, "netns.New: %d hosts", n)
	if err := available(); err != nil {
		require.Falsef(t, Required(), "cannot create simulated hosts and %s=1: %v", EnvRequire, err)
		t.Skipf("cannot create simulated hosts: %v", err)
	}
	c, err := start(n, opts)
	if err != nil {
		require.Falsef(t, Required(), "cannot create simulated hosts and %s=1: %v", EnvRequire, err)
		t.Skipf("cannot create simulated hosts: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("not root")
	}
	for _, tool := range []string{"unshare", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (util-linux, iproute2): %v", tool, err)
		}
	}
	return nil
}

func start(n int, opts *Options) (_ *Cluster, err error) {
	c := &Cluster{}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	c.sw = exec.Command("unshare", "--net", "--", "sleep", "infinity")
	c.sw.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.sw.Start(); err != nil {
		return nil, fmt.Errorf("unshare --net: %w", err)
	}
	if err := waitComm(c.sw.Process.Pid, "sleep"); err != nil {
		return nil, err
	}
	swPid := strconv.Itoa(c.sw.Process.Pid)
	batch := []string{"link add br0 type bridge", "link set br0 up"}
	for i := 0; i < n; i++ {
		h := &Host{Index: i, Name: "host" + strconv.Itoa(i), IP: "10.77.0." + strconv.Itoa(i+1)}
		c.Hosts = append(c.Hosts, h)
		// The first process of the new namespaces mounts /dev/shm, /proc and /sys of
		// its own (UCX finds network devices in /sys/class/net, which shows the
		// network namespace of whoever mounted it), names the host and then only holds
		// the namespaces.
		h.holder = exec.Command("unshare", "--net", "--ipc", "--mount", "--pid", "--uts", "--fork",
			"--kill-child", "--mount-proc", "--propagation", "private", "--",
			"sh", "-c", "mount -t tmpfs -o size=2g tmpfs /dev/shm && mount -t sysfs sysfs /sys && hostname "+h.Name+" && exec sleep infinity")
		h.holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var stderr bytes.Buffer
		h.holder.Stderr = &stderr
		if err := h.holder.Start(); err != nil {
			return nil, fmt.Errorf("unshare: %w", err)
		}
		if h.pid, err = child(h.holder.Process.Pid); err != nil {
			return nil, fmt.Errorf("%s: %v (%s)", h.Name, err, stderr.String())
		}
		if err := waitComm(h.pid, "sleep"); err != nil {
			return nil, fmt.Errorf("%s: %v (%s)", h.Name, err, stderr.String())
		}
		batch = append(batch,
			fmt.Sprintf("link add p%d type veth peer name %s netns %d", i, Dev, h.pid),
			fmt.Sprintf("link set p%d master br0 up", i))
	}
	if out, err := ipBatch(swPid, batch); err != nil {
		return nil, fmt.Errorf("switch: %v: %s", err, out)
	}
	for _, h := range c.Hosts {
		if out, err := ipBatch(strconv.Itoa(h.pid), []string{
			"link set lo up",
			fmt.Sprintf("addr add %s/24 dev %s", h.IP, Dev),
			fmt.Sprintf("link set %s up", Dev),
		}); err != nil {
			return nil, fmt.Errorf("%s: %v: %s", h.Name, err, out)
		}
		if opts != nil && opts.TCPRetries2 > 0 {
			if out, err := h.Run("sh", "-c", fmt.Sprintf("echo %d > /proc/sys/net/ipv4/tcp_retries2", opts.TCPRetries2)); err != nil {
				return nil, fmt.Errorf("%s: tcp_retries2: %v: %s", h.Name, err, out)
			}
		}
	}
	return c, nil
}

func ipBatch(pid string, cmds []string) ([]byte, error) {
	cmd := exec.Command("nsenter", "-t", pid, "-n", "--", "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	return cmd.CombinedOutput()
}

// child returns the pid of parent's only child, waiting for it to appear.
func child(parent int) (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent, parent))
		if err != nil {
			return 0, err
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			return strconv.Atoi(f[0])
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0, fmt.Errorf("unshare started no child")
}

// waitComm waits until pid runs comm (the set-up before the exec is done).
func waitComm(pid int, comm string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			return fmt.Errorf("namespace holder %d exited during set-up", pid)
		}
		if strings.TrimSpace(string(b)) == comm {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("namespace holder %d did not finish set-up", pid)
}

// Close kills every process of every host and the switch.
func (c *Cluster) Close() {
	for _, h := range c.Hosts {
		h.Kill()
	}
	if c.sw != nil && c.sw.Process != nil {
		_ = c.sw.Process.Kill()
		_ = c.sw.Wait()
	}
}

// Command returns a command that runs name in every namespace of the host, with
// UCX's network device set to the host's eth0 (Env).
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(h.pid),
		"-n", "-i", "-m", "-p", "-u", "--", name}, args...)...)
	cmd.Env = append(os.Environ(), h.Env()...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Env is what a process of the host needs so that UCX uses only the host's
// simulated network: UCX_NET_DEVICES names eth0.
func (h *Host) Env() []string { return []string{"UCX_NET_DEVICES=" + Dev} }

// Run runs a short command in the host's namespaces and returns its output.
func (h *Host) Run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return h.Command(ctx, name, args...).CombinedOutput()
}

// SetLink takes the host's link down or brings it back up.
func (h *Host) SetLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	out, err := ipBatch(strconv.Itoa(h.pid), []string{"link set " + Dev + " " + state})
	if err != nil {
		return fmt.Errorf("%s: link %s: %v: %s", h.Name, state, err, out)
	}
	return nil
}

// Kill kills every process of the host (the first process of a PID namespace takes
// the others with it); the host is gone afterwards.
func (h *Host) Kill() {
	if h.pid > 0 {
		_ = syscall.Kill(h.pid, syscall.SIGKILL)
	}
	if h.holder != nil && h.holder.Process != nil {
		_ = h.holder.Process.Kill()
		_ = h.holder.Wait()
		h.holder = nil
	}
}

// Stats are the byte counters of a host's devices.
type Stats struct {
	TxBytes, RxBytes     uint64 // eth0
	LoTxBytes, LoRxBytes uint64 // lo
}

// Stats reads the host's counters (/proc/PID/net/dev shows PID's network namespace).
func (h *Host) Stats() (Stats, error) { return readStats(fmt.Sprintf("/proc/%d/net/dev", h.pid)) }

func readStats(path string) (Stats, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		rx, _ := strconv.ParseUint(f[0], 10, 64)
		tx, _ := strconv.ParseUint(f[8], 10, 64)
		switch strings.TrimSpace(name) {
		case Dev:
			st.RxBytes, st.TxBytes = rx, tx
		case "lo":
			st.LoRxBytes, st.LoTxBytes = rx, tx
		}
	}
	return st, nil
}

// SelfStats reads the counters of the calling process's own network namespace: what
// a process started with Host.Command sees of its host.
func SelfStats() (Stats, error) { return readStats("/proc/self/net/dev") }
