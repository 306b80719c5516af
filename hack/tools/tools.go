//go:build tools

// Package tools records the generator commands built by the Makefile so that
// `go mod tidy` keeps their dependencies in go.sum.
package tools

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
