// Package harness holds the helpers that only the suites of the test module
// use: a proxy that fails the apiserver's connections on demand (Proxy) and
// a tap that delays, drops or holds its requests (Tap), child processes run
// for real (Process, WorkerFlags), a Lease's write history as a watch saw it
// (LeaseHistory) and a lock client's writes played with plain client-go
// calls (Grant, Renew, Release). Being under test/internal, nothing outside
// the test module can import it. The builders the unit tests of the root
// module share are in internal/testutil.
package harness
