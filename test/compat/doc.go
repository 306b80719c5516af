// Package compat is an operator built the way one on controller-runtime
// v0.21 and client-go v0.33 builds it, with frontdesk's library: its module
// (test/compat/go.mod) pins those versions and requires only frontdesk's api
// and pkg modules, so it builds and passes only while the library works
// with them, without the root module's newer Kubernetes stack. Its test
// runs a short election against a real kube-apiserver (envtest) with the
// frontdesk manager running as a process of its own.
package compat
