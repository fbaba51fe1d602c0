package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	jose "github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"

	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifications/s")
}

// BenchmarkBaselineRSA2048PKCS1v15Verify is the floor every RSA-2048
// verification stands on: one PKCS#1 v1.5 SHA-256 signature check of a
// precomputed digest.
func BenchmarkBaselineRSA2048PKCS1v15Verify(b *testing.B) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		b.Fatal(err)
	}
	digest := sha256.Sum256([]byte("instance identity document"))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := rsa.VerifyPKCS1v15(&key.PublicKey, crypto.SHA256, digest[:], sig); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b)
}

func ec2Fixture(b *testing.B) (*awsid.Verifier, awsid.Credential) {
	b.Helper()
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		b.Fatal(err)
	}
	doc := awstest.Instance{}.Document()
	sig, err := ca.Sign(doc)
	if err != nil {
		b.Fatal(err)
	}
	v, err := awsid.NewVerifier("bench.example.com", awsid.WithAdditionalCertificates(map[string]*x509.Certificate{"us-east-2": ca.Certificate}))
	if err != nil {
		b.Fatal(err)
	}
	return v, awsid.Credential{Document: doc, Signature: sig}
}

// BenchmarkEC2DocumentVerify is one full verification of an instance
// identity document and its rsa2048 signature (base64 decoding, BER/DER
// parsing, content comparison, JSON parsing, one RSA-2048 verification).
func BenchmarkEC2DocumentVerify(b *testing.B) {
	v, cred := ec2Fixture(b)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, cred); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b)
}

// BenchmarkEC2DocumentVerifyParallel is the same on all GOMAXPROCS cores.
func BenchmarkEC2DocumentVerifyParallel(b *testing.B) {
	v, cred := ec2Fixture(b)
	ctx := b.Context()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Verify(ctx, cred); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b)
}

// BenchmarkEC2DocumentAndSTSVerify adds the STS proof: the signed request
// is checked and forwarded over loopback HTTP to the fake STS, which checks
// its SigV4 signature. The replay cache is off so one signed request can be
// reused (it stays fresh for the benchmark's duration).
func BenchmarkEC2DocumentAndSTSVerify(b *testing.B) {
	env := awstest.Start(b, awstest.Instance{Role: "bench-role"})
	imdsClient := imds.New(imds.Options{Endpoint: env.IMDS.URL})
	stsClient := client.NewSTSClient(imdsClient, "us-east-2", func(o *sts.Options) { o.BaseEndpoint = &env.STS.URL })
	cred, err := client.Credential(b.Context(), imdsClient, stsClient, "bench.example.com")
	if err != nil {
		b.Fatal(err)
	}
	v, err := awsid.NewVerifier("bench.example.com",
		awsid.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": env.CA.Certificate}),
		awsid.WithSTSEndpoint(env.STS.URL), awsid.WithReplayCacheSize(0))
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, *cred); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b)
}

// BenchmarkJWTVerify verifies a token per algorithm family with an inline
// JWKS. The same token is verified again and again, so the issuer accepts
// tokens without a jti here: the replay check every real onboarding also
// makes (one insertion into an in-memory set) is not in this figure.
func BenchmarkJWTVerify(b *testing.B) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		b.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	keys := []struct {
		alg jose.SignatureAlgorithm
		kid string
		key crypto.Signer
	}{
		{jose.RS256, "rsa", rsaKey},
		{jose.ES256, "ec", ecKey},
		{jose.EdDSA, "ed", edKey},
	}
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.key.Public(), KeyID: k.kid, Use: "sig"})
	}
	jwksJSON, err := json.Marshal(set)
	if err != nil {
		b.Fatal(err)
	}
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{{
		Issuer: "https://idp.example.com", ShortName: "corp", Audiences: []string{"embark"}, JWKS: jwksJSON,
		Attributes: map[string]string{"region": "custom.region"}, AllowTokensWithoutJTI: true,
	}})
	if err != nil {
		b.Fatal(err)
	}
	claims := josejwt.Claims{
		Issuer: "https://idp.example.com", Subject: "vm-1.example.com", Audience: josejwt.Audience{"embark"},
		Expiry: josejwt.NewNumericDate(time.Now().Add(time.Hour)), IssuedAt: josejwt.NewNumericDate(time.Now()),
	}
	for _, k := range keys {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: k.alg, Key: jose.JSONWebKey{Key: k.key, KeyID: k.kid}}, (&jose.SignerOptions{}).WithType("JWT"))
		if err != nil {
			b.Fatal(err)
		}
		token, err := josejwt.Signed(signer).Claims(claims).Claims(map[string]any{"custom": map[string]any{"region": "eu"}}).Serialize()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(k.alg), func(b *testing.B) {
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, token); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b)
		})
	}
}
