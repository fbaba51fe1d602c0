package vm

import "testing"

func TestIP(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    *VM
		want string
	}{
		{"declared by the agent", &VM{settings: Settings{Address: "127.0.1.50"}}, "127.0.1.50"},
		{"proven by the platform", &VM{PlatformIP: "127.0.1.61"}, "127.0.1.61"},
		{"declared wins over the platform's", &VM{PlatformIP: "127.0.1.61", settings: Settings{Address: "127.0.1.50"}}, "127.0.1.50"},
		{"none", &VM{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.v.IP(); got != tc.want {
				t.Errorf("IP() = %q, want %q", got, tc.want)
			}
		})
	}
}
