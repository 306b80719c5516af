//go:build tools

// Package tools records krew's manifest validator, which
// `make release-artifacts` runs on the plugin manifest, so that
// `go mod tidy` keeps its dependencies in go.sum.
package tools

import (
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
