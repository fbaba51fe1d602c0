// Package install is the end-to-end install test: the path a user takes,
// the Helm chart installed as the README says and a VM following
// docs/vm-install.md. Its VM side runs the guide's own blocks in a simulated
// VM (a network namespace reaching only the gateway, the host's root under
// an overlay, chrooted) with stand-ins for what a container lacks (systemd,
// Envoy). Everything needing root, packages or an image has the build tag
// install; the guide and cloud-init readers are plain unit tests.
package install

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// GuideBlocks returns the ```sh blocks of the Markdown file at path under
// each of headings, in order: a heading's section runs from the heading to
// the next heading of any level, so a page's title names the blocks before
// its first subsection. A heading that is missing, or whose section has no
// sh block, is an error, so a guide whose sections were renamed or emptied
// fails the test that runs it.
func GuideBlocks(path string, headings ...string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("guide: %w", err)
	}
	sections, err := shBlocksBySection(string(data))
	if err != nil {
		return nil, fmt.Errorf("guide %s: %w", path, err)
	}
	var blocks []string
	for _, h := range headings {
		got, ok := sections[h]
		if !ok {
			return nil, fmt.Errorf("guide %s: no section %q", path, h)
		}
		if len(got) == 0 {
			return nil, fmt.Errorf("guide %s: section %q has no ```sh block", path, h)
		}
		blocks = append(blocks, got...)
	}
	return blocks, nil
}

// shBlocksBySection maps each heading's text to the sh blocks of its
// section. Headings inside fenced blocks are not headings; a fence left
// open is an error.
func shBlocksBySection(doc string) (map[string][]string, error) {
	sections := map[string][]string{}
	heading := ""
	sections[heading] = nil
	var block *strings.Builder
	fence, lineNo, openedAt := "", 0, 0
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if trimmed == fence {
				if block != nil {
					sections[heading] = append(sections[heading], block.String())
				}
				fence, block = "", nil
				continue
			}
			if block != nil {
				block.WriteString(line + "\n")
			}
			continue
		}
		if f, info, ok := fenceOpen(trimmed); ok {
			fence, openedAt = f, lineNo
			if info == "sh" {
				block = &strings.Builder{}
			}
			continue
		}
		if h, ok := headingText(line); ok {
			heading = h
			if _, dup := sections[h]; dup {
				return nil, fmt.Errorf("line %d: heading %q appears twice", lineNo, h)
			}
			sections[h] = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("line %d: code fence never closed", openedAt)
	}
	return sections, nil
}

// fenceOpen reports whether line opens a fenced code block (``` or ~~~,
// three or more), returning the closing fence and the info string's first
// word.
func fenceOpen(line string) (fence, info string, ok bool) {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			fields := strings.Fields(line[n:])
			if len(fields) > 0 {
				info = fields[0]
			}
			return strings.Repeat(c, n), info, true
		}
	}
	return "", "", false
}

// headingText returns the text of an ATX heading (# to ######).
func headingText(line string) (string, bool) {
	n := len(line) - len(strings.TrimLeft(line, "#"))
	if n < 1 || n > 6 || len(line) == n || line[n] != ' ' {
		return "", false
	}
	return strings.TrimSpace(strings.TrimRight(strings.TrimSpace(line[n:]), "#")), true
}

// The sections of docs/vm-install.md a Debian/Ubuntu VM runs, in order,
// those a RHEL-family VM runs, and the lines of their blocks an operator
// edits.
var (
	guideSections     = []string{"Installing on a VM", "The repository key (both families)", "Debian / Ubuntu", "Both: configure and start"}
	rhelGuideSections = []string{"Installing on a VM", "The repository key (both families)", "RHEL family", "Both: configure and start"}
)

const (
	guideHostLine = "EMBARK=onboarding-endpoint.example.com"
	guideKeysLine = `EMBARK_KEYS="<fingerprint>"`
)

// GuideScript returns the blocks of sections of the guide at path as one
// script, filled in as the guide tells an operator to: EMBARK set to host
// and EMBARK_KEYS to the published fingerprints. A guide whose blocks no
// longer have those lines is an error.
func GuideScript(path, host string, fingerprints []string, sections ...string) (string, error) {
	blocks, err := GuideBlocks(path, sections...)
	if err != nil {
		return "", err
	}
	return fillIn(strings.Join(blocks, "\n"), map[string]string{
		guideHostLine: "EMBARK=" + host,
		guideKeysLine: `EMBARK_KEYS="` + strings.Join(fingerprints, " ") + `"`,
	})
}

// fillIn replaces each key of values in s, every one of which must occur.
func fillIn(s string, values map[string]string) (string, error) {
	for placeholder, v := range values {
		if !strings.Contains(s, placeholder) {
			return "", fmt.Errorf("no %q to fill in", placeholder)
		}
		s = strings.ReplaceAll(s, placeholder, v)
	}
	return s, nil
}
