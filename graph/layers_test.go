package graph

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
)

// chainLayers accepts exactly the graphs whose every node's ancestors are all the
// nodes of the lower levels (the definition, computed here with ancestor sets), over
// random graphs of communication nodes.
func TestChainLayersMatchesAncestorSets(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	words, err := b.AllocWords(1)
	require.NoError(t, err)
	defer words.Close()
	w := words.Word(0)
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range 20000 {
		n := 1 + rng.IntN(7)
		nodes := make([]*HostNode, n)
		x := &HostExec{deps: make([][]int, n), trigger: make([]*stream.Word, n)}
		anc := make([]map[int]bool, n)
		level := make([]int, n)
		for i := range n {
			nodes[i] = &HostNode{id: i, inline: true, trigger: w, waitFor: w}
			x.trigger[i] = w
			anc[i] = map[int]bool{}
			for d := range i {
				if rng.IntN(3) == 0 {
					x.deps[i] = append(x.deps[i], d)
					level[i] = max(level[i], level[d]+1)
					anc[i][d] = true
					for a := range anc[d] {
						anc[i][a] = true
					}
				}
			}
		}
		want := true
		for i := range n {
			below := 0
			for j := range n {
				if level[j] < level[i] {
					below++
				}
			}
			want = want && len(anc[i]) == below
		}
		got := x.chainLayers(nodes) != nil
		require.Equal(t, want, got, "deps %v", x.deps)
		if got {
			accepted++
		}
	}
	require.Positive(t, accepted)
}
