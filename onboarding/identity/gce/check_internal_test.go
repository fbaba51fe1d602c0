package gce

import (
	"net/netip"
	"testing"
)

// FuzzParseInstance feeds arbitrary Compute API answers to ParseInstance:
// it refuses or returns an instance whose ID and name have their formats
// and whose address, when set, is a canonical IPv4 address; never panics.
func FuzzParseInstance(f *testing.F) {
	f.Add([]byte(`{"id":"5180367924151823417","name":"ratings-1","status":"RUNNING","networkInterfaces":[{"name":"nic0","networkIP":"10.128.0.7"}]}`))
	f.Add([]byte(`{"id":42,"name":"a","status":"STAGING","networkInterfaces":[{"name":"nic1","networkIP":"10.9.0.1"},{"name":"nic0","networkIP":"010.1.1.1"}]}`))
	f.Add([]byte(`{"id":"1","name":"a","status":"RUNNING","networkInterfaces":[{}]}`))
	f.Add([]byte(`{"id":"\u0031","name":"a","status":"x"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParseInstance(body)
		if err != nil {
			return
		}
		if !instanceIDRE.MatchString(got.ID) || !instanceNameRE.MatchString(got.Name) || got.Status == "" {
			t.Fatalf("accepted a malformed instance: %+v", got)
		}
		if got.NetworkIP != "" {
			ip, err := netip.ParseAddr(got.NetworkIP)
			if err != nil || !ip.Is4() || ip.String() != got.NetworkIP {
				t.Fatalf("address %q is not a canonical IPv4 address", got.NetworkIP)
			}
		}
	})
}
