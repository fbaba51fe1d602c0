// Package watch adds event handlers to the informers of the endpoint's cache
// for a component that runs until its context ends, and removes them when it
// stops, so that a stopped component leaves no handler behind.
package watch

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Informers gets the informer of an object's kind (controller-runtime's
// cache.Informers, and xds.Informers, have this method).
type Informers interface {
	GetInformer(ctx context.Context, obj client.Object, opts ...crcache.InformerGetOption) (crcache.Informer, error)
}

// Handlers are the event handlers a component added. The zero value is
// ready to use; it is not safe for concurrent use.
type Handlers struct {
	added []added
}

type added struct {
	inf crcache.Informer
	reg toolscache.ResourceEventHandlerRegistration
}

// Add adds h to the informer of obj's kind in c.
func (hs *Handlers) Add(ctx context.Context, c Informers, obj client.Object, h toolscache.ResourceEventHandler) error {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("watch %T: %w", obj, err)
	}
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		return fmt.Errorf("watch %T: %w", obj, err)
	}
	hs.added = append(hs.added, added{inf, reg})
	return nil
}

// RemoveAll removes every handler added.
func (hs *Handlers) RemoveAll() {
	for _, a := range hs.added {
		_ = a.inf.RemoveEventHandler(a.reg)
	}
	hs.added = nil
}

// Deleted is the object of a delete notification, a tombstone's
// (DeletedFinalStateUnknown) included; nil when it is not an object.
func Deleted(obj any) client.Object {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, _ := obj.(client.Object)
	return o
}
