package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"
)

// LibraryName is the driver library Load opens. dlopen searches LD_LIBRARY_PATH,
// the ld.so cache and the default paths (containers often mount the driver under
// /usr/local/nvidia/lib64, reachable only through LD_LIBRARY_PATH).
const LibraryName = "libcuda.so.1"

var (
	loadOnce sync.Once
	loadErr  error
	// driverLoaded is set once the function table is filled; code that may run
	// concurrently with (or inside) Load checks it instead of calling Load.
	driverLoaded atomic.Bool
)

// Load opens libcuda.so.1, resolves the driver entry points and calls cuInit(0).
// It runs once; later calls return the first result. Nothing is loaded before the
// first call, so a process that never touches CUDA never opens the driver.
//
// Where CUDA cannot be used — no libcuda.so.1, a stub library, a driver lacking a
// core entry point, or cuInit failing (for example with no visible device) — the
// error matches ErrNoDriver; when cuInit failed it also matches the driver's code
// (errors.Is(err, ErrNoDevice) for CUDA_ERROR_NO_DEVICE).
//
// The package's entry points (DeviceCount, GetDevice, DriverVersion) call Load
// themselves; call it first to find out early and cheaply whether CUDA is there.
func Load() error {
	loadOnce.Do(func() { loadErr = load(LibraryName) })
	return loadErr
}

// load opens lib and fills the function table. Split from Load so tests can
// exercise the failure paths with a library name that does not exist; it leaves
// the table untouched unless the library and its required symbols are all there.
func load(lib string) error {
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	var buf [512]C.char
	switch C.ucpx_cu_load(clib, &buf[0], C.size_t(len(buf))) {
	case 0:
	case 1:
		return fmt.Errorf("cuda: dlopen %s: %s: %w: %w", lib, C.GoString(&buf[0]), ErrNoDriver, errNoLibrary)
	default:
		return fmt.Errorf("cuda: %s: %w", C.GoString(&buf[0]), ErrNoDriver)
	}
	driverLoaded.Store(true) // the table is complete; error names may use it
	setConnections()
	if err := check("cuInit", C.ucpx_init(0)); err != nil {
		return fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	return nil
}

// ConnectionsEnv is the variable that sets how many hardware work queues CUDA maps a
// context's streams onto; DefaultConnections is what Load sets it to when the
// environment leaves it unset.
const (
	ConnectionsEnv     = "CUDA_DEVICE_MAX_CONNECTIONS"
	DefaultConnections = "32"
)

// setConnections gives CUDA 32 hardware work queues per context instead of its
// default 8, unless the environment chose: streams that share a queue run in
// submission order, and a memop wait that only another stream's later work answers
// deadlocks when both land on one queue (staged prepared partitions pre-enqueue such
// waits; docs/ARCHITECTURE.md). It must come before cuInit; a process where another
// library initialized CUDA first keeps that library's setting.
func setConnections() {
	if os.Getenv(ConnectionsEnv) == "" {
		_ = os.Setenv(ConnectionsEnv, DefaultConnections)
	}
}

// loaded reports an error matching ErrNoDriver unless Load succeeded.
func loaded() error {
	if err := Load(); err != nil {
		return err
	}
	return nil
}

// DriverVersion returns the CUDA version the driver supports, as
// 1000*major + 10*minor (13000 for CUDA 13.0).
func DriverVersion() (int, error) {
	if err := loaded(); err != nil {
		return 0, err
	}
	var v C.int
	if err := check("cuDriverGetVersion", C.ucpx_driver_version(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Symbol describes one driver entry point ucpx uses.
type Symbol struct {
	API      string // the name CUDA code writes, e.g. cuStreamWaitValue64
	Name     string // the versioned symbol resolved with dlsym, e.g. cuStreamWaitValue64_v2
	Required bool   // Load fails without it
	Loaded   bool   // found in the loaded driver (false before Load)
}

// Symbols lists the driver entry points ucpx resolves and whether the loaded
// driver has them. Wrappers whose symbol is missing return an error matching
// ErrNotSupported.
func Symbols() []Symbol {
	n := int(C.ucpx_cu_symbol_count())
	out := make([]Symbol, n)
	for i := range out {
		ci := C.int(i)
		out[i] = Symbol{
			API:      C.GoString(C.ucpx_cu_symbol_api(ci)),
			Name:     C.GoString(C.ucpx_cu_symbol_name(ci)),
			Required: C.ucpx_cu_symbol_required(ci) != 0,
			Loaded:   C.ucpx_cu_symbol_loaded(ci) != 0,
		}
	}
	return out
}

var symbolNames = sync.OnceValue(func() map[string]string {
	m := make(map[string]string)
	for _, s := range Symbols() {
		m[s.API] = s.Name
	}
	return m
})

// errNoLibrary marks the case where libcuda.so.1 itself is absent (as opposed to
// present but failing), which tests treat as "no GPU here".
var errNoLibrary = errors.New("library not found")
