package tests

import (
	"bufio"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's Go examples are compiled, so they cannot drift from the API. Every
// ```go block becomes a package of its own in a scratch module (t.TempDir, with a
// replace directive pointing at this module) and `go build` and `go vet` check it.
//
// How a block is wrapped:
//   - a block starting with a package clause is a whole file and is used as written;
//   - a block that parses as top-level declarations (func, type, var, const) goes into
//     a file of package readme;
//   - anything else is statements: they become the body of `func readmeBlock() error`
//     (ending in `return nil` unless the block ends in a return), so `return err`
//     works in them.
//
// Imports are added for the packages the block names (ucp.X, context.X, ...: see
// readmeImports) unless the block has import declarations of its own. A first line
// `// imports: path ...` in a block adds more.
//
// A `//line` directive makes the compiler report README.md's own line numbers.

// readmeImports maps the package names a README block may use without importing them
// to their import paths.
var readmeImports = map[string]string{
	"bytes":     "bytes",
	"context":   "context",
	"errors":    "errors",
	"fmt":       "fmt",
	"io":        "io",
	"log":       "log",
	"os":        "os",
	"strings":   "strings",
	"sync":      "sync",
	"time":      "time",
	"binary":    "encoding/binary",
	"condition": "github.com/ucpx/ucpx/condition",
	"graph":     "github.com/ucpx/ucpx/graph",
	"protocol":  "github.com/ucpx/ucpx/protocol",
	"stream":    "github.com/ucpx/ucpx/stream",
	"ucp":       "github.com/ucpx/ucpx/ucp",
}

const readmeModule = "github.com/ucpx/ucpx"

// readmeBlock is one ```go fenced block: Line is the README line of its first line of
// code (the line after the fence).
type readmeBlock struct {
	Line int
	Code string
}

// readmeGoBlocks returns the ```go blocks of a Markdown text, in order.
func readmeGoBlocks(text string) ([]readmeBlock, error) {
	var blocks []readmeBlock
	var cur *readmeBlock
	var body []string
	fence := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case fence == "" && strings.HasPrefix(trimmed, "```"):
			fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, "`"))]
			info := strings.Fields(strings.TrimPrefix(trimmed, fence))
			if len(info) > 0 && info[0] == "go" {
				cur, body = &readmeBlock{Line: n + 1}, nil
			}
		case fence != "" && strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, "`") == "":
			if cur != nil {
				cur.Code = strings.Join(body, "\n") + "\n"
				blocks = append(blocks, *cur)
				cur = nil
			}
			fence = ""
		case cur != nil:
			body = append(body, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return blocks, fmt.Errorf("go block at line %d: no closing fence", cur.Line-1)
	}
	return blocks, nil
}

// wrapReadmeBlock returns the Go file that compiles b; readmePath names the file in
// the //line directives.
func wrapReadmeBlock(b readmeBlock, readmePath string) string {
	directive := fmt.Sprintf("//line %s:%d\n", readmePath, b.Line)
	if startsWithPackageClause(b.Code) {
		return directive + b.Code
	}
	fset := token.NewFileSet()
	declared := map[string]bool{}
	var src strings.Builder
	var imports []string
	var body string

	if f, err := parser.ParseFile(fset, "", "package readme\n"+b.Code, parser.ParseComments); err == nil {
		// Top-level declarations.
		collectDeclared(f, declared)
		if len(f.Imports) == 0 {
			imports = usedPackages(f, declared)
		}
		body = directive + b.Code
	} else {
		// Statements: the body of a function returning error.
		f, err := parser.ParseFile(fset, "", "package readme\nfunc readmeBlock() error {\n"+b.Code+"\n}\n", 0)
		tail := "\treturn nil\n"
		if err == nil {
			collectDeclared(f, declared)
			imports = usedPackages(f, declared)
			stmts := f.Decls[0].(*ast.FuncDecl).Body.List
			if len(stmts) > 0 {
				if _, ok := stmts[len(stmts)-1].(*ast.ReturnStmt); ok {
					tail = ""
				}
			}
		} // else: the compiler reports the syntax error at its README line
		body = "func readmeBlock() error {\n" + directive + b.Code + tail + "}\n"
	}
	imports = append(imports, importsDirective(b.Code)...)
	slices.Sort(imports)
	imports = slices.Compact(imports)

	src.WriteString("package readme\n\n")
	for _, p := range imports {
		fmt.Fprintf(&src, "import %q\n", p)
	}
	src.WriteString("\n")
	src.WriteString(body)
	return src.String()
}

