package aws

import (
	"bytes"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// The parser below reads the one PKCS#7 shape AWS's rsa2048 signature has:
// a ContentInfo of type signedData whose SignedData encloses the document
// as data and carries one SignerInfo. AWS encodes the outer structures and
// the enclosed content with BER indefinite lengths and the SignerInfo in
// DER, so indefinite lengths are read down to the enclosed content and the
// SignerInfo must be DER. Every constructed element is first checked to be
// well-formed BER, the parts the verifier skips included. Nothing is
// converted on the way: the content (unless split in several OCTET
// STRINGs) and the signer's fields are slices of the input.

// Tags of the BER elements the parser reads.
const (
	tagInteger          = 0x02
	tagOctetString      = 0x04
	tagOID              = 0x06
	tagSequence         = 0x30
	tagSet              = 0x31
	tagConstructedOctet = 0x24
	tagContext0         = 0xa0
	tagContext1         = 0xa1
)

// maxBERDepth bounds the nesting of indefinite-length elements; AWS's
// signature nests five.
const maxBERDepth = 16

// derSignedData is the DER contents of the signedData content type's OID,
// 1.2.840.113549.1.7.2.
var derSignedData = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02}

// DER contents of the OIDs of the messageDigest (1.2.840.113549.1.9.4) and
// signingTime (1.2.840.113549.1.9.5) attributes.
var (
	derMessageDigest = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x04}
	derSigningTime   = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x05}
)

// errBER is the error of every malformed element.
var errBER = errors.New("malformed BER")

// signedData is what the verifier checks of a PKCS#7 SignedData: the
// enclosed content and its only signer.
type signedData struct {
	// content is the enclosed content; empty when the signature is
	// detached.
	content []byte
	// certificates is the raw [0] certificates field, nil when absent.
	certificates []byte
	signer       signerInfo
}

// signerInfo is a SignerInfo. Every slice points into the parsed input.
type signerInfo struct {
	issuer        []byte // DER Name of the signer certificate's issuer
	serial        *big.Int
	digestAlg     asn1.ObjectIdentifier
	encryptionAlg asn1.ObjectIdentifier
	// attributes is the DER authenticatedAttributes with its [0] tag, nil
	// when absent.
	attributes []byte
	// messageDigest and signingTime are the values (the contents of the
	// SET) of the first attribute of each type, nil when absent.
	messageDigest, signingTime []byte
	// attributesSorted reports whether the attributes are in DER SET OF
	// order, the order in which they are signed.
	attributesSorted bool
	signature        []byte
}

// berReader reads consecutive BER elements.
type berReader struct {
	in    []byte
	depth int
}

// next reads one element and returns its tag and contents. An element of
// indefinite length must be constructed; its contents are its children,
// without the end-of-contents octets.
func (r *berReader) next() (byte, []byte, error) {
	tag, body, rest, err := readBER(r.in, r.depth)
	if err != nil {
		return 0, nil, err
	}
	r.in = rest
	return tag, body, nil
}

// expect reads one element that must have tag.
func (r *berReader) expect(tag byte) ([]byte, error) {
	got, body, err := r.next()
	if err != nil {
		return nil, err
	}
	if got != tag {
		return nil, fmt.Errorf("%w: tag 0x%02x where 0x%02x is expected", errBER, got, tag)
	}
	return body, nil
}

// peek returns the tag of the next element, 0 at the end.
func (r *berReader) peek() byte {
	if len(r.in) == 0 {
		return 0
	}
	return r.in[0]
}

// child returns a reader of an element's contents, one level deeper.
func (r *berReader) child(body []byte) *berReader {
	return &berReader{in: body, depth: r.depth + 1}
}

// readBER reads one BER element from in: its tag, its contents and what
// follows it. Only low tag numbers (one identifier octet) occur in PKCS#7.
func readBER(in []byte, depth int) (tag byte, body, rest []byte, err error) {
	if depth > maxBERDepth {
		return 0, nil, nil, fmt.Errorf("%w: nested deeper than %d", errBER, maxBERDepth)
	}
	if len(in) < 2 {
		return 0, nil, nil, fmt.Errorf("%w: truncated element", errBER)
	}
	tag, first, in := in[0], in[1], in[2:]
	if tag&0x1f == 0x1f {
		return 0, nil, nil, fmt.Errorf("%w: high tag number", errBER)
	}
	switch {
	case first < 0x80:
		return split(tag, in, int(first))
	case first == 0x80:
		return readIndefinite(tag, in, depth)
	}
	n := int(first & 0x7f)
	if n > 3 || len(in) <= n {
		return 0, nil, nil, fmt.Errorf("%w: length of %d octets", errBER, n)
	}
	if in[0] == 0 {
		return 0, nil, nil, fmt.Errorf("%w: length with a leading zero octet", errBER)
	}
	length := 0
	for _, b := range in[:n] {
		length = length<<8 | int(b)
	}
	return split(tag, in[n:], length)
}

