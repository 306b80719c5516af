package fencing

// LockKey is the fencing key of the DistributedLock name in namespace,
// "<namespace>/<name>": the key to fence that lock's writes on, which a
// pkg/lock Grant's and a pkg/leaderelection Term's FencingKey return. A Guard
// keeps one highest token per key, and each lock counts its tokens on its
// own, so locks must never share a key: keyed by the bare name, the locks
// default/billing and team-a/billing would share one, and the one with the
// lower tokens would be refused.
//
// Kubernetes names contain no "/", so no two locks have the same key, and a
// key with a further segment never equals a lock's: the permits of a fenced
// semaphore are to be keyed "<namespace>/<name>/<slot>".
func LockKey(namespace, name string) string { return namespace + "/" + name }
