package benchkit

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
)

// Flags are the flags the benchmarks holding streams share.
type Flags struct {
	// Streams is -streams: the comma-separated numbers of concurrent
	// streams to hold (default 1000).
	Streams *string
	// JSON is benchjson's -json: where to write the figures.
	JSON *string
	// HeapProfile is -heapprofile: where to write an in-use heap profile.
	HeapProfile *string
}

// StreamFlags defines -streams, -json and -heapprofile, the last with the
// benchmark's own usage (what its profile holds).
func StreamFlags(heapUsage string) Flags {
	return Flags{
		Streams:     flag.String("streams", "1000", "comma-separated numbers of concurrent streams to hold"),
		JSON:        benchjson.Flag(),
		HeapProfile: flag.String("heapprofile", "", heapUsage),
	}
}

// Counts parses value, the comma-separated positive counts of flag name.
func Counts(name, value string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(value, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive count", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}
