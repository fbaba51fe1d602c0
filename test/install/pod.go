//go:build install

package install

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The kubelet stand-in: what a kubelet makes of a Pod's spec before it
// starts a container, done mechanically from the rendered objects and the
// objects applied to the API server, so nothing hand-written stands
// between the chart and the running endpoint. It supports the kinds below;
// any other is an error naming it, never silently skipped:
//   - volumes: configMap, secret (items, defaultMode, optional), emptyDir,
//     hostPath; the service account token the kubelet mounts by default
//   - env: value, valueFrom fieldRef, resourceFieldRef, configMapKeyRef,
//     secretKeyRef; envFrom configMapRef, secretRef
//   - securityContext: runAsUser/runAsGroup/fsGroup (pod, container wins),
//     readOnlyRootFilesystem, allowPrivilegeEscalation, capabilities

// podMeta is what a Pod has beyond its spec: its name and namespace and
// the addresses the kubelet knows.
type podMeta struct {
	Name, Namespace, PodIP, HostIP, NodeName string
}

// podSources are the objects a Pod's volumes and env refer to, as the
// kubelet reads them from the API server, and the service account
// credentials it mounts.
type podSources struct {
	ConfigMaps map[string]*corev1.ConfigMap
	Secrets    map[string]*corev1.Secret
	// Token is a TokenRequest's token for the Pod's service account and
	// CA the API server's CA: the files of the default token mount.
	Token, CA []byte
	// Hosts are more lines of the Pod's /etc/hosts (name -> address), the
	// stand-in for cluster DNS.
	Hosts map[string]string
}

// mount is a bind mount of a host path into the container.
type mount struct {
	Source, Destination string
	ReadOnly            bool
}

// podRuntime is a container as the runtime gets it.
type podRuntime struct {
	Args            []string
	Env             []string
	Cwd             string
	UID, GID        int64
	ExtraGIDs       []int64
	ReadOnlyRoot    bool
	NoNewPrivileges bool
	CapabilitiesAdd []string
	Mounts          []mount
	Ports           map[string]int32
}

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// materialize builds container name of spec for the image img: its
// volumes written under dir, its env resolved, its user and arguments.
func materialize(spec *corev1.PodSpec, name string, meta podMeta, img imageConfig, src podSources, dir string) (*podRuntime, error) {
	c := findContainer(spec, name)
	if c == nil {
		return nil, fmt.Errorf("pod spec has no container %q", name)
	}
	rt := &podRuntime{Cwd: img.WorkingDir, Ports: map[string]int32{}}
	if c.WorkingDir != "" {
		rt.Cwd = c.WorkingDir
	}
	if rt.Cwd == "" {
		rt.Cwd = "/"
	}
	rt.Args = containerArgs(c, img)
	if len(rt.Args) == 0 {
		return nil, fmt.Errorf("container %s: no command: neither it nor the image has one", name)
	}
	for _, p := range c.Ports {
		if p.Name != "" {
			rt.Ports[p.Name] = p.ContainerPort
		}
	}
	if err := securityContext(rt, spec, c, img); err != nil {
		return nil, fmt.Errorf("container %s: %w", name, err)
	}
	env, err := containerEnv(spec, c, meta, src)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", name, err)
	}
	rt.Env = append(slices.Clone(img.Env), env...)
	if rt.Mounts, err = volumeMounts(spec, c, meta, src, dir); err != nil {
		return nil, fmt.Errorf("container %s: %w", name, err)
	}
	return rt, nil
}

