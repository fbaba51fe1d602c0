package testenv

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A Restartable control plane keeps its data, address and credentials
// across restarts of etcd and of the API server.
func TestRestartableKeepsDataAndCredentials(t *testing.T) {
	e, err := Start(Options{Restartable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	}()
	ctx := t.Context()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if err := e.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	get := func() error {
		got := &corev1.ConfigMap{}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
			return err
		}
		if got.Data["k"] != "v" {
			t.Fatalf("data after restart: %v", got.Data)
		}
		return nil
	}
	eventually := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for {
			err := get()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	if err := e.StopEtcd(); err != nil {
		t.Fatal(err)
	}
	if err := e.StartEtcd(); err != nil {
		t.Fatal(err)
	}
	eventually("after the etcd restart")

	if err := e.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := get(); err == nil {
		t.Fatal("the API server answered while stopped")
	}
	if err := e.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	eventually("after the API server restart")
}
