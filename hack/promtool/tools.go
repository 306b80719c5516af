//go:build tools

// Package tools records promtool, which `make test` uses to unit-test the
// alerting rules (config/prometheus), so that `go mod tidy` keeps its
// dependencies in go.sum.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