// split cuts a definite-length element's contents of length from in.
func split(tag byte, in []byte, length int) (byte, []byte, []byte, error) {
	if length > len(in) {
		return 0, nil, nil, fmt.Errorf("%w: length %d exceeds the %d octets left", errBER, length, len(in))
	}
	return tag, in[:length], in[length:], nil
}

// readIndefinite reads the children of a constructed element of indefinite
// length up to its end-of-contents octets.
func readIndefinite(tag byte, in []byte, depth int) (byte, []byte, []byte, error) {
	if tag&0x20 == 0 {
		return 0, nil, nil, fmt.Errorf("%w: primitive element of indefinite length", errBER)
	}
	rest := in
	for {
		if len(rest) >= 2 && rest[0] == 0 && rest[1] == 0 {
			return tag, in[:len(in)-len(rest)], rest[2:], nil
		}
		var err error
		if _, _, rest, err = readBER(rest, depth+1); err != nil {
			return 0, nil, nil, err
		}
	}
}

// checkBER checks that in is a series of well-formed BER elements, the
// contents of every constructed one included, so that no part of the
// signature, read or skipped, is malformed.
func checkBER(in []byte, depth int) error {
	for len(in) > 0 {
		tag, body, rest, err := readBER(in, depth)
		if err != nil {
			return err
		}
		if tag&0x20 != 0 {
			if err := checkBER(body, depth+1); err != nil {
				return err
			}
		}
		in = rest
	}
	return nil
}

// parseSignedData parses a PKCS#7 ContentInfo holding a SignedData with
// exactly one signer. Errors describe what is malformed; the caller gives
// them their refusal reason.
func parseSignedData(der []byte) (*signedData, error) {
	if err := checkBER(der, 0); err != nil {
		return nil, err
	}
	top := &berReader{in: der}
	info, err := top.expect(tagSequence)
	if err != nil {
		return nil, err
	}
	if len(top.in) != 0 {
		return nil, fmt.Errorf("%w: %d octets after the ContentInfo", errBER, len(top.in))
	}
	r := top.child(info)
	if err := expectOID(r, derSignedData, "signedData"); err != nil {
		return nil, err
	}
	explicit, err := r.expect(tagContext0)
	if err != nil {
		return nil, err
	}
	body, err := r.child(explicit).expect(tagSequence)
	if err != nil {
		return nil, err
	}
	return parseSignedDataBody(r.child(explicit).child(body))
}

// parseSignedDataBody reads the fields of SignedData: version,
// digestAlgorithms, contentInfo, certificates, crls and signerInfos.
func parseSignedDataBody(r *berReader) (*signedData, error) {
	version, err := r.expect(tagInteger)
	if err != nil {
		return nil, err
	}
	if !validInteger(version) {
		return nil, fmt.Errorf("%w: SignedData version", errBER)
	}
	digestAlgs, err := r.expect(tagSet)
	if err != nil {
		return nil, err
	}
	if !validAlgorithms(digestAlgs) {
		return nil, fmt.Errorf("%w: SignedData digest algorithms", errBER)
	}
	contentInfo, err := r.expect(tagSequence)
	if err != nil {
		return nil, err
	}
	sd := &signedData{}
	if sd.content, err = parseContent(r.child(contentInfo)); err != nil {
		return nil, err
	}
	if r.peek() == tagContext0 {
		if sd.certificates, err = r.expect(tagContext0); err != nil {
			return nil, err
		}
	}
	if r.peek() == tagContext1 {
		// AWS encloses no CRLs, and the verifier would not use them.
		return nil, fmt.Errorf("%w: the SignedData encloses CRLs", errBER)
	}
	signers, err := r.expect(tagSet)
	if err != nil {
		return nil, err
	}
	if len(r.in) != 0 {
		return nil, fmt.Errorf("%w: data after the signerInfos", errBER)
	}
	one, err := onlySigner(r.child(signers))
	if err != nil {
		return nil, err
	}
	if sd.signer, err = parseSignerInfo(one); err != nil {
		return nil, err
	}
	return sd, nil
}

// errSignerCount is returned when the SignedData does not have exactly one
// signer.
type errSignerCount int

func (e errSignerCount) Error() string { return fmt.Sprintf("%d signers, want exactly 1", int(e)) }

