//go:build tools

// Package tools records golangci-lint, which `make lint` runs, so that
// `go mod tidy` keeps its dependencies in go.sum.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
