package tests

import (
	"bufio"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
)

// TestCAPI builds libucpx.so (-buildmode=c-shared, as make libucpx does) and the C
// test program capi/c/exchange.c with the system compiler, then checks the C ABI:
//
//   - exchange: two processes of the C program wire up by worker address strings and
//     exchange tag messages (handles and the blocking calls, from several threads),
//     RMA put and get with packed remote keys, prepared partitioned iterations, and
//     error codes (capi/c/exchange.c says what exactly);
//   - exchange-authenticated, auth-mismatch: the same with UCPX_AUTH_KEY_FILE (sealed
//     addresses and remote keys), and wire-up refused (UCPX_ERR_AUTH) under different keys;
//   - cuda-fake-driver: capi/c/cuda_exchange.c, the CUDA path (a condition on the C
//     program's own CUstream, its raw CUevent recorded after the enqueue and waited on by
//     another of its streams, the peer 200 ms late) against the fake driver;
//   - nulls: capi/c/nulls.c, every function with handle 0, NULL pointers and bad
//     sizes answers an error code, never a crash;
//   - destroy-retry: capi/c/destroy_retry.c, ucpx_mem_unmap and ucpx_ep_destroy
//     time out while the peer does not progress, keep their handles, and succeed when
//     called again (about 7 s: the revocation's 2 s and the flush's 5 s);
//   - python: python/test_ucpx_host.py, the ctypes module's host-memory check (where
//     python3 exists);
//   - header: every function include/ucpx.h declares is a symbol libucpx.so exports,
//     and every //export of capi/libucpx is declared there (the parameter lists are
//     checked by the compiler: the package's preamble includes the header), and
//     python/ucpx.py declares each for ctypes.
//
// One build serves both (a c-shared build of the whole library takes a while on a
// small machine). It skips where there is no Go toolchain (the GPU machine) or no C
// compiler.
func TestCAPI(t *testing.T) {
	goBin := goToolchain(t)
	cc := cCompiler(t)
	dir := t.TempDir()
	lib := filepath.Join(dir, "libucpx.so")
	build := exec.Command(goBin, "build", "-buildmode=c-shared", "-o", lib, "../capi/libucpx")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building libucpx.so:\n%s", out)
	exe := filepath.Join(dir, "exchange")
	out, err = exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-O1", "-I../include", "-o", exe,
		"../capi/c/exchange.c", "-L"+dir, "-lucpx", "-lpthread", "-Wl,-rpath,"+dir).CombinedOutput()
	require.NoError(t, err, "building capi/c/exchange.c:\n%s", out)

	t.Run("exchange", func(t *testing.T) {
		runRanks(t, exe, nil, "OK rank")
	})

	// With UCPX_AUTH_KEY_FILE the worker addresses and remote keys the C program passes
	// around as strings are sealed under the key; under different keys wire-up fails
	// with UCPX_ERR_AUTH on both sides.
	keyFile := func(t *testing.T) string {
		key := make([]byte, 32)
		_, err := rand.Read(key)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "key")
		require.NoError(t, os.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600))
		return path
	}
	t.Run("exchange-authenticated", func(t *testing.T) {
		runRanks(t, exe, []string{"UCPX_AUTH_KEY_FILE=" + keyFile(t)}, "OK rank")
	})
	t.Run("auth-mismatch", func(t *testing.T) {
		wire := t.TempDir()
		keys := []string{keyFile(t), keyFile(t)}
		outs := make(chan []byte, 2)
		for rank := range 2 {
			cmd := exec.Command(exe, []string{"0", "1"}[rank], wire)
			cmd.Env = append(os.Environ(), "UCPX_AUTH_KEY_FILE="+keys[rank])
			go func() {
				o, err := cmd.CombinedOutput()
				assert.Error(t, err, "rank %d connected under another key", rank)
				outs <- o
			}()
		}
		for range 2 {
			o := <-outs
			assert.Contains(t, string(o), "ucpx_ep_create(worker, peer, 0, &ep) = UCPX_ERR_AUTH", "%s", o)
		}
	})

	t.Run("cuda-fake-driver", func(t *testing.T) {
		fake := testenv.BuildFakeDriver(t, t.TempDir())
		cexe := filepath.Join(dir, "cuda_exchange")
		out, err := exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-O1", "-I../include", "-o", cexe,
			"../capi/c/cuda_exchange.c", "-L"+dir, "-lucpx", "-L"+fake, "-l:libcuda.so.1", "-Wl,-rpath,"+dir).CombinedOutput()
		require.NoError(t, err, "building capi/c/cuda_exchange.c:\n%s", out)
		runRanks(t, cexe, []string{"LD_LIBRARY_PATH=" + fake + ":" + os.Getenv("LD_LIBRARY_PATH")}, "OK cuda rank")
	})

	// Every function with handle 0 and NULL pointers, then live handles with NULL or
	// bad pointers: an error code each time, and the handles still work after.
	t.Run("nulls", func(t *testing.T) {
		nexe := filepath.Join(dir, "nulls")
		out, err := exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-O1", "-I../include", "-o", nexe,
			"../capi/c/nulls.c", "-L"+dir, "-lucpx", "-Wl,-rpath,"+dir).CombinedOutput()
		require.NoError(t, err, "building capi/c/nulls.c:\n%s", out)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err = exec.CommandContext(ctx, nexe).CombinedOutput()
		require.NoError(t, err, "capi/c/nulls.c:\n%s", out)
		require.Contains(t, string(out), "OK nulls")
	})

	t.Run("destroy-retry", func(t *testing.T) {
		dexe := filepath.Join(dir, "destroy_retry")
		out, err := exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-O1", "-I../include", "-o", dexe,
			"../capi/c/destroy_retry.c", "-L"+dir, "-lucpx", "-Wl,-rpath,"+dir).CombinedOutput()
		require.NoError(t, err, "building capi/c/destroy_retry.c:\n%s", out)
		runRanks(t, dexe, nil, "OK destroy rank")
	})

	t.Run("python", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("no python3")
		}
		cmd := exec.Command(py, "../python/test_ucpx_host.py")
		cmd.Env = append(os.Environ(), "UCPX_LIB="+lib)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "python/test_ucpx_host.py:\n%s", out)
		require.Contains(t, string(out), "OK python")
	})

	t.Run("header", func(t *testing.T) {
		declared := headerFunctions(t, "../include/ucpx.h")
		require.NotEmpty(t, declared)
		f, err := elf.Open(lib)
		require.NoError(t, err)
		defer f.Close()
		syms, err := f.DynamicSymbols()
		require.NoError(t, err)
		exported := map[string]bool{}
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
				exported[s.Name] = true
			}
		}
		for name := range declared {
			assert.True(t, exported[name], "include/ucpx.h declares %s, which libucpx.so does not export", name)
		}
		// Every //export is declared: a public call in include/ucpx.h, or one only
		// the library's own C calls (ucpxi_*, capi/libucpx/internal.h). The public
		// calls not exported from Go are defined in the library's C files.
		internal := headerFunctions(t, "../capi/libucpx/internal.h")
		files, err := filepath.Glob("../capi/libucpx/*.go")
		require.NoError(t, err)
		export := regexp.MustCompile(`^//export (\w+)$`)
		goExports := map[string]bool{}
		for _, file := range files {
			src, err := os.ReadFile(file)
			require.NoError(t, err)
			for _, line := range strings.Split(string(src), "\n") {
				if m := export.FindStringSubmatch(line); m != nil {
					goExports[m[1]] = true
					if strings.HasPrefix(m[1], "ucpxi_") {
						assert.True(t, internal[m[1]], "%s exports %s, which capi/libucpx/internal.h does not declare", filepath.Base(file), m[1])
					} else {
						assert.True(t, declared[m[1]], "%s exports %s, which include/ucpx.h does not declare", filepath.Base(file), m[1])
					}
				}
			}
		}
		cFiles, err := filepath.Glob("../capi/libucpx/*.c")
		require.NoError(t, err)
		defined := map[string]bool{}
		definition := regexp.MustCompile(`(?m)^(?:int|const char \*)\s*(ucpx_\w+)\(`)
		for _, file := range cFiles {
			src, err := os.ReadFile(file)
			require.NoError(t, err)
			for _, m := range definition.FindAllStringSubmatch(string(src), -1) {
				defined[m[1]] = true
			}
		}
		for name := range declared {
			assert.True(t, goExports[name] != defined[name], "%s must be either a Go export or defined in capi/libucpx/*.c, once", name)
		}
		for name := range internal {
			if strings.HasPrefix(name, "ucpxi_") {
				assert.True(t, exported[name], "capi/libucpx/internal.h declares %s, which libucpx.so does not export", name)
			}
		}
		// python/ucpx.py declares every call's argument types for ctypes.
		py, err := os.ReadFile("../python/ucpx.py")
		require.NoError(t, err)
		for name := range declared {
			assert.Regexp(t, `[".]`+name+`\b`, string(py), "python/ucpx.py does not declare %s", name)
		}
	})
}