// onlySigner returns the contents of the only SignerInfo of the
// signerInfos set read by r.
func onlySigner(r *berReader) ([]byte, error) {
	var first []byte
	count := 0
	for len(r.in) > 0 {
		body, err := r.expect(tagSequence)
		if err != nil {
			return nil, err
		}
		if count == 0 {
			first = body
		}
		count++
	}
	if count != 1 {
		return nil, errSignerCount(count)
	}
	return first, nil
}

// expectOID reads an OBJECT IDENTIFIER whose DER contents must be want.
func expectOID(r *berReader, want []byte, name string) error {
	body, err := r.expect(tagOID)
	if err != nil {
		return err
	}
	if !bytes.Equal(body, want) {
		return fmt.Errorf("%w: content type is not %s", errBER, name)
	}
	return nil
}

// parseContent reads the enclosed ContentInfo and returns its content: a
// primitive OCTET STRING or a constructed one made of primitive ones. The
// content type is not checked: what is signed is the content's octets. A
// ContentInfo without content (a detached signature) returns nil.
func parseContent(r *berReader) ([]byte, error) {
	oid, err := r.expect(tagOID)
	if err != nil {
		return nil, err
	}
	if !validOID(oid) {
		return nil, fmt.Errorf("%w: content type", errBER)
	}
	if len(r.in) == 0 {
		return nil, nil
	}
	explicit, err := r.expect(tagContext0)
	if err != nil {
		return nil, err
	}
	if len(r.in) != 0 {
		return nil, fmt.Errorf("%w: data after the content", errBER)
	}
	inner := r.child(explicit)
	tag, body, err := inner.next()
	if err != nil {
		return nil, err
	}
	if len(inner.in) != 0 {
		return nil, fmt.Errorf("%w: data after the content's OCTET STRING", errBER)
	}
	switch tag {
	case tagOctetString:
		return body, nil
	case tagConstructedOctet:
		return joinChunks(inner.child(body))
	default:
		return nil, fmt.Errorf("%w: content of tag 0x%02x is not an OCTET STRING", errBER, tag)
	}
}

// joinChunks returns the concatenated primitive OCTET STRINGs read by r.
// One chunk (AWS's case) is returned without copying.
func joinChunks(r *berReader) ([]byte, error) {
	var joined []byte
	for n := 0; len(r.in) > 0; n++ {
		chunk, err := r.expect(tagOctetString)
		if err != nil {
			return nil, err
		}
		switch n {
		case 0:
			joined = chunk
		case 1:
			joined = append(append([]byte(nil), joined...), chunk...)
		default:
			joined = append(joined, chunk...)
		}
	}
	return joined, nil
}

// parseSignerInfo reads a DER SignerInfo: version, issuerAndSerialNumber,
// digestAlgorithm, authenticatedAttributes, digestEncryptionAlgorithm,
// encryptedDigest and unauthenticatedAttributes.
func parseSignerInfo(body []byte) (signerInfo, error) {
	s := cryptobyte.String(body)
	var si signerInfo
	var ias, issuer cryptobyte.String
	var version cryptobyte.String
	si.serial = new(big.Int)
	if !s.ReadASN1(&version, cbasn1.INTEGER) || !validInteger(version) ||
		!s.ReadASN1(&ias, cbasn1.SEQUENCE) ||
		!ias.ReadASN1Element(&issuer, cbasn1.SEQUENCE) ||
		!ias.ReadASN1Integer(si.serial) || !ias.Empty() {
		return si, fmt.Errorf("%w: signer's issuer and serial number", errBER)
	}
	si.issuer = issuer
	if !readAlgorithm(&s, &si.digestAlg) {
		return si, fmt.Errorf("%w: signer's digest algorithm", errBER)
	}
	if attrsTag := cbasn1.Tag(0).Constructed().ContextSpecific(); s.PeekASN1Tag(attrsTag) {
		var attrs cryptobyte.String
		if !s.ReadASN1Element(&attrs, attrsTag) {
			return si, fmt.Errorf("%w: signer's authenticated attributes", errBER)
		}
		si.attributes = attrs
		if err := readAttributes(&si); err != nil {
			return si, err
		}
	}
	var sig, unsigned cryptobyte.String
	var hasUnsigned bool
	if !readAlgorithm(&s, &si.encryptionAlg) ||
		!s.ReadASN1(&sig, cbasn1.OCTET_STRING) ||
		!s.ReadOptionalASN1(&unsigned, &hasUnsigned, cbasn1.Tag(1).Constructed().ContextSpecific()) || !s.Empty() {
		return si, fmt.Errorf("%w: signer's signature", errBER)
	}
	if hasUnsigned {
		if _, err := walkAttributes(unsigned, func(_, _ []byte) {}); err != nil {
			return si, err
		}
	}
	si.signature = sig
	return si, nil
}

