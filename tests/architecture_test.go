package tests

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/ARCHITECTURE.md's layer table names, for every package, the ucpx packages it
// imports; it must match what the code imports (go list), so the document cannot rot.
func TestArchitectureImportTable(t *testing.T) {
	goBin := goToolchain(t)
	out, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	const module = "github.com/ucpx/ucpx/"
	actual := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		deps := []string{}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) {
				deps = append(deps, strings.TrimPrefix(imp, module))
			}
		}
		slices.Sort(deps)
		actual[pkg] = deps
	}

	doc, err := os.Open("../docs/ARCHITECTURE.md")
	require.NoError(t, err)
	defer doc.Close()
	row := regexp.MustCompile("^\\| `([a-z/]+)` \\|[^|]*\\| ([^|]*) \\|$")
	tick := regexp.MustCompile("`([a-z/]+)`")
	documented := map[string][]string{}
	sc := bufio.NewScanner(doc)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		deps := []string{}
		for _, d := range tick.FindAllStringSubmatch(m[2], -1) {
			deps = append(deps, d[1])
		}
		slices.Sort(deps)
		documented[m[1]] = deps
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, documented, "no layer table found in docs/ARCHITECTURE.md")
	for pkg, deps := range actual {
		got, ok := documented[pkg]
		require.True(t, ok, "package %s is missing from the layer table of docs/ARCHITECTURE.md", pkg)
		require.Equal(t, deps, got, "imports of %s in docs/ARCHITECTURE.md", pkg)
	}
	for pkg := range documented {
		_, ok := actual[pkg]
		require.True(t, ok, "docs/ARCHITECTURE.md lists %s, which is no package", pkg)
	}
}

// goToolchain returns the go command, skipping the test where there is none (the GPU
// machine runs test binaries only): the layering is checked where the code is built.
func goToolchain(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			t.Skip("no Go toolchain here (the GPU machine): the layering is checked where the code is built")
		}
	}
	return goBin
}

// ucp, condition and protocol are written against stream/streamcore alone: neither
// the CUDA layer nor package stream (whose CUDA backend imports it) is among their
// dependencies, so a program using them without a CUDA backend links no CUDA code.
func TestNoCUDABelowUCP(t *testing.T) {
	goBin := goToolchain(t)
	out, err := exec.Command(goBin, "list", "-deps", "../ucp", "../condition", "../protocol").CombinedOutput()
	require.NoError(t, err, "%s", out)
	const module = "github.com/ucpx/ucpx/"
	deps := strings.Fields(string(out))
	require.Contains(t, deps, module+"stream/streamcore")
	for _, d := range deps {
		require.NotContains(t, d, "cgo/cuda", "ucp, condition or protocol depends on the CUDA layer")
		require.NotEqual(t, module+"stream", d, "ucp, condition or protocol imports package stream (its CUDA backend); use stream/streamcore")
	}
}
