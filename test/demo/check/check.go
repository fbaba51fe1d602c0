// Package check reads what kubectl and istioctl print, in their column
// layout, and checks it against what the demo expects: registrations and
// their AGENT CONNECTED column (WARs), proxies and their ISTIOD
// (ProxyStatus) and per-type sync state (Synced), any column by a key
// column (Column), and plain text (Contains).
package check

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Table is command output in kubectl's or istioctl's column layout: a header
// line of upper-case names, then rows, columns aligned under the header.
type Table struct {
	header []string
	rows   []map[string]string
}

// columnStart matches a header name (and the single spaces inside names
// such as "AGENT CONNECTED").
var columnStart = regexp.MustCompile(`\S+( \S+)*`)

// ParseTable reads aligned columns by the header's positions, so that empty
// cells (kubectl prints nothing for a condition not yet set) and cells with
// spaces ("NOT SENT") read correctly.
func ParseTable(out string) (Table, error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || strings.TrimSpace(lines[0]) == "" {
		return Table{}, fmt.Errorf("no Table in output %q", out)
	}
	locs := columnStart.FindAllStringIndex(lines[0], -1)
	var t Table
	for _, l := range locs {
		t.header = append(t.header, lines[0][l[0]:l[1]])
	}
	for _, line := range lines[1:] {
		if strings.TrimSpace(line) == "" {
			continue
		}
		row := map[string]string{}
		for i, l := range locs {
			end := len(line)
			if i+1 < len(locs) {
				end = min(locs[i+1][0], len(line))
			}
			if l[0] >= len(line) {
				row[t.header[i]] = ""
				continue
			}
			row[t.header[i]] = strings.TrimSpace(line[l[0]:end])
		}
		t.rows = append(t.rows, row)
	}
	return t, nil
}

// Column returns the values of the named column, by the value of the key
// column.
func (t Table) Column(key, name string) (map[string]string, error) {
	if !t.has(key) || !t.has(name) {
		return nil, fmt.Errorf("columns %s and %s expected, header is %v", key, name, t.header)
	}
	m := map[string]string{}
	for _, r := range t.rows {
		m[r[key]] = r[name]
	}
	return m, nil
}

func (t Table) has(name string) bool {
	for _, h := range t.header {
		if h == name {
			return true
		}
	}
	return false
}

// WARs checks `kubectl get war -A` output: exactly the registrations of
// want (namespace/name → AGENT CONNECTED value, "" when unset) are listed.
// kubectl prints nothing on standard output when there are none.
func WARs(out string, want map[string]string) error {
	if strings.TrimSpace(out) == "" {
		return Compare("registration", "AGENT CONNECTED", nil, want)
	}
	t, err := ParseTable(out)
	if err != nil {
		return err
	}
	for _, col := range []string{"NAMESPACE", "NAME", "AGENT CONNECTED", "AGE"} {
		if !t.has(col) {
			return fmt.Errorf("`kubectl get war -A` has no %s column: header %v", col, t.header)
		}
	}
	got := map[string]string{}
	for _, r := range t.rows {
		got[r["NAMESPACE"]+"/"+r["NAME"]] = r["AGENT CONNECTED"]
	}
	return Compare("registration", "AGENT CONNECTED", got, want)
}

// ProxyStatus checks `istioctl proxy-status` output: exactly the
// proxies of want (NAME, i.e. <registration>.<namespace>) are listed, each
// with the ISTIOD (replica) given.
func ProxyStatus(out string, want map[string]string) error {
	return Column(out, "proxy", "NAME", "ISTIOD", want)
}

// Column checks the table in out: exactly the kind of objects of want are
// listed (by their key column), each with the value of want in column
// name.
func Column(out, kind, key, name string, want map[string]string) error {
	t, err := ParseTable(out)
	if err != nil {
		return err
	}
	got, err := t.Column(key, name)
	if err != nil {
		return err
	}
	return Compare(kind, name, got, want)
}

// Compare reports the differences between got and want (name → value of
// the column called what).
func Compare(kind, what string, got, want map[string]string) error {
	var problems []string
	for _, name := range sortedKeys(want) {
		v, ok := got[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s %s is not listed", kind, name))
		case v != want[name]:
			problems = append(problems, fmt.Sprintf("%s %s: %s is %q, want %q", kind, name, what, v, want[name]))
		}
	}
	for _, name := range sortedKeys(got) {
		if _, ok := want[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s %s is listed but should not be", kind, name))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// Contains checks that out holds every one of wants.
func Contains(out string, wants ...string) error {
	var missing []string
	for _, w := range wants {
		if !strings.Contains(out, w) {
			missing = append(missing, fmt.Sprintf("%q", w))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("output lacks %s", strings.Join(missing, ", "))
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Synced checks `istioctl proxy-status -v 1` output: n proxies, each
// with every one of types SYNCED (sent and ACKed).
func Synced(out string, n int, types ...string) error {
	t, err := ParseTable(out)
	if err != nil {
		return err
	}
	if len(t.rows) != n {
		return fmt.Errorf("%d proxies listed, want %d", len(t.rows), n)
	}
	var problems []string
	for _, typ := range types {
		col, err := t.Column("NAME", typ)
		if err != nil {
			return err
		}
		for _, name := range sortedKeys(col) {
			if !strings.HasPrefix(col[name], "SYNCED") {
				problems = append(problems, fmt.Sprintf("%s: %s is %q, want SYNCED", name, typ, col[name]))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