func findContainer(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// containerArgs: command replaces the image's entrypoint (and drops its
// Cmd), args replace its Cmd, as the kubelet does.
func containerArgs(c *corev1.Container, img imageConfig) []string {
	entry, cmd := img.Entrypoint, img.Cmd
	if len(c.Command) > 0 {
		entry, cmd = c.Command, nil
	}
	if len(c.Args) > 0 {
		cmd = c.Args
	}
	return append(slices.Clone(entry), cmd...)
}

func securityContext(rt *podRuntime, spec *corev1.PodSpec, c *corev1.Container, img imageConfig) error {
	uid, gid, err := imageUser(img.User)
	if err != nil {
		return err
	}
	psc, csc := spec.SecurityContext, c.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	pick := func(image int64, pod, container *int64) int64 {
		if container != nil {
			return *container
		}
		if pod != nil {
			return *pod
		}
		return image
	}
	rt.UID = pick(uid, psc.RunAsUser, csc.RunAsUser)
	rt.GID = pick(gid, psc.RunAsGroup, csc.RunAsGroup)
	nonRoot := csc.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = psc.RunAsNonRoot
	}
	if nonRoot != nil && *nonRoot && rt.UID == 0 {
		return fmt.Errorf("runAsNonRoot and the user is root")
	}
	if psc.FSGroup != nil {
		rt.ExtraGIDs = append(rt.ExtraGIDs, *psc.FSGroup)
	}
	rt.ExtraGIDs = append(rt.ExtraGIDs, psc.SupplementalGroups...)
	rt.ReadOnlyRoot = csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem
	rt.NoNewPrivileges = csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation
	if caps := csc.Capabilities; caps != nil {
		if !slices.Contains(caps.Drop, "ALL") {
			return fmt.Errorf("capabilities: only drop [ALL] is supported, got drop %v", caps.Drop)
		}
		for _, a := range caps.Add {
			rt.CapabilitiesAdd = append(rt.CapabilitiesAdd, "CAP_"+string(a))
		}
	} else {
		return fmt.Errorf("capabilities: unset (the runtime's default set) is not supported; drop [ALL]")
	}
	return nil
}

// imageUser parses an image's numeric "uid[:gid]" user.
func imageUser(user string) (uid, gid int64, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	if _, err := fmt.Sscan(u, &uid); err != nil {
		return 0, 0, fmt.Errorf("image user %q: not numeric", user)
	}
	if hasGroup {
		if _, err := fmt.Sscan(g, &gid); err != nil {
			return 0, 0, fmt.Errorf("image user %q: group not numeric", user)
		}
	}
	return uid, gid, nil
}

