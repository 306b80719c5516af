package chaos

import "github.com/frontdesk-dev/frontdesk/internal/testutil"

// The TCP fault proxy is testutil.Proxy, shared with the integration suite.
type (
	proxy     = testutil.Proxy
	faultMode = testutil.FaultMode
)

const (
	blackhole = testutil.Blackhole
	drop      = testutil.Drop
	delay     = testutil.Delay
	// delayBy is how long the delay mode holds data back.
	delayBy = testutil.DelayBy
)

func newProxy(targets ...string) (*proxy, error) { return testutil.NewProxy(targets...) }
