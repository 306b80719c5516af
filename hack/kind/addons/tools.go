//go:build tools

// Package tools records the main packages that hack/kind/build-binaries.sh
// builds from this module, so that `go mod tidy` keeps them in go.sum.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