// runRanks runs ranks 0 and 1 of a C test program (argv: RANK DIR, DIR shared for the
// wire-up files) with env added, and requires both to exit 0 printing "<ok> N".
func runRanks(t *testing.T, exe string, env []string, ok string) {
	t.Helper()
	wire := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type result struct {
		rank int
		out  []byte
		err  error
	}
	results := make(chan result, 2)
	for rank := range 2 {
		cmd := exec.CommandContext(ctx, exe, []string{"0", "1"}[rank], wire)
		cmd.Env = append(os.Environ(), env...)
		go func() {
			o, err := cmd.CombinedOutput()
			results <- result{rank, o, err}
		}()
	}
	for range 2 {
		r := <-results
		require.NoError(t, r.err, "rank %d of %s failed:\n%s", r.rank, filepath.Base(exe), r.out)
		assert.Contains(t, string(r.out), fmt.Sprintf("%s %d", ok, r.rank))
	}
}

// headerFunctions returns the functions a C header declares: the names at the start of
// a declaration's parameter list, on lines that begin with a return type.
func headerFunctions(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	decl := regexp.MustCompile(`^(?:const\s+)?(?:int|size_t|char|void)\s*\*?\s*(ucpxi?_\w+)\(`)
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := decl.FindStringSubmatch(sc.Text()); m != nil {
			names[m[1]] = true
		}
	}
	require.NoError(t, sc.Err())
	return names
}

// cCompiler returns the system C compiler ($CC, cc, gcc), skipping the test without one.
func cCompiler(t *testing.T) string {
	t.Helper()
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	t.Skip("no C compiler")
	return ""
}
