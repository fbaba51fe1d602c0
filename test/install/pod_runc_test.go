//go:build install

package install

import (
	"reflect"
	"testing"
)

// runc's default spec becomes the container: process, user and groups, no
// capabilities but those added, read-only root, the bind mounts, and the
// Pod's network namespace instead of a new one.
func TestRuncSpec(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"process": map[string]any{"terminal": true, "args": []any{"sh"}, "rlimits": []any{}},
			"root":    map[string]any{"path": "rootfs"},
			"mounts":  []any{map[string]any{"destination": "/proc", "type": "proc"}},
			"linux":   map[string]any{"namespaces": []any{map[string]any{"type": "pid"}, map[string]any{"type": "network"}}},
		}
	}
	rt := &podRuntime{Args: []string{"/ep", "--x"}, Env: []string{"A=1"}, Cwd: "/", UID: 65532, GID: 65532, ExtraGIDs: []int64{65532},
		ReadOnlyRoot: true, NoNewPrivileges: true, Mounts: []mount{{Source: "/v/cfg", Destination: "/etc/ep", ReadOnly: true}, {Source: "/v/tmp", Destination: "/tmp"}}}
	got, err := runcSpec(base(), rt, "/b/rootfs", "/var/run/netns/embark-pod")
	if err != nil {
		t.Fatal(err)
	}
	p := got["process"].(map[string]any)
	if p["terminal"] != false || !reflect.DeepEqual(p["args"], rt.Args) || !reflect.DeepEqual(p["env"], rt.Env) || p["noNewPrivileges"] != true {
		t.Errorf("process %v", p)
	}
	if _, ok := p["rlimits"]; ok {
		t.Errorf("runc's default rlimits kept: %v", p["rlimits"])
	}
	if want := map[string]any{"uid": int64(65532), "gid": int64(65532), "additionalGids": []int64{65532}}; !reflect.DeepEqual(p["user"], want) {
		t.Errorf("user %v, want %v", p["user"], want)
	}
	if want := map[string]any{"bounding": []string{}, "effective": []string{}, "permitted": []string{}}; !reflect.DeepEqual(p["capabilities"], want) {
		t.Errorf("capabilities %v, want none", p["capabilities"])
	}
	if want := map[string]any{"path": "/b/rootfs", "readonly": true}; !reflect.DeepEqual(got["root"], want) {
		t.Errorf("root %v, want %v", got["root"], want)
	}
	wantMounts := []any{
		map[string]any{"destination": "/proc", "type": "proc"},
		map[string]any{"destination": "/etc/ep", "type": "bind", "source": "/v/cfg", "options": []string{"rbind", "nosuid", "nodev", "ro"}},
		map[string]any{"destination": "/tmp", "type": "bind", "source": "/v/tmp", "options": []string{"rbind", "nosuid", "nodev"}},
	}
	if !reflect.DeepEqual(got["mounts"], wantMounts) {
		t.Errorf("mounts %v, want %v", got["mounts"], wantMounts)
	}
	wantNS := []any{map[string]any{"type": "pid"}, map[string]any{"type": "network", "path": "/var/run/netns/embark-pod"}}
	if ns := got["linux"].(map[string]any)["namespaces"]; !reflect.DeepEqual(ns, wantNS) {
		t.Errorf("namespaces %v, want %v", ns, wantNS)
	}
}
