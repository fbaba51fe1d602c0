//go:build install

package install

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var testMeta = podMeta{Name: "ep-0", Namespace: "istio-system", PodIP: "10.203.0.2", HostIP: "10.203.0.1", NodeName: "node-a"}

var testSources = podSources{
	ConfigMaps: map[string]*corev1.ConfigMap{
		"cfg": {ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"config.yaml": "a: 1\n", "other": "x"}},
	},
	Secrets: map[string]*corev1.Secret{
		"tls": {ObjectMeta: metav1.ObjectMeta{Name: "tls"}, Data: map[string][]byte{"tls.crt": []byte("CERT"), "ca.crt": []byte("CA")}},
	},
	Token: []byte("TOKEN"), CA: []byte("APISERVER-CA"),
	Hosts: map[string]string{"istiod.istio-system.svc": "10.203.0.1"},
}

// testPod is a Pod spec like the chart's: pod security context, one
// container dropping every capability.
func testPod(mutate func(*corev1.PodSpec)) *corev1.PodSpec {
	spec := &corev1.PodSpec{
		ServiceAccountName: "ep",
		SecurityContext:    &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532), RunAsNonRoot: ptr.To(true)},
		Containers: []corev1.Container{{
			Name: "ep", Args: []string{"--config=/etc/ep/config.yaml"},
			SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("512Mi")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			},
			Ports: []corev1.ContainerPort{{Name: "http-metrics", ContainerPort: 15014}},
		}},
	}
	if mutate != nil {
		mutate(spec)
	}
	return spec
}

var testImage = imageConfig{User: "1000:1000", Entrypoint: []string{"/usr/local/bin/ep"}, Env: []string{"PATH=/usr/local/bin"}, WorkingDir: "/"}

func withEnv(e ...corev1.EnvVar) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) { s.Containers[0].Env = append(s.Containers[0].Env, e...) }
}

// Each volume kind the stand-in supports is written as the kubelet
// writes it (files, modes, group, read-only); another kind, or a missing
// object that is not optional, is an error naming it.
func TestKubeletVolumes(t *testing.T) {
	type file struct {
		path, data string
		mode       os.FileMode
	}
	tests := []struct {
		name      string
		volume    corev1.Volume
		mount     corev1.VolumeMount
		wantFiles []file
		wantRO    bool
		wantErr   string
	}{
		{name: "configMap, every key, group-readable for fsGroup",
			volume:    corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
			mount:     corev1.VolumeMount{Name: "c", MountPath: "/etc/ep"},
			wantFiles: []file{{"config.yaml", "a: 1\n", 0o644}, {"other", "x", 0o644}}, wantRO: true},
		{name: "configMap items with a mode",
			volume: corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"},
				Items: []corev1.KeyToPath{{Key: "config.yaml", Path: "sub/c.yaml", Mode: ptr.To[int32](0o600)}}}}},
			mount:     corev1.VolumeMount{Name: "c", MountPath: "/etc/ep"},
			wantFiles: []file{{"sub/c.yaml", "a: 1\n", 0o640}}, wantRO: true},
		{name: "configMap missing",
			volume:  corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}}}},
			mount:   corev1.VolumeMount{Name: "c", MountPath: "/etc/ep"},
			wantErr: `volume c: configmap "nope" not found`},
		{name: "configMap missing, optional: empty",
			volume: corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Optional: ptr.To(true)}}},
			mount:  corev1.VolumeMount{Name: "c", MountPath: "/etc/ep"}, wantRO: true},
		{name: "secret item, defaultMode 0400 made group-readable",
			volume: corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls", DefaultMode: ptr.To[int32](0o400),
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}}},
			mount:     corev1.VolumeMount{Name: "s", MountPath: "/etc/roots", ReadOnly: true},
			wantFiles: []file{{"ca.crt", "CA", 0o440}}, wantRO: true},
		{name: "secret item key missing",
			volume: corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls",
				Items: []corev1.KeyToPath{{Key: "tls.key", Path: "k"}}}}},
			mount:   corev1.VolumeMount{Name: "s", MountPath: "/etc/roots"},
			wantErr: `volume s: key "tls.key" not found`},
		{name: "secret item path escaping the volume",
			volume: corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls",
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "../ca.crt"}}}}},
			mount:   corev1.VolumeMount{Name: "s", MountPath: "/etc/roots"},
			wantErr: `not a relative path within the volume`},
		{name: "emptyDir, writable",
			volume: corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			mount:  corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}},
		{name: "emptyDir in memory",
			volume:  corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
			mount:   corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"},
			wantErr: `emptyDir medium "Memory" is not supported`},
		{name: "hostPath",
			volume: corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}},
			mount:  corev1.VolumeMount{Name: "h", MountPath: "/host-etc", ReadOnly: true}, wantRO: true},
		{name: "persistentVolumeClaim: not supported",
			volume:  corev1.Volume{Name: "p", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
			mount:   corev1.VolumeMount{Name: "p", MountPath: "/data"},
			wantErr: "volume p: a volume kind the kubelet stand-in does not support"},
		{name: "subPath: not supported",
			volume:  corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
			mount:   corev1.VolumeMount{Name: "c", MountPath: "/etc/ep/config.yaml", SubPath: "config.yaml"},
			wantErr: "subPath is not supported"},
		{name: "mount of no volume",
			mount:   corev1.VolumeMount{Name: "ghost", MountPath: "/x"},
			wantErr: "volumeMount ghost: no volume of that name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := testPod(func(s *corev1.PodSpec) {
				if tc.volume.Name != "" {
					s.Volumes = append(s.Volumes, tc.volume)
				}
				s.Containers[0].VolumeMounts = append(s.Containers[0].VolumeMounts, tc.mount)
			})
			rt, err := materialize(spec, "ep", testMeta, testImage, testSources, t.TempDir())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := findMount(t, rt, tc.mount.MountPath)
			if m.ReadOnly != tc.wantRO {
				t.Errorf("mount %s read-only %v, want %v", m.Destination, m.ReadOnly, tc.wantRO)
			}
			if tc.volume.EmptyDir != nil {
				if fi, err := os.Stat(m.Source); err != nil || fi.Mode().Perm() != 0o777 {
					t.Errorf("emptyDir %s: %v %v, want a 0777 directory", m.Source, fi, err)
				}
			}
			if tc.volume.HostPath != nil && m.Source != tc.volume.HostPath.Path {
				t.Errorf("hostPath mounted from %s, want %s", m.Source, tc.volume.HostPath.Path)
			}
			var got []string
			_ = filepath.WalkDir(m.Source, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && tc.volume.HostPath == nil {
					rel, _ := filepath.Rel(m.Source, p)
					got = append(got, rel)
				}
				return nil
			})
			var want []string
			for _, f := range tc.wantFiles {
				want = append(want, f.path)
				p := filepath.Join(m.Source, f.path)
				data, err := os.ReadFile(p)
				if err != nil || string(data) != f.data {
					t.Errorf("%s: %q %v, want %q", f.path, data, err, f.data)
				}
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != f.mode {
					t.Errorf("%s mode %v, want %v", f.path, fi.Mode().Perm(), f.mode)
				}
				if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != 65532 {
					t.Errorf("%s group %d, want the fsGroup 65532", f.path, gid)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("volume files %v, want %v", got, want)
			}
		})
	}
}

