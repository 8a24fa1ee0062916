// Package deploy holds no code: its tests check the deployment bundle in
// this folder (nginx, compose, Prometheus, Grafana, Kubernetes, systemd)
// against the real server. metrics_test.go runs in every `go test`;
// e2e_test.go drives the built binary behind the real nginx and Prometheus
// and runs only with CHUNLIAN_DEPLOY_E2E=1 (.ci/run sets it). The
// Kubernetes manifests are validated by the separate module in k8s/validate.
package deploy