// containerEnv resolves envFrom, then env (later wins, as the kubelet
// orders them).
func containerEnv(spec *corev1.PodSpec, c *corev1.Container, meta podMeta, src podSources) ([]string, error) {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, from := range c.EnvFrom {
		data, err := envFromData(from, src)
		if err != nil {
			return nil, err
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			set(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		v, ok, err := envValue(spec, c, e, meta, src)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out, nil
}

func envFromData(from corev1.EnvFromSource, src podSources) (map[string]string, error) {
	switch {
	case from.ConfigMapRef != nil:
		cm, ok := src.ConfigMaps[from.ConfigMapRef.Name]
		if !ok {
			if optional(from.ConfigMapRef.Optional) {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom: configmap %q not found", from.ConfigMapRef.Name)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, ok := src.Secrets[from.SecretRef.Name]
		if !ok {
			if optional(from.SecretRef.Optional) {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom: secret %q not found", from.SecretRef.Name)
		}
		out := map[string]string{}
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("envFrom: a source of a kind the kubelet stand-in does not support")
}

func optional(o *bool) bool { return o != nil && *o }

// envValue is one env var's value; ok false for an optional reference that
// is missing (the kubelet leaves the variable out).
func envValue(spec *corev1.PodSpec, c *corev1.Container, e corev1.EnvVar, meta podMeta, src podSources) (string, bool, error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return e.Value, true, nil
	case from.FieldRef != nil:
		v, err := fieldRef(spec, meta, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := resourceFieldRef(c, from.ResourceFieldRef)
		return v, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, ok := src.ConfigMaps[ref.Name]
		v, has := "", false
		if ok {
			v, has = cm.Data[ref.Key]
		}
		if !has {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configMapKeyRef: key %q of configmap %q not found", ref.Key, ref.Name)
		}
		return v, true, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, ok := src.Secrets[ref.Name]
		var v []byte
		has := false
		if ok {
			v, has = s.Data[ref.Key]
		}
		if !has {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secretKeyRef: key %q of secret %q not found", ref.Key, ref.Name)
		}
		return string(v), true, nil
	}
	return "", false, fmt.Errorf("valueFrom of a kind the kubelet stand-in does not support")
}

func fieldRef(spec *corev1.PodSpec, meta podMeta, path string) (string, error) {
	switch path {
	case "metadata.name":
		return meta.Name, nil
	case "metadata.namespace":
		return meta.Namespace, nil
	case "spec.serviceAccountName":
		return spec.ServiceAccountName, nil
	case "spec.nodeName":
		return meta.NodeName, nil
	case "status.podIP":
		return meta.PodIP, nil
	case "status.hostIP":
		return meta.HostIP, nil
	}
	return "", fmt.Errorf("fieldRef %q: not supported by the kubelet stand-in", path)
}

// resourceFieldRef is the container's request or limit, divided by the
// divisor and rounded up, as the kubelet's downward API does (a limit that
// is not set would be the node's allocatable: an error here).
func resourceFieldRef(c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	kind, res, ok := strings.Cut(ref.Resource, ".")
	if !ok || (res != "cpu" && res != "memory" && res != "ephemeral-storage") {
		return "", fmt.Errorf("resourceFieldRef %q: not supported by the kubelet stand-in", ref.Resource)
	}
	var list corev1.ResourceList
	switch kind {
	case "limits":
		list = c.Resources.Limits
	case "requests":
		list = c.Resources.Requests
	default:
		return "", fmt.Errorf("resourceFieldRef %q: not supported by the kubelet stand-in", ref.Resource)
	}
	q, ok := list[corev1.ResourceName(res)]
	if !ok {
		return "", fmt.Errorf("resourceFieldRef %q: the container sets none (the node's allocatable is not known here)", ref.Resource)
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if res == "cpu" {
		return fmt.Sprint(int64(math.Ceil(float64(q.MilliValue()) / float64(divisor.MilliValue())))), nil
	}
	return fmt.Sprint(int64(math.Ceil(float64(q.Value()) / float64(divisor.Value())))), nil
}

// volumeMounts writes each mounted volume under dir and returns the bind
// mounts, the service account token mount first (unless turned off).
func volumeMounts(spec *corev1.PodSpec, c *corev1.Container, meta podMeta, src podSources, dir string) ([]mount, error) {
	var fsGroup *int64
	if spec.SecurityContext != nil {
		fsGroup = spec.SecurityContext.FSGroup
	}
	var mounts []mount
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		d := filepath.Join(dir, "serviceaccount")
		files := map[string][]byte{"token": src.Token, "ca.crt": src.CA, "namespace": []byte(meta.Namespace)}
		if err := writeFiles(d, files, nil, 0o644, fsGroup); err != nil {
			return nil, fmt.Errorf("service account token: %w", err)
		}
		mounts = append(mounts, mount{Source: d, Destination: serviceAccountDir, ReadOnly: true})
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	made := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s: no volume of that name", m.Name)
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			return nil, fmt.Errorf("volumeMount %s: subPath is not supported by the kubelet stand-in", m.Name)
		}
		source, ok := made[v.Name]
		if !ok {
			var err error
			if source, err = makeVolume(v, src, filepath.Join(dir, "volumes", v.Name), fsGroup); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			made[v.Name] = source
		}
		mounts = append(mounts, mount{Source: source, Destination: m.MountPath, ReadOnly: m.ReadOnly || readOnlyVolume(v)})
	}
	hosts := filepath.Join(dir, "etc-hosts")
	if err := os.WriteFile(hosts, []byte(etcHosts(spec, meta, src.Hosts)), 0o644); err != nil {
		return nil, err
	}
	mounts = append(mounts, mount{Source: hosts, Destination: "/etc/hosts", ReadOnly: true})
	return mounts, nil
}

// readOnlyVolume: the kubelet mounts Secret and ConfigMap volumes read-only.
func readOnlyVolume(v corev1.Volume) bool { return v.Secret != nil || v.ConfigMap != nil }

func makeVolume(v corev1.Volume, src podSources, dir string, fsGroup *int64) (string, error) {
	switch {
	case v.ConfigMap != nil:
		cm, ok := src.ConfigMaps[v.ConfigMap.Name]
		data := map[string][]byte{}
		if ok {
			for k, s := range cm.Data {
				data[k] = []byte(s)
			}
			maps.Copy(data, cm.BinaryData)
		} else if !optional(v.ConfigMap.Optional) {
			return "", fmt.Errorf("configmap %q not found", v.ConfigMap.Name)
		}
		return dir, writeFiles(dir, data, v.ConfigMap.Items, mode(v.ConfigMap.DefaultMode), fsGroup)
	case v.Secret != nil:
		s, ok := src.Secrets[v.Secret.SecretName]
		data := map[string][]byte{}
		if ok {
			data = s.Data
		} else if !optional(v.Secret.Optional) {
			return "", fmt.Errorf("secret %q not found", v.Secret.SecretName)
		}
		return dir, writeFiles(dir, data, v.Secret.Items, mode(v.Secret.DefaultMode), fsGroup)
	case v.EmptyDir != nil:
		if v.EmptyDir.Medium != "" {
			return "", fmt.Errorf("emptyDir medium %q is not supported by the kubelet stand-in", v.EmptyDir.Medium)
		}
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return "", err
		}
		return dir, os.Chmod(dir, 0o777)
	case v.HostPath != nil:
		if _, err := os.Stat(v.HostPath.Path); err != nil {
			return "", fmt.Errorf("hostPath: %w", err)
		}
		return v.HostPath.Path, nil
	}
	return "", fmt.Errorf("a volume kind the kubelet stand-in does not support (configMap, secret, emptyDir, hostPath)")
}

func mode(m *int32) os.FileMode {
	if m == nil {
		return 0o644
	}
	return os.FileMode(*m)
}

// writeFiles writes data as files of dir: every key, or only items (key
// to path, with its own mode), as the kubelet's atomic writer; a missing
// item key is an error. With fsGroup the files are the group's and
// group-readable.
func writeFiles(dir string, data map[string][]byte, items []corev1.KeyToPath, defMode os.FileMode, fsGroup *int64) error {
	type file struct {
		path string
		data []byte
		mode os.FileMode
	}
	var files []file
	if len(items) == 0 {
		for _, k := range slices.Sorted(maps.Keys(data)) {
			files = append(files, file{k, data[k], defMode})
		}
	}
	for _, it := range items {
		d, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("key %q not found", it.Key)
		}
		m := defMode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		if strings.Contains(it.Path, "..") || filepath.IsAbs(it.Path) {
			return fmt.Errorf("item path %q: not a relative path within the volume", it.Path)
		}
		files = append(files, file{it.Path, d, m})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		m := f.mode
		if fsGroup != nil {
			m |= 0o440
		}
		if err := os.WriteFile(p, f.data, m); err != nil {
			return err
		}
		if err := os.Chmod(p, m); err != nil {
			return err
		}
		if fsGroup != nil {
			if err := os.Chown(p, 0, int(*fsGroup)); err != nil {
				return err
			}
		}
	}
	return nil
}

// etcHosts is the file the kubelet writes for a Pod: localhost, the Pod's
// own name, hostAliases, then the cluster DNS stand-in's names.
func etcHosts(spec *corev1.PodSpec, meta podMeta, extra map[string]string) string {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file (kubelet stand-in).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if meta.PodIP != "" {
		fmt.Fprintf(&b, "%s\t%s\n", meta.PodIP, meta.Name)
	}
	for _, a := range spec.HostAliases {
		fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
	for _, name := range slices.Sorted(maps.Keys(extra)) {
		fmt.Fprintf(&b, "%s\t%s\n", extra[name], name)
	}
	return b.String()
}
