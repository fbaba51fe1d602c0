// Package translate holds benchmarks of Embark's Sidecar translation
// (translate.Translate): time and allocations to compute one workload's
// configuration when its Sidecar's egress "*/*" selects 100 or 1,000
// Services (each with an EndpointSlice of three pods), next to two
// baselines measured in the same run on the same resources: deep-copying
// them (proto.Clone) and building a go-control-plane snapshot of them
// (cache.NewSnapshot + Consistent), the work serving does anyway.
//
// Run with: go test -run='^$' -bench=. -benchmem ./benchmarks/translate/
package translate
