package benchkit

import "flag"

// StreamsFlag defines -streams, the comma-separated numbers of concurrent
// streams a benchmark holds, defaulting to 1000.
func StreamsFlag() *string {
	return flag.String("streams", "1000", "comma-separated numbers of concurrent streams to hold")
}

// HeapProfileFlag defines -heapprofile with the benchmark's own usage: where
// it writes an in-use heap profile (pprof).
func HeapProfileFlag(usage string) *string {
	return flag.String("heapprofile", "", usage)
}