func startsWithPackageClause(code string) bool {
	for _, line := range strings.Split(code, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "//") {
			continue
		}
		return strings.HasPrefix(t, "package ")
	}
	return false
}

// importsDirective reads a leading `// imports: a b` line.
func importsDirective(code string) []string {
	first, _, _ := strings.Cut(strings.TrimLeft(code, "\n"), "\n")
	rest, ok := strings.CutPrefix(strings.TrimSpace(first), "// imports:")
	if !ok {
		return nil
	}
	return strings.FieldsFunc(rest, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
}

// collectDeclared records every name the block declares, so that a local variable
// named like a package (a `log` parameter, say) does not pull that package in.
func collectDeclared(f *ast.File, declared map[string]bool) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, e := range n.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.Field:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.TypeSpec:
			declared[n.Name.Name] = true
		case *ast.FuncDecl:
			if n.Recv == nil {
				declared[n.Name.Name] = true
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if id, ok := e.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		}
		return true
	})
}

// usedPackages returns the import paths of the readmeImports names f uses as
// qualifiers (pkg.Name) and does not declare itself.
func usedPackages(f *ast.File, declared map[string]bool) []string {
	var paths []string
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && !declared[id.Name] {
				if p, ok := readmeImports[id.Name]; ok {
					paths = append(paths, p)
				}
			}
		}
		return true
	})
	return paths
}

// goTool returns the go command of the toolchain running the test.
func goTool(t *testing.T) string {
	t.Helper()
	for _, root := range []string{os.Getenv("GOROOT"), runtime.GOROOT()} {
		if root == "" {
			continue
		}
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		// The GPU machine runs the test binary without a toolchain or the module; the
		// README is checked where the code is built (make test, CI).
		t.Skip("no Go toolchain here to compile the README's examples with")
	}
	return p
}

// moduleRoot is the folder of this module's go.mod (the parent of tests/).
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "tests must run in the module's tests/ folder")
	return root
}

// readmeFailure is a block that did not compile, with the go command's output.
type readmeFailure struct {
	Block  readmeBlock
	Output string
}

// compileReadmeBlocks writes each block as a package of a scratch module that uses
// this module through a replace directive, then vets and builds them all at once; on
// failure it checks the blocks one by one to say which failed.
func compileReadmeBlocks(t *testing.T, blocks []readmeBlock, readmePath string) []readmeFailure {
	t.Helper()
	goTool(t) // skips where there is no toolchain
	root := moduleRoot(t)
	dir := t.TempDir()
	// The module's own go.mod, renamed, so its requirements (and go.sum) hold as they are.
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	modLine := regexp.MustCompile(`(?m)^module\s+\S+\s*$`)
	require.True(t, modLine.Match(gomod), "go.mod has no module line")
	gomod = modLine.ReplaceAll(gomod, []byte("module readmecheck"))
	gomod = fmt.Appendf(gomod, "\nrequire %s v0.0.0\n\nreplace %s => %s\n", readmeModule, readmeModule, root)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), gomod, 0o644))
	if sum, err := os.ReadFile(filepath.Join(root, "go.sum")); err == nil {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	}
	var pkgs []string
	for i, b := range blocks {
		pkg := fmt.Sprintf("block%02d_line%d", i+1, b.Line)
		require.NoError(t, os.Mkdir(filepath.Join(dir, pkg), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, pkg, "readme.go"), []byte(wrapReadmeBlock(b, readmePath)), 0o644))
		pkgs = append(pkgs, "./"+pkg)
	}

	goCmd := goTool(t)
	check := func(pkgs ...string) (string, error) {
		var out strings.Builder
		for _, verb := range []string{"build", "vet"} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			cmd := exec.CommandContext(ctx, goCmd, append([]string{verb}, pkgs...)...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local")
			b, err := cmd.CombinedOutput()
			cancel()
			out.Write(b)
			if err != nil {
				return out.String(), fmt.Errorf("go %s: %w", verb, err)
			}
		}
		return out.String(), nil
	}
	if _, err := check(pkgs...); err == nil {
		return nil
	}
	var failures []readmeFailure
	for i, b := range blocks {
		if out, err := check(pkgs[i]); err != nil {
			failures = append(failures, readmeFailure{Block: b, Output: strings.TrimSpace(out + "\n" + err.Error())})
		}
	}
	if len(failures) == 0 { // all together failed, each alone passed: name clash or flake
		out, err := check(pkgs...)
		failures = append(failures, readmeFailure{Block: readmeBlock{Line: 0}, Output: fmt.Sprint(out, err)})
	}
	return failures
}

