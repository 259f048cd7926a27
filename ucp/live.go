package ucp

import "sync/atomic"

// live counts the UCX handles this process holds, for leak checks in tests.
var live struct {
	contexts, workers, endpoints, listeners, memhs, rkeys atomic.Int64
}

// LiveHandles reports how many UCX objects created through this package are still
// open. Tests assert it returns to zero after Close.
type LiveHandles struct {
	Contexts, Workers, Endpoints, Listeners, MemHs, Rkeys int64
}

// Live returns the current LiveHandles.
func Live() LiveHandles {
	return LiveHandles{
		Contexts: live.contexts.Load(), Workers: live.workers.Load(),
		Endpoints: live.endpoints.Load(), Listeners: live.listeners.Load(),
		MemHs: live.memhs.Load(), Rkeys: live.rkeys.Load(),
	}
}

// Zero reports whether no handle is open.
func (l LiveHandles) Zero() bool { return l == LiveHandles{} }
