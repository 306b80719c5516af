//go:build tools

// Package tools records helm, which `make verify` uses to lint and render
// the chart (dist/chart), so that `go mod tidy` keeps its dependencies in
// go.sum.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
