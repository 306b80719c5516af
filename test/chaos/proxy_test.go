package chaos

import "github.com/frontdesk-dev/frontdesk/test/internal/harness"

// The TCP fault proxy is harness.Proxy, shared with the integration suite.
type (
	proxy     = harness.Proxy
	faultMode = harness.FaultMode
)

const (
	blackhole = harness.Blackhole
	drop      = harness.Drop
	delay     = harness.Delay
	// delayBy is how long the delay mode holds data back.
	delayBy = harness.DelayBy
)

func newProxy(targets ...string) (*proxy, error) { return harness.NewProxy(targets...) }
