package jwt

import (
	"encoding/json"
	"strconv"
	"strings"
)

// extractAttributes reads each attribute from claims by its dotted path.
// A string, number or boolean gives the attribute's value; anything else
// (missing, null, an object, an array) gives no attribute: an attribute has
// exactly one value, so that a policy's allowed values are compared with
// one string.
func extractAttributes(claims map[string]any, paths map[string]string) map[string]string {
	if len(paths) == 0 {
		return nil
	}
	out := make(map[string]string, len(paths))
	for name, path := range paths {
		v, ok := lookupPath(claims, path)
		if !ok {
			continue
		}
		if s, ok := scalarString(v); ok {
			out[name] = s
		}
	}
	return out
}

// lookupPath walks claims along a dotted path (a.b.c).
func lookupPath(claims map[string]any, path string) (any, bool) {
	var cur any = claims
	for seg := range strings.SplitSeq(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[seg]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func scalarString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return strconv.FormatBool(x), true
	default:
		return "", false
	}
}
