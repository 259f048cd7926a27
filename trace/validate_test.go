package trace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A malformed trace is refused, by ReadSummary and ReadFile alike: data after the
// document, a negative duration, a sequence number that is not a non-negative
// integer (they were counted as operations, or left out, and summarized).
func TestSummaryRefusesMalformedTraces(t *testing.T) {
	span := func(args string) string {
		return `{"traceEvents":[{"name":"issue","ph":"X","ts":0,"dur":5,"pid":1,"tid":1,"args":{"seq":1}},` + args + `]}`
	}
	for _, tc := range []struct{ doc, want string }{
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{"seq":1}}`) + ` GARBAGE{{{`, "after the trace"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{"seq":1}}`) + `{}`, "after the trace"},
		{span(`{"name":"store","ph":"X","dur":-5,"tid":1,"args":{"seq":1}}`), "negative dur -5"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{"seq":1.5}}`), "args.seq"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{"seq":"x"}}`), "args.seq"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{"seq":"1"}}`), "args.seq"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{"seq":-1}}`), "args.seq"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1}`), "args.seq"},
		{span(`{"name":"store","ph":"X","dur":1,"tid":1,"args":{}}`), "args.seq"},
		{span(`{"name":"device wait","cat":"device","ph":"X","dur":1,"tid":1,"args":{"clock":"x"}}`), "args.seq"},
		{`{"traceEvents":[`, "ends early"},
		{``, "ends early"},
	} {
		_, err := ReadSummary(strings.NewReader(tc.doc))
		require.ErrorContains(t, err, tc.want, "ReadSummary %s", tc.doc)
		_, err = ReadFile(strings.NewReader(tc.doc))
		if tc.want == "ends early" {
			require.Error(t, err, "ReadFile %s", tc.doc) // encoding/json's own words
		} else {
			require.ErrorContains(t, err, tc.want, "ReadFile %s", tc.doc)
		}
	}
	_, err := ReadSummary(strings.NewReader(span(`{"name":"store","ph":"X","dur":1,"pid":"a","tid":1,"args":{"seq":1}}`)))
	require.ErrorContains(t, err, "pid")
	// What is not an operation's span is not checked: metadata, marks, other tools'
	// spans; white space after the document is fine.
	s, err := ReadSummary(strings.NewReader(span(`{"name":"thread_name","ph":"M","tid":1,"args":{"name":"x"}},{"name":"ring","ph":"i","s":"t","ts":3,"tid":1},{"name":"gc","ph":"X","dur":-1}`) + "\n \n"))
	require.NoError(t, err)
	require.Equal(t, 1, s.Ops)
}

// An operation is a (pid, tid, seq): a trace merged from two processes whose
// conditions and sequence numbers coincide counts both processes' operations.
func TestSummaryCountsOperationsPerProcess(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"traceEvents":[`)
	for i, ev := range []string{
		`{"name":"issue","ph":"X","dur":1,"pid":1,"tid":1,"args":{"seq":0}}`,
		`{"name":"issue","ph":"X","dur":1,"pid":2,"tid":1,"args":{"seq":0}}`,
		`{"name":"store","ph":"X","dur":1,"pid":1,"tid":1,"args":{"seq":0}}`,
		`{"name":"issue","ph":"X","dur":1,"pid":1,"tid":1,"args":{"seq":1}}`,
		`{"name":"issue","ph":"X","dur":1,"pid":2,"tid":2,"args":{"seq":1}}`,
	} {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(ev)
	}
	b.WriteString(`]}`)
	s, err := ReadSummary(strings.NewReader(b.String()))
	require.NoError(t, err)
	require.Equal(t, 4, s.Ops)
	f, err := ReadFile(strings.NewReader(b.String()))
	require.NoError(t, err)
	require.Equal(t, 4, Summarize(f).Ops)
}
