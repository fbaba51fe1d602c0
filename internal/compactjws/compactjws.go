// Package compactjws checks the one spelling Embark accepts for a JWT before
// any JOSE library parses it: three parts in canonical base64url without
// padding, separated by two dots, and nothing else.
//
// Go's base64 decoders skip carriage returns and line feeds and, unless
// strict, ignore the unused low bits of a part's last character; a JOSE
// library then rebuilds the signing input from the decoded parts. Without
// this check one signed token has many accepted spellings, and a record
// keyed by the token's text (a replay record, a review cache) sees each as
// a new token: FuzzVerify found the first, the respelled-replay attacks in
// test/adversarial both.
package compactjws

import "fmt"

// Check returns an error unless raw consists of exactly three parts of the
// base64url alphabet (RFC 4648 §5, no padding), each of a length base64 can
// produce and with its unused trailing bits zero (RFC 4648 §3.5), separated
// by two dots. Parts may be empty; whether an empty part is acceptable is
// the caller's question.
func Check(raw string) error {
	part, start := 0, 0
	for i := 0; i <= len(raw); i++ {
		if i < len(raw) && raw[i] != '.' {
			if value(raw[i]) < 0 {
				return fmt.Errorf("byte %d is %q, which is neither base64url nor a part separator", i, raw[i])
			}
			continue
		}
		if err := canonical(raw[start:i]); err != nil {
			return fmt.Errorf("part %d: %w", part+1, err)
		}
		part, start = part+1, i+1
	}
	if part != 3 {
		return fmt.Errorf("%d parts, want 3", part)
	}
	return nil
}

// canonical checks that a part of base64url characters is the only
// encoding of its bytes: 4k+1 characters encode no whole byte, and the
// last character of 4k+2 (4k+3) characters has 4 (2) bits no byte uses.
func canonical(p string) error {
	if len(p) == 0 {
		return nil
	}
	unused := [4]int{0, -1, 0x0f, 0x03}[len(p)%4]
	switch {
	case unused < 0:
		return fmt.Errorf("%d characters, which no byte string encodes to", len(p))
	case value(p[len(p)-1])&unused != 0:
		return fmt.Errorf("last character %q sets bits no byte uses (not the canonical encoding)", p[len(p)-1])
	}
	return nil
}

// value is c's 6-bit value in the base64url alphabet, or -1.
func value(c byte) int {
	switch {
	case 'A' <= c && c <= 'Z':
		return int(c - 'A')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 26
	case '0' <= c && c <= '9':
		return int(c-'0') + 52
	case c == '-':
		return 62
	case c == '_':
		return 63
	}
	return -1
}
