package benchkit

import (
	"slices"
	"testing"
)

func TestCounts(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    []int
		wantErr bool
	}{
		{name: "one", value: "1000", want: []int{1000}},
		{name: "several with spaces", value: "1000, 10000", want: []int{1000, 10000}},
		{name: "zero", value: "0", wantErr: true},
		{name: "negative", value: "5,-1", wantErr: true},
		{name: "not a number", value: "1k", wantErr: true},
		{name: "empty", value: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Counts("streams", tt.value)
			if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
				t.Errorf("Counts(%q) = %v, %v; want %v, error %v", tt.value, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
