//go:build tools

// Package tools records the main packages that hack/kind/build-binaries.sh
// builds for the kind node image, so that `go mod tidy` keeps their
// dependencies in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
