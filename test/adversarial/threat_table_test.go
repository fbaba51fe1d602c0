package adversarial

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// securityDoc is docs/security.md, relative to this package.
const securityDoc = "../../docs/security.md"

// testFuncName is a test or fuzz function named in backquotes in a table.
var testFuncName = regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)`")

// threatTables returns the rows (lines) of the tables under the headings
// of docs/security.md that name tests, keyed by heading.
func threatTables(t *testing.T) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(securityDoc)
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string][]string{}
	heading := ""
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "## "):
			heading = strings.TrimPrefix(line, "## ")
		case heading != "" && strings.HasPrefix(line, "|") && !strings.HasPrefix(line, "| ---") && !strings.HasPrefix(line, "| attack |") && !strings.HasPrefix(line, "| finding |"):
			tables[heading] = append(tables[heading], line)
		}
	}
	return tables
}

// testFunctions returns every top-level function declared in a *_test.go
// file of the repository (every Go module in it).
func testFunctions(t *testing.T) map[string]bool {
	t.Helper()
	funcs := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "_output", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				funcs[fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}

// The threat tables of docs/security.md cannot rot: every row names at
// least one test, and every test named exists.
func TestThreatTableNamesExistingTests(t *testing.T) {
	tables := threatTables(t)
	funcs := testFunctions(t)
	for _, heading := range []string{"Issue 17 findings: defence and test", "Attacks tried (test/adversarial)", "Round three attacks: defence and test"} {
		rows := tables[heading]
		if len(rows) == 0 {
			t.Errorf("docs/security.md has no table under %q", heading)
		}
		for _, row := range rows {
			cells := strings.Split(strings.Trim(row, "|"), "|")
			last := cells[len(cells)-1]
			names := testFuncName.FindAllStringSubmatch(last, -1)
			if len(names) == 0 {
				t.Errorf("%s: row names no test: %s", heading, row)
			}
			for _, m := range names {
				if !funcs[m[1]] {
					t.Errorf("%s: %s does not exist in any *_test.go (row: %.80s)", heading, m[1], row)
				}
			}
		}
	}
}
