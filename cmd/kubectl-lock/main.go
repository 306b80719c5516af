// Command kubectl-lock is the `kubectl lock` plugin for frontdesk
// DistributedLocks. Put it on your PATH and run `kubectl lock --help`.
package main

import (
	"os"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
