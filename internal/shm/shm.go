// Package shm holds small shared-memory segments that processes of one host map
// together: memfd files, found by a peer through /proc/<pid>/fd/<fd> (what UCX's
// posix transport does with UCX_POSIX_USE_PROC_LINK), so nothing is left in /dev/shm
// if a process dies. Their use here is signal words that one process's GPU streams
// write (cuMemHostRegister maps the pages for the device in each process) and another
// process's CPU, streams and kernels read and may also write.
//
// A segment is sealed against shrinking and growing before anyone else sees it, and
// Open refuses any file that is not such a segment of the expected size: the
// (pid, fd) pair comes from a peer, and mapping a file that could shrink under us
// would turn a later write into SIGBUS.
package shm

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/internal/errs"
)

// name prefixes every segment's memfd name ("/memfd:ucpx-shm (deleted)" in /proc).
const name = "ucpx-shm"

const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Segment is a shared mapping: made here (Create) or a peer's (Open).
type Segment struct {
	// Mem is the mapping: page-aligned, zeroed when created.
	Mem []byte
	// FD is the memfd a peer opens through /proc; -1 for a peer's segment.
	FD int
}

// Create makes a zeroed segment of size bytes (rounded up to whole pages).
func Create(size int) (*Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: create %d bytes: %w", size, errs.InvalidParam)
	}
	size = roundPage(size)
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create: %w", unsupportedErr(err))
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: ftruncate: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: seal: %w", unsupportedErr(err))
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: mmap: %w", err)
	}
	return &Segment{Mem: mem, FD: fd}, nil
}

// Open maps the segment that process pid holds as fd, which must be a segment
// made by Create of exactly size bytes.
func Open(pid, fd, size int) (*Segment, error) {
	if pid <= 0 || fd < 0 || size <= 0 || size != roundPage(size) {
		return nil, fmt.Errorf("shm: open pid %d fd %d size %d: %w", pid, fd, size, errs.InvalidParam)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	// The link's target names a memfd of ours; anything else is not opened at all.
	if target, err := os.Readlink(path); err != nil {
		return nil, fmt.Errorf("shm: %s: %w", path, unsupportedErr(err))
	} else if !strings.HasPrefix(target, "/memfd:"+name) {
		return nil, fmt.Errorf("shm: %s is %q, not a shared segment: %w", path, target, errs.InvalidParam)
	}
	f, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, unsupportedErr(err))
	}
	defer unix.Close(f)
	got, err := unix.FcntlInt(uintptr(f), unix.F_GET_SEALS, 0)
	if err != nil || got&seals != seals {
		return nil, fmt.Errorf("shm: %s is not sealed (%#x, %v): %w", path, got, err, errs.InvalidParam)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("shm: %s has %d bytes, want %d: %w", path, st.Size, size, errs.InvalidParam)
	}
	mem, err := unix.Mmap(f, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap %s: %w", path, err)
	}
	return &Segment{Mem: mem, FD: -1}, nil
}

// Close unmaps the segment and closes its memfd; peers keep their own mappings
// (the pages live until the last one is gone).
func (s *Segment) Close() error {
	if s == nil || s.Mem == nil {
		return fmt.Errorf("shm: close: %w", errs.Closed)
	}
	err := unix.Munmap(s.Mem)
	s.Mem = nil
	if s.FD >= 0 {
		if cerr := unix.Close(s.FD); err == nil {
			err = cerr
		}
		s.FD = -1
	}
	return err
}

func roundPage(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) / p * p
}

// unsupportedErr marks what a platform or namespace does not allow (no memfd, no
// /proc of the peer: another pid namespace) as ErrUnsupported.
func unsupportedErr(err error) error {
	return fmt.Errorf("%w: %w", err, errs.Unsupported)
}
