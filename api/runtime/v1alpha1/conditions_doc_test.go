package v1alpha1

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEveryReasonIsDocumented: every condition type and reason constant of
// the packages that write conditions and Events appears in
// docs/conditions.md, in backquotes, so the table operators read cannot
// fall behind the code.
func TestEveryReasonIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/conditions.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^(Condition|RolloutCondition|Reason)[A-Z]`)
	for _, dir := range []string{".", "../../../registry", "../../../onboarding/endpoint", "../../../onboarding/policy", "../../../xds/configsource"} {
		t.Run(filepath.Clean(dir), func(t *testing.T) {
			found := 0
			fset := token.NewFileSet()
			files, err := filepath.Glob(filepath.Join(dir, "*.go"))
			if err != nil {
				t.Fatal(err)
			}
			for _, file := range files {
				if strings.HasSuffix(file, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(fset, file, nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, decl := range f.Decls {
					g, ok := decl.(*ast.GenDecl)
					if !ok || g.Tok != token.CONST {
						continue
					}
					for _, spec := range g.Specs {
						vs := spec.(*ast.ValueSpec)
						for i, id := range vs.Names {
							if !name.MatchString(id.Name) || i >= len(vs.Values) {
								continue
							}
							lit, ok := vs.Values[i].(*ast.BasicLit)
							if !ok || lit.Kind != token.STRING {
								continue
							}
							value, err := strconv.Unquote(lit.Value)
							if err != nil {
								t.Fatal(err)
							}
							found++
							if !strings.Contains(string(doc), "`"+value+"`") {
								t.Errorf("%s (%s = %q) is not in docs/conditions.md", fset.Position(id.Pos()), id.Name, value)
							}
						}
					}
				}
			}
			if found == 0 {
				t.Errorf("no condition or reason constants in %s: is the list of packages stale?", dir)
			}
		})
	}
}
