// Package validate checks the Kubernetes manifests in deploy/k8s offline:
// every document decodes strictly (unknown or misspelt fields fail) into
// the typed objects of k8s.io/api, the same Go types the API server
// decodes into, and the deployment's invariants hold (probes on /ready and
// /health, a grace period that covers preStop + drain delay + drain
// timeout, resource requests, GPU pods asking for one GPU, selectors that
// match). It is its own module so that the k8s.io dependencies stay out of
// the chunlian binary's go.mod.
package validate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// objects is one manifest file, decoded.
type objects struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
}

// decodeFile decodes every document of path strictly; errs lists what
// failed (unknown kinds, unknown or mistyped fields).
func decodeFile(path string) (o objects, errs []error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return o, []error{err}
	}
	for i, doc := range bytes.Split(raw, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			errs = append(errs, fmt.Errorf("%s doc %d: %v", path, i, err))
			continue
		}
		var target any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			o.deployments, target = append(o.deployments, d), d
		case "v1 Service":
			s := &corev1.Service{}
			o.services, target = append(o.services, s), s
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			o.pdbs, target = append(o.pdbs, p), p
		case "autoscaling/v2 HorizontalPodAutoscaler":
			h := &autoscalingv2.HorizontalPodAutoscaler{}
			o.hpas, target = append(o.hpas, h), h
		default:
			errs = append(errs, fmt.Errorf("%s doc %d: unexpected %s %s", path, i, tm.APIVersion, tm.Kind))
			continue
		}
		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			errs = append(errs, fmt.Errorf("%s doc %d (%s): %v", path, i, tm.Kind, err))
		}
	}
	return o, errs
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func manifests(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, g := range []string{"../*.yaml", "../gpu/chunlian-gpu.yaml"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 2 {
		t.Fatalf("manifests not found: %v", files)
	}
	return files
}

func TestManifests(t *testing.T) {
	for _, f := range manifests(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			o, errs := decodeFile(f)
			for _, err := range errs {
				t.Error(err)
			}
			if len(o.deployments) != 1 || len(o.services) != 1 || len(o.pdbs) != 1 || len(o.hpas) != 1 {
				t.Fatalf("want one Deployment, Service, PDB and HPA; got %d %d %d %d",
					len(o.deployments), len(o.services), len(o.pdbs), len(o.hpas))
			}
			checkDeployment(t, o.deployments[0])
			checkWiring(t, o)
		})
	}
}

func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path {
			t.Errorf("%s probe: %+v, want GET %s", name, p, path)
		}
	}
	probe("readiness", c.ReadinessProbe, "/ready")
	probe("liveness", c.LivenessProbe, "/health")
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	delay, err1 := time.ParseDuration(env["CHUNLIAN_DRAIN_DELAY"])
	drain, err2 := time.ParseDuration(env["CHUNLIAN_DRAIN_TIMEOUT"])
	if err1 != nil || err2 != nil {
		t.Fatalf("CHUNLIAN_DRAIN_DELAY / CHUNLIAN_DRAIN_TIMEOUT not set as durations: %v %v", err1, err2)
	}
	if delay < time.Duration(c.ReadinessProbe.PeriodSeconds)*time.Second {
		t.Errorf("drain delay %v shorter than the readiness period %ds: endpoints may still route to a closed listener", delay, c.ReadinessProbe.PeriodSeconds)
	}
	var preStop time.Duration
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Error("no preStop sleep")
	} else {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	if need := preStop + delay + drain; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v ≤ preStop %v + drain delay %v + drain timeout %v", grace, preStop, delay, drain)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("no %s request", r)
		}
	}
	if strings.Contains(strings.Join(c.Args, " "), "cuda") {
		gpu := corev1.ResourceName("nvidia.com/gpu")
		if q, ok := c.Resources.Limits[gpu]; !ok || q.Value() != 1 {
			t.Errorf("GPU pod: limits nvidia.com/gpu = %v, want 1 (one pod per GPU)", c.Resources.Limits[gpu])
		}
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pods may run as root")
	}
}

// checkWiring: the Service, the PDB and the HPA all point at the pods.
func checkWiring(t *testing.T, o objects) {
	d := o.deployments[0]
	pod := labels.Set(d.Spec.Template.Labels)
	sel := func(what string, m map[string]string) {
		if len(m) == 0 || !labels.SelectorFromSet(m).Matches(pod) {
			t.Errorf("%s selector %v does not match the pod labels %v", what, m, pod)
		}
	}
	sel("Deployment", d.Spec.Selector.MatchLabels)
	sel("Service", o.services[0].Spec.Selector)
	sel("PodDisruptionBudget", o.pdbs[0].Spec.Selector.MatchLabels)
	h := o.hpas[0]
	if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != d.Name {
		t.Errorf("HPA targets %s/%s, want Deployment/%s", h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name, d.Name)
	}
	if len(h.Spec.Metrics) == 0 {
		t.Error("HPA without metrics")
	}
	port := o.services[0].Spec.Ports[0].TargetPort.String()
	found := false
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		found = found || p.Name == port || fmt.Sprint(p.ContainerPort) == port
	}
	if !found {
		t.Errorf("Service targetPort %s is no container port", port)
	}
}

// The strict decoding rejects what it should: a misspelt field.
func TestValidatorCatches(t *testing.T) {
	dir := t.TempDir()
	raw, err := os.ReadFile("../chunlian.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(raw), "readinessProbe:", "readinesProbe:", 1)
	if bad == string(raw) {
		t.Fatal("no readinessProbe to misspell")
	}
	path := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs := decodeFile(path); len(errs) == 0 || !strings.Contains(errs[0].Error(), "readinesProbe") {
		t.Errorf("strict decoding of a misspelt field: %v, want an error naming it", errs)
	}
}
