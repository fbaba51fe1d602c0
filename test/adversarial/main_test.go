package adversarial

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"

	"github.com/embark-mesh/embark/test/testenv"
)

// env is the package's real control plane (kube-apiserver + etcd with the
// garbage collector), shared by every attack; attacks isolate themselves by
// namespace.
var env *testenv.Env

var (
	attacksMu sync.Mutex
	attacks   = map[string]bool{} // attack -> refused
)

// Attack records that t tries the attack described by what; the attack
// counts as refused when t passes.
func Attack(t *testing.T, what string) {
	t.Helper()
	attacksMu.Lock()
	if _, dup := attacks[what]; dup {
		attacksMu.Unlock()
		t.Fatalf("attack %q is recorded twice", what)
	}
	attacks[what] = false
	attacksMu.Unlock()
	t.Cleanup(func() {
		attacksMu.Lock()
		defer attacksMu.Unlock()
		attacks[what] = !t.Failed()
	})
}

func TestMain(m *testing.M) {
	code := testenv.Run(m, testenv.Options{GarbageCollector: true}, &env)
	if !testenv.Fuzzing() {
		attacksMu.Lock()
		names := make([]string, 0, len(attacks))
		refused := 0
		for name, ok := range attacks {
			names = append(names, name)
			if ok {
				refused++
			}
		}
		sort.Strings(names)
		for _, name := range names {
			verdict := "refused"
			if !attacks[name] {
				verdict = "NOT REFUSED"
			}
			fmt.Printf("adversarial: %-7s %s\n", verdict, name)
		}
		fmt.Printf("adversarial: %d attacks tried, %d refused\n", len(attacks), refused)
		attacksMu.Unlock()
	}
	os.Exit(code)
}