func findMount(t *testing.T, rt *podRuntime, dest string) mount {
	t.Helper()
	for _, m := range rt.Mounts {
		if m.Destination == dest {
			return m
		}
	}
	t.Fatalf("no mount at %s in %+v", dest, rt.Mounts)
	return mount{}
}

// The service account token is mounted as the kubelet does by default,
// not when the Pod turns it off; /etc/hosts carries the Pod's name and
// the cluster DNS stand-in's names.
func TestKubeletDefaultMounts(t *testing.T) {
	rt, err := materialize(testPod(nil), "ep", testMeta, testImage, testSources, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sa := findMount(t, rt, serviceAccountDir)
	for name, want := range map[string]string{"token": "TOKEN", "ca.crt": "APISERVER-CA", "namespace": "istio-system"} {
		if got, err := os.ReadFile(filepath.Join(sa.Source, name)); err != nil || string(got) != want {
			t.Errorf("service account %s: %q %v, want %q", name, got, err, want)
		}
	}
	hosts, err := os.ReadFile(findMount(t, rt, "/etc/hosts").Source)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10.203.0.2\tep-0\n", "10.203.0.1\tistiod.istio-system.svc\n", "127.0.0.1\tlocalhost\n"} {
		if !strings.Contains(string(hosts), want) {
			t.Errorf("/etc/hosts lacks %q:\n%s", want, hosts)
		}
	}
	off := testPod(func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = ptr.To(false) })
	rt, err = materialize(off, "ep", testMeta, testImage, testSources, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rt.Mounts {
		if m.Destination == serviceAccountDir {
			t.Errorf("automountServiceAccountToken false, and the token is mounted")
		}
	}
}

