package configsource

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(ns, name, rv string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
}

func TestDebouncerWaitsForQuietAndAtMostMax(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tests := []struct {
		name     string
		adds     []int // ms of each change
		at       int   // ms when asked
		wantWait time.Duration
		wantDue  bool
	}{
		{name: "nothing pending", adds: nil, at: 500},
		{name: "just changed", adds: []int{0}, at: 0, wantWait: 100 * time.Millisecond},
		{name: "quiet long enough", adds: []int{0}, at: 100, wantDue: true},
		{name: "a later change restarts the quiet period", adds: []int{0, 60}, at: 100, wantWait: 60 * time.Millisecond},
		{name: "constant changes wait at most 10x", adds: []int{0, 90, 180, 270, 360, 450, 540, 630, 720, 810, 900, 990}, at: 1000, wantDue: true},
		{name: "constant changes before the max", adds: []int{0, 90, 180, 270, 360, 450, 540, 630, 720, 810, 900}, at: 950, wantWait: 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDebouncer(100 * time.Millisecond)
			for i, a := range tt.adds {
				d.add("svc", svc("ns", "s", "1"), svc("ns", "s", string(rune('2'+i))), ms(a))
			}
			wait, pending := d.wait(ms(tt.at))
			if pending != (len(tt.adds) > 0) {
				t.Fatalf("pending = %v with %d changes", pending, len(tt.adds))
			}
			if due := pending && wait == 0; due != tt.wantDue || (!tt.wantDue && wait != tt.wantWait) {
				t.Errorf("wait(%dms) = %v (due %v), want %v (due %v)", tt.at, wait, due, tt.wantWait, tt.wantDue)
			}
		})
	}
}

func TestDebouncerMergesChangesOfOneObject(t *testing.T) {
	d := newDebouncer(100 * time.Millisecond)
	t0 := time.Unix(1000, 0)
	d.add("svc", nil, svc("a", "x", "1"), t0)                                      // created
	d.add("svc", svc("a", "x", "1"), svc("a", "x", "2"), t0.Add(time.Millisecond)) // updated
	d.add("svc", svc("b", "x", "5"), nil, t0.Add(2*time.Millisecond))              // another deleted
	d.add("svc", nil, svc("c", "y", "1"), t0.Add(3*time.Millisecond))
	d.add("svc", svc("c", "y", "1"), nil, t0.Add(4*time.Millisecond)) // created and deleted
	changes, first := d.take()
	if !first.Equal(t0) {
		t.Errorf("batch started %v, want %v", first, t0)
	}
	if len(changes) != 3 {
		t.Fatalf("%d changes, want 3 (one per object): %v", len(changes), changes)
	}
	got := map[string]change{}
	for _, c := range changes {
		if o := c.object(); o != nil {
			got[o.GetNamespace()+"/"+o.GetName()] = c
		}
	}
	if c := got["a/x"]; c.old != nil || c.new.GetResourceVersion() != "2" {
		t.Errorf("a/x: old %v new %v, want created at version 2", c.old, c.new)
	}
	if c := got["b/x"]; c.new != nil || c.old.GetResourceVersion() != "5" {
		t.Errorf("b/x: want deleted")
	}
	if _, ok := got["c/y"]; ok || len(got) != 2 {
		t.Errorf("c/y was created and deleted in the batch: its change must have no object; got %v", got)
	}
	if _, pending := d.wait(t0.Add(time.Hour)); pending {
		t.Error("take left changes pending")
	}
}