// TestReadmeGoBlocksCompile compiles every ```go block of README.md.
func TestReadmeGoBlocksCompile(t *testing.T) {
	goTool(t) // skips where there is no toolchain
	readmePath := filepath.Join(moduleRoot(t), "README.md")
	text, err := os.ReadFile(readmePath)
	require.NoError(t, err)
	blocks, err := readmeGoBlocks(string(text))
	require.NoError(t, err)
	require.NotEmpty(t, blocks, "README.md has no ```go block: the examples went missing")

	for _, f := range compileReadmeBlocks(t, blocks, readmePath) {
		assert.Failf(t, "README example does not compile",
			"README.md:%d: the go block starting here does not compile:\n%s", f.Block.Line, f.Output)
	}
}

// TestReadmeCheckCatchesBrokenBlock runs the check on a small README with one good
// and one broken block: the failure names the broken block's line and the compiler's
// complaint, at the README line of the bad statement.
func TestReadmeCheckCatchesBrokenBlock(t *testing.T) {
	const readme = "# x\n" + // 1
		"\n" + // 2
		"```go\n" + // 3
		"func good(w *ucp.Worker) int { return w.Progress() }\n" + // 4
		"```\n" + // 5
		"\n" + // 6
		"```go\n" + // 7
		"req, err := w.TagRecvNbx(buf, 1, 0, nil)\n" + // 8: w and buf undefined
		"s.Record(ev)\n" + // 9
		"```\n" + // 10
		"```sh\n" + // 11
		"make test\n" + // 12
		"```\n"
	blocks, err := readmeGoBlocks(readme)
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	assert.Equal(t, 4, blocks[0].Line)
	assert.Equal(t, 8, blocks[1].Line)

	path := filepath.Join(t.TempDir(), "README.md")
	failures := compileReadmeBlocks(t, blocks, path)
	require.Len(t, failures, 1, "exactly the broken block fails")
	assert.Equal(t, 8, failures[0].Block.Line)
	assert.Contains(t, failures[0].Output, "README.md:8:")
	assert.Contains(t, failures[0].Output, "undefined: w")
}

// TestReadmeBlocksExtraction covers the fence parser and the wrapper without the go
// command.
func TestReadmeBlocksExtraction(t *testing.T) {
	blocks, err := readmeGoBlocks("text\n```sh\nmake\n```\n````go\nx := 1\n````\n")
	require.NoError(t, err)
	require.Len(t, blocks, 1)
	assert.Equal(t, readmeBlock{Line: 6, Code: "x := 1\n"}, blocks[0])

	none, err := readmeGoBlocks("# nothing\n```\nplain\n```\n")
	require.NoError(t, err)
	assert.Empty(t, none)

	_, err = readmeGoBlocks("```go\nx := 1\n")
	assert.ErrorContains(t, err, "no closing fence")

	stmts := wrapReadmeBlock(readmeBlock{Line: 12, Code: "ctx := context.Background()\n_ = ctx\nreturn errors.New(\"x\")\n"}, "R.md")
	assert.Contains(t, stmts, "func readmeBlock() error {\n//line R.md:12\n")
	assert.Contains(t, stmts, `import "context"`)
	assert.Contains(t, stmts, `import "errors"`)
	assert.NotContains(t, stmts, "return nil", "a block ending in return gets no second one")

	decl := wrapReadmeBlock(readmeBlock{Line: 3, Code: "// imports: encoding/json\nfunc f(log int) { fmt.Println(log, ucp.ErrClosed, json.Valid) }\n"}, "R.md")
	assert.NotContains(t, decl, "readmeBlock")
	assert.Contains(t, decl, `import "github.com/ucpx/ucpx/ucp"`)
	assert.Contains(t, decl, `import "encoding/json"`)
	assert.NotContains(t, decl, `import "log"`, "a parameter named log is not the package")
	assert.Contains(t, decl, "//line R.md:3\n")

	whole := wrapReadmeBlock(readmeBlock{Line: 5, Code: "package main\n\nfunc main() {}\n"}, "R.md")
	assert.Equal(t, "//line R.md:5\npackage main\n\nfunc main() {}\n", whole)
}
