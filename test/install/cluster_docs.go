package install

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
)

// helmInstall is a `helm install` command of the docs, as its flags say.
type helmInstall struct {
	Release, Chart, Namespace string
	// Sets are the --set values, verbatim (Helm's syntax).
	Sets []string
	// Before are the commands of the block before `helm install` (the
	// operator's preparation, e.g. kubectl create secret), as words.
	Before [][]string
}

// readmeHelmInstall reads the `helm install` command of the first ```sh
// block of the file at path that has one, and the commands before it.
func readmeHelmInstall(path string) (helmInstall, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return helmInstall{}, err
	}
	h, err := parseReadmeHelmInstall(string(data))
	if err != nil {
		return helmInstall{}, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// parseReadmeHelmInstall is readmeHelmInstall of the markdown md.
func parseReadmeHelmInstall(md string) (helmInstall, error) {
	for _, block := range codeBlocks(md, "sh") {
		var before [][]string
		for _, line := range shellLines(block) {
			words, err := shellWords(line)
			if err != nil {
				return helmInstall{}, fmt.Errorf("%s: %w", line, err)
			}
			if len(words) >= 2 && words[0] == "helm" && words[1] == "install" {
				h, err := parseHelmInstall(words[2:])
				if err != nil {
					return helmInstall{}, fmt.Errorf("%s: %w", line, err)
				}
				h.Before = before
				return h, nil
			}
			if len(words) > 0 {
				before = append(before, words)
			}
		}
	}
	return helmInstall{}, errors.New("no ```sh block with a `helm install` command")
}

// codeBlocks returns the bodies of the fenced blocks of lang.
func codeBlocks(md, lang string) []string {
	var blocks []string
	var cur *strings.Builder
	sc := bufio.NewScanner(strings.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == "```"+lang:
			cur = &strings.Builder{}
		case cur != nil && trimmed == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line)
			cur.WriteByte('\n')
		}
	}
	return blocks
}

// shellLines joins backslash-continued lines and drops comments.
func shellLines(block string) []string {
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(block, "\n") {
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s)
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(l)
		if s := strings.TrimSpace(cur.String()); s != "" {
			lines = append(lines, s)
		}
		cur.Reset()
	}
	return lines
}

// shellWords splits a command line as a POSIX shell would for the quoting
// the docs use (single and double quotes, backslash escapes); a comment
// ends it. Expansions ($X, globs) are an error, as their value is unknown.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	runes := []rune(line)
	for i := 0; i < len(runes); i++ {
		r := runes[i]
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case quote == '"':
			switch r {
			case '"':
				quote = 0
			case '$', '`':
				return nil, fmt.Errorf("expansion %q in a double-quoted word: its value is not known here", string(r))
			case '\\':
				if i+1 < len(runes) {
					i++
					cur.WriteRune(runes[i])
				}
			default:
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '\\':
			if i+1 < len(runes) {
				i++
				cur.WriteRune(runes[i])
				inWord = true
			}
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '#' && !inWord:
			return words, nil
		case r == '$' || r == '`' || r == '*' || r == '?' || r == ';' || r == '|' || r == '&':
			return nil, fmt.Errorf("shell syntax %q: only plain words are understood here", string(r))
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// parseHelmInstall reads `helm install`'s arguments: release, chart, -n
// and --set; any other flag is an error naming it, so a README that starts
// using one fails here rather than being half understood.
func parseHelmInstall(args []string) (helmInstall, error) {
	var h helmInstall
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		switch name {
		case "-n", "--namespace", "--set":
			if !hasValue {
				if i+1 >= len(args) {
					return helmInstall{}, fmt.Errorf("%s without a value", a)
				}
				i++
				value = args[i]
			}
			if name == "--set" {
				h.Sets = append(h.Sets, value)
			} else {
				h.Namespace = value
			}
		default:
			if strings.HasPrefix(a, "-") {
				return helmInstall{}, fmt.Errorf("flag %s is not understood by the install test (add it to parseHelmInstall)", a)
			}
			positional = append(positional, a)
		}
	}
	if len(positional) != 2 || positional[0] == "" || positional[1] == "" {
		return helmInstall{}, fmt.Errorf("want a release name and a chart, got %q", positional)
	}
	h.Release, h.Chart = positional[0], positional[1]
	if h.Namespace == "" {
		h.Namespace = "default"
	}
	return h, nil
}

// guideObjects returns the YAML documents of the ```yaml blocks below the
// headings of the file at path whose text starts with one of prefixes,
// those that are whole objects (apiVersion and kind); fragments of a
// spec are left out.
func guideObjects(path string, prefixes ...string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var docs []string
	for _, sec := range sections(string(data)) {
		if !hasAnyPrefix(sec.heading, prefixes) {
			continue
		}
		for _, b := range codeBlocks(sec.body, "yaml") {
			if strings.HasPrefix(b, "apiVersion:") && strings.Contains(b, "\nkind:") {
				docs = append(docs, b)
			}
		}
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no objects below headings %q", path, prefixes)
	}
	return docs, nil
}

type section struct{ heading, body string }

// sections splits markdown at its "## " headings.
func sections(md string) []section {
	var out []section
	cur := section{}
	for _, l := range strings.SplitAfter(md, "\n") {
		if h, ok := strings.CutPrefix(l, "## "); ok {
			out = append(out, cur)
			cur = section{heading: strings.TrimSpace(h)}
			continue
		}
		cur.body += l
	}
	return append(out, cur)
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
