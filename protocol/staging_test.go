package protocol

import (
	"errors"
	"testing"

	"github.com/ucpx/ucpx/stream"
)

func TestHostBackendNeedsNoStaging(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	s := NewStager(b)
	buf := make([]byte, 8)
	kind, err := s.Classify(uintptr(len(buf))) // any address: host backends never stage
	if err != nil || kind != KindHost {
		t.Fatalf("Classify = %v, %v; want host", kind, err)
	}
	if _, err := s.Get(100); !errors.Is(err, stream.ErrNotSupported) {
		t.Fatalf("Get on a host backend: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSizeClasses(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, minClass}, {minClass, minClass}, {minClass + 1, 2 * minClass}, {1 << 20, 1 << 20}, {(1 << 20) + 1, 2 << 20},
	} {
		if got := class(tc.n); got != tc.want {
			t.Errorf("class(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}
