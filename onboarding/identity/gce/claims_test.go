package gce

import (
	"testing"
)

// FuzzParseIdentity feeds arbitrary claim values to parseIdentity: it
// refuses or returns an identity whose every field has its claim's format,
// never panics.
func FuzzParseIdentity(f *testing.F) {
	f.Add("embark-test", "123456789012", "us-central1-a", "5180367924151823417", "ratings-1", "1700000000", "sa@p.iam.gserviceaccount.com", "true")
	f.Add("", "", "", "", "", "", "", "")
	f.Add("a", "-1", "zone", "x", "Name", "99999999999999999999", "x@", "TRUE")
	f.Fuzz(func(t *testing.T, project, number, zone, id, name, created, email, verified string) {
		got, err := parseIdentity(map[string]string{
			attrProjectID: project, attrProjectNumber: number, attrZone: zone, attrInstanceID: id,
			attrInstanceName: name, attrCreation: created, attrEmail: email, attrEmailVerified: verified, attrIssuedAt: "1700000000",
		})
		if err != nil {
			return
		}
		if !projectIDRE.MatchString(got.ProjectID) || !zoneRE.MatchString(got.Zone) || !instanceIDRE.MatchString(got.InstanceID) ||
			!instanceNameRE.MatchString(got.InstanceName) || !emailRE.MatchString(got.ServiceAccount) || verified != "true" {
			t.Fatalf("accepted malformed claims: %+v", got)
		}
	})
}