// Each env kind the stand-in supports resolves as the kubelet resolves
// it; another kind, or a reference to nothing that is not optional, is an
// error naming the variable.
func TestKubeletEnv(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*corev1.PodSpec)
		want    []string
		wantErr string
	}{
		{name: "value", mutate: withEnv(corev1.EnvVar{Name: "A", Value: "1"}), want: []string{"A=1"}},
		{name: "fieldRef", mutate: withEnv(
			corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			corev1.EnvVar{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			corev1.EnvVar{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			corev1.EnvVar{Name: "SA", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.serviceAccountName"}}}),
			want: []string{"POD_NAME=ep-0", "NS=istio-system", "IP=10.203.0.2", "SA=ep"}},
		{name: "fieldRef not supported", mutate: withEnv(corev1.EnvVar{Name: "L", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}}),
			wantErr: `env L: fieldRef "metadata.labels['app']": not supported`},
		{name: "resourceFieldRef rounds cpu up, divides memory", mutate: withEnv(
			corev1.EnvVar{Name: "GOMAXPROCS", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
			corev1.EnvVar{Name: "REQ_MCPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: resource.MustParse("1m")}}},
			corev1.EnvVar{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}}),
			want: []string{"GOMAXPROCS=2", "REQ_MCPU=100", "MEM_MI=512"}},
		{name: "resourceFieldRef of a limit not set", mutate: withEnv(corev1.EnvVar{Name: "E", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.ephemeral-storage"}}}),
			wantErr: `env E: resourceFieldRef "limits.ephemeral-storage": the container sets none`},
		{name: "configMapKeyRef and secretKeyRef", mutate: withEnv(
			corev1.EnvVar{Name: "C", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "other"}}},
			corev1.EnvVar{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "tls"}, Key: "ca.crt"}}}),
			want: []string{"C=x", "S=CA"}},
		{name: "optional reference missing: left out", mutate: withEnv(
			corev1.EnvVar{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "tls"}, Key: "nope", Optional: ptr.To(true)}}}),
			want: nil},
		{name: "secretKeyRef missing", mutate: withEnv(
			corev1.EnvVar{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "gone"}, Key: "k"}}}),
			wantErr: `env S: secretKeyRef: key "k" of secret "gone" not found`},
		{name: "envFrom with a prefix, env wins", mutate: func(s *corev1.PodSpec) {
			s.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
			s.Containers[0].Env = []corev1.EnvVar{{Name: "CFG_other", Value: "mine"}}
		}, want: []string{"CFG_config.yaml=a: 1\n", "CFG_other=mine"}},
		{name: "envFrom missing", mutate: func(s *corev1.PodSpec) {
			s.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gone"}}}}
		}, wantErr: `envFrom: secret "gone" not found`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := materialize(testPod(tc.mutate), "ep", testMeta, testImage, testSources, t.TempDir())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := append([]string{"PATH=/usr/local/bin"}, tc.want...)
			if !slices.Equal(rt.Env, want) {
				t.Errorf("env %q, want %q", rt.Env, want)
			}
		})
	}
}

// The process: command and args over the image's, user and groups from
// the security contexts over the image's, the container's own settings.
func TestKubeletProcess(t *testing.T) {
	tests := []struct {
		name          string
		mutate        func(*corev1.PodSpec)
		image         imageConfig
		wantArgs      []string
		wantUID       int64
		wantGID       int64
		wantExtraGIDs []int64
		wantErr       string
	}{
		{name: "the chart's shape", image: testImage, wantArgs: []string{"/usr/local/bin/ep", "--config=/etc/ep/config.yaml"},
			wantUID: 65532, wantGID: 65532, wantExtraGIDs: []int64{65532}},
		{name: "container user wins, command replaces the entrypoint", image: testImage,
			mutate: func(s *corev1.PodSpec) {
				s.Containers[0].SecurityContext.RunAsUser = ptr.To[int64](4000)
				s.Containers[0].Command = []string{"/bin/other"}
				s.Containers[0].Args = nil
			},
			wantArgs: []string{"/bin/other"}, wantUID: 4000, wantGID: 65532, wantExtraGIDs: []int64{65532}},
		{name: "image user when none is set", image: imageConfig{User: "1000:2000", Entrypoint: []string{"/ep"}, Cmd: []string{"--default"}},
			mutate:   func(s *corev1.PodSpec) { s.SecurityContext = nil; s.Containers[0].Args = nil },
			wantArgs: []string{"/ep", "--default"}, wantUID: 1000, wantGID: 2000},
		{name: "runAsNonRoot with root", image: imageConfig{Entrypoint: []string{"/ep"}},
			mutate:  func(s *corev1.PodSpec) { s.SecurityContext.RunAsUser = nil },
			wantErr: "runAsNonRoot and the user is root"},
		{name: "capabilities not all dropped", image: testImage,
			mutate: func(s *corev1.PodSpec) {
				s.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}
			},
			wantErr: "only drop [ALL] is supported"},
		{name: "no command at all", image: imageConfig{User: "1:1"},
			mutate:  func(s *corev1.PodSpec) { s.Containers[0].Args = nil },
			wantErr: "no command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := materialize(testPod(tc.mutate), "ep", testMeta, tc.image, testSources, t.TempDir())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rt.Args, tc.wantArgs) || rt.UID != tc.wantUID || rt.GID != tc.wantGID || !slices.Equal(rt.ExtraGIDs, tc.wantExtraGIDs) {
				t.Errorf("args %q uid %d gid %d groups %v, want %q %d %d %v", rt.Args, rt.UID, rt.GID, rt.ExtraGIDs, tc.wantArgs, tc.wantUID, tc.wantGID, tc.wantExtraGIDs)
			}
			if !rt.ReadOnlyRoot || !rt.NoNewPrivileges || rt.Ports["http-metrics"] != 15014 {
				t.Errorf("readOnlyRoot %v noNewPrivileges %v ports %v, want true true http-metrics:15014", rt.ReadOnlyRoot, rt.NoNewPrivileges, rt.Ports)
			}
		})
	}
}
