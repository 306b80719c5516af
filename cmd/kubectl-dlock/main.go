// Command kubectl-dlock is the `kubectl dlock` plugin for frontdesk
// DistributedLocks. Put it on your PATH and run `kubectl dlock --help`.
package main

import (
	"os"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == cli.WatchdogArg {
		// kubectl dlock run started this binary again as the watchdog of
		// its command's process group.
		os.Exit(cli.RunWatchdog())
	}
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
