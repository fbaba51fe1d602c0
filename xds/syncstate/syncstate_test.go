package syncstate

import (
	"testing"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

func TestConfigs(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name        string
		do          func(*Types)
		wantListen  statusv3.ConfigStatus
		wantVersion string
	}{
		{name: "never sent", do: func(*Types) {}, wantListen: statusv3.ConfigStatus_NOT_SENT},
		{name: "subscribed, not sent", do: func(ts *Types) { ts.Requested(resource.ListenerType, "", false, now) }, wantListen: statusv3.ConfigStatus_NOT_SENT},
		{name: "sent, not answered", do: func(ts *Types) { ts.Sent(resource.ListenerType, "n1", "v1", now) }, wantListen: statusv3.ConfigStatus_STALE, wantVersion: "v1"},
		{name: "acknowledged", do: func(ts *Types) {
			ts.Sent(resource.ListenerType, "n1", "v1", now)
			ts.Requested(resource.ListenerType, "n1", false, now)
		}, wantListen: statusv3.ConfigStatus_SYNCED, wantVersion: "v1"},
		{name: "refused", do: func(ts *Types) {
			ts.Sent(resource.ListenerType, "n1", "v1", now)
			ts.Requested(resource.ListenerType, "n1", true, now)
		}, wantListen: statusv3.ConfigStatus_ERROR, wantVersion: "v1"},
		{name: "an answer to an older response changes nothing", do: func(ts *Types) {
			ts.Sent(resource.ListenerType, "n1", "v1", now)
			ts.Requested(resource.ListenerType, "n1", false, now)
			ts.Sent(resource.ListenerType, "n2", "v2", now)
			ts.Requested(resource.ListenerType, "n1", true, now)
		}, wantListen: statusv3.ConfigStatus_STALE, wantVersion: "v2"},
		{name: "a new response clears a refusal", do: func(ts *Types) {
			ts.Sent(resource.ListenerType, "n1", "v1", now)
			ts.Requested(resource.ListenerType, "n1", true, now)
			ts.Sent(resource.ListenerType, "n2", "v2", now)
		}, wantListen: statusv3.ConfigStatus_STALE, wantVersion: "v2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ts Types
			tt.do(&ts)
			configs := ts.Configs()
			seen := map[string]*statusv3.ClientConfig_GenericXdsConfig{}
			for i, c := range configs {
				if i > 0 && configs[i-1].TypeUrl >= c.TypeUrl {
					t.Fatalf("configs not sorted: %s before %s", configs[i-1].TypeUrl, c.TypeUrl)
				}
				seen[c.TypeUrl] = c
			}
			for _, core := range coreTypes {
				if seen[core] == nil {
					t.Fatalf("core type %s not reported", core)
				}
			}
			l := seen[resource.ListenerType]
			if l.ConfigStatus != tt.wantListen || l.VersionInfo != tt.wantVersion {
				t.Fatalf("listeners: %s %q, want %s %q", l.ConfigStatus, l.VersionInfo, tt.wantListen, tt.wantVersion)
			}
			if c := seen[resource.ClusterType]; c.ConfigStatus != statusv3.ConfigStatus_NOT_SENT {
				t.Fatalf("clusters never sent: %s", c.ConfigStatus)
			}
		})
	}
}

func TestRequestedReturnsTheRefusedVersion(t *testing.T) {
	var ts Types
	now := time.Now()
	ts.Sent(resource.ClusterType, "n1", "v1", now)
	if v, nack := ts.Requested(resource.ClusterType, "n1", true, now); !nack || v != "v1" {
		t.Fatalf("Requested NACK of n1 = %q, %v; want v1, true", v, nack)
	}
	if v, nack := ts.Requested(resource.ClusterType, "n0", true, now); nack || v != "" {
		t.Fatalf("Requested NACK of an older nonce = %q, %v; want nothing", v, nack)
	}
}