// readAlgorithm reads an AlgorithmIdentifier's algorithm; its parameters
// are not used.
func readAlgorithm(s *cryptobyte.String, oid *asn1.ObjectIdentifier) bool {
	var alg, params cryptobyte.String
	var tag cbasn1.Tag
	if !s.ReadASN1(&alg, cbasn1.SEQUENCE) || !alg.ReadASN1ObjectIdentifier(oid) {
		return false
	}
	return alg.Empty() || alg.ReadAnyASN1(&params, &tag) && alg.Empty()
}

// readAttributes reads si's authenticated attributes and keeps the values
// of the first messageDigest and signingTime attributes.
func readAttributes(si *signerInfo) error {
	s := cryptobyte.String(si.attributes)
	var set cryptobyte.String
	if !s.ReadASN1(&set, cbasn1.Tag(0).Constructed().ContextSpecific()) {
		return fmt.Errorf("%w: signer's authenticated attributes", errBER)
	}
	sorted, err := walkAttributes(set, func(oid, values []byte) {
		switch {
		case si.messageDigest == nil && bytes.Equal(oid, derMessageDigest):
			si.messageDigest = values
		case si.signingTime == nil && bytes.Equal(oid, derSigningTime):
			si.signingTime = values
		}
	})
	si.attributesSorted = sorted
	return err
}

// walkAttributes reads the contents of a SET OF Attribute, each a SEQUENCE
// of an OID and a SET of values, calls fn with each one's OID and values
// (DER contents) and reports whether they are in DER SET OF order.
func walkAttributes(set cryptobyte.String, fn func(oid, values []byte)) (sorted bool, err error) {
	sorted = true
	var prev []byte
	for !set.Empty() {
		var elem, attr, oid, values cryptobyte.String
		if !set.ReadASN1Element(&elem, cbasn1.SEQUENCE) {
			return false, fmt.Errorf("%w: signer's attribute", errBER)
		}
		if prev != nil && bytes.Compare(prev, elem) > 0 {
			sorted = false
		}
		prev = elem
		if !elem.ReadASN1(&attr, cbasn1.SEQUENCE) ||
			!attr.ReadASN1(&oid, cbasn1.OBJECT_IDENTIFIER) ||
			!attr.ReadASN1(&values, cbasn1.SET) || !attr.Empty() || !validOID(oid) {
			return false, fmt.Errorf("%w: signer's attribute", errBER)
		}
		fn(oid, values)
	}
	return sorted, nil
}

// validInteger reports whether body is the contents of a DER INTEGER
// (minimally encoded, at most 8 octets).
func validInteger(body []byte) bool {
	if len(body) == 0 || len(body) > 8 {
		return false
	}
	if len(body) > 1 && (body[0] == 0 && body[1]&0x80 == 0 || body[0] == 0xff && body[1]&0x80 != 0) {
		return false
	}
	return true
}

// validAlgorithms reports whether body is a DER SET OF AlgorithmIdentifier:
// each a SEQUENCE of an OID and, optionally, one parameters element.
func validAlgorithms(body []byte) bool {
	s := cryptobyte.String(body)
	for !s.Empty() {
		var alg, params cryptobyte.String
		var oid asn1.ObjectIdentifier
		var tag cbasn1.Tag
		if !s.ReadASN1(&alg, cbasn1.SEQUENCE) || !alg.ReadASN1ObjectIdentifier(&oid) {
			return false
		}
		if !alg.Empty() && (!alg.ReadAnyASN1(&params, &tag) || !alg.Empty()) {
			return false
		}
	}
	return true
}

// validOID reports whether body is the contents of an OBJECT IDENTIFIER
// as encoding/asn1 reads one: at least one subidentifier, each minimally
// encoded in at most five octets and at most 2^31-1.
func validOID(body []byte) bool {
	if len(body) == 0 {
		return false
	}
	for len(body) > 0 {
		n, ok := subidentifierLen(body)
		if !ok {
			return false
		}
		body = body[n:]
	}
	return true
}

// subidentifierLen returns the length of the base-128 subidentifier body
// starts with and whether it is valid.
func subidentifierLen(body []byte) (int, bool) {
	if body[0] == 0x80 {
		return 0, false
	}
	var v int64
	for i, b := range body {
		if i == 5 {
			return 0, false
		}
		v = v<<7 | int64(b&0x7f)
		if b&0x80 == 0 {
			return i + 1, v <= 1<<31-1
		}
	}
	return 0, false
}
