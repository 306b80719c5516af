package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// lockSystem is one way to take a lock, measured side by side with the
// others. Each call to newClient is one independent client (one holder).
type lockSystem interface {
	name() string
	newClient(id string) (lockClient, error)
}

// lockClient acquires and releases named locks for one holder.
type lockClient interface {
	// acquire blocks until key is held or ctx ends and returns the grant's
	// fencing token and how to release it.
	acquire(ctx context.Context, key string) (int64, func(context.Context) error, error)
	close()
}

// frontdeskSystem: pkg/lock on DistributedLocks named by the key.
type frontdeskSystem struct {
	cs  kubernetes.Interface
	dyn dynamic.Interface
	// ns is the locks' namespace (default: the bench's); pool, when set,
	// gives each new client its clients (a participant's, see guardprice.go)
	// instead of cs and dyn.
	ns   string
	pool func() participant
}

func (frontdeskSystem) name() string { return "frontdesk" }

func (s frontdeskSystem) newClient(id string) (lockClient, error) {
	c := &frontdeskClient{sys: s, id: id, clients: map[string]*lock.Client{}, cs: s.cs, dyn: s.dyn, ns: s.ns}
	if s.pool != nil {
		p := s.pool()
		c.cs, c.dyn = p.cs, p.dyn
	}
	if c.ns == "" {
		c.ns = namespace
	}
	return c, nil
}

type frontdeskClient struct {
	sys     frontdeskSystem
	id      string
	clients map[string]*lock.Client
	cs      kubernetes.Interface
	dyn     dynamic.Interface
	ns      string
}

func (c *frontdeskClient) acquire(ctx context.Context, key string) (int64, func(context.Context) error, error) {
	lc, ok := c.clients[key]
	if !ok {
		var err error
		if lc, err = lock.NewForClients(c.cs, c.dyn, lock.Config{Namespace: c.ns, Name: key, Identity: c.id}); err != nil {
			return 0, nil, err
		}
		c.clients[key] = lc
	}
	g, err := lc.Acquire(ctx)
	if err != nil {
		return 0, nil, err
	}
	return g.Token(), g.Release, nil
}

func (c *frontdeskClient) close() {}

// rawCASSystem: one client-go compare-and-swap Update to take the Lease and
// one to clear it: the floor under every Lease-based lock. It does not wait
// for a held lock, so it is measured uncontended only.
type rawCASSystem struct{ cs kubernetes.Interface }

func (rawCASSystem) name() string { return "raw Lease CAS" }

func (s rawCASSystem) newClient(id string) (lockClient, error) {
	return &rawCASClient{cs: s.cs, id: id}, nil
}

type rawCASClient struct {
	cs kubernetes.Interface
	id string
}

func (c *rawCASClient) acquire(ctx context.Context, key string) (int64, func(context.Context) error, error) {
	leases := c.cs.CoordinationV1().Leases(namespace)
	l, err := leases.Get(ctx, key, metav1.GetOptions{})
	if err != nil {
		return 0, nil, err
	}
	l.Spec.HolderIdentity = new(c.id)
	l.Spec.LeaseTransitions = new(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	held, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		return 0, nil, err
	}
	release := func(ctx context.Context) error {
		held.Spec.HolderIdentity = nil
		_, err := leases.Update(ctx, held, metav1.UpdateOptions{})
		return err
	}
	return int64(*held.Spec.LeaseTransitions), release, nil
}

func (c *rawCASClient) close() {}

// etcdSystem: etcd's concurrency.Mutex on the etcd that backs the
// apiserver, with a session of the same TTL. Its fencing token is the
// revision at which the lock was taken.
type etcdSystem struct {
	endpoint string
	ttl      int
}

func (etcdSystem) name() string { return "etcd Mutex" }

func (s etcdSystem) newClient(string) (lockClient, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd: %w", err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(s.ttl))
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	return &etcdClient{cli: cli, sess: sess}, nil
}

type etcdClient struct {
	cli  *clientv3.Client
	sess *concurrency.Session
}

func (c *etcdClient) acquire(ctx context.Context, key string) (int64, func(context.Context) error, error) {
	m := concurrency.NewMutex(c.sess, "/frontdesk-bench/"+key)
	if err := m.Lock(ctx); err != nil {
		return 0, nil, err
	}
	return m.Header().Revision, m.Unlock, nil
}

func (c *etcdClient) close() {
	_ = c.sess.Close()
	_ = c.cli.Close()
}

// redisSystem: SET NX PX, with a fencing counter bumped in the same Lua
// script, released by a compare-and-delete script. Redis has no way to
// wait for a key to go, so a waiter retries every millisecond.
type redisSystem struct {
	addr string
	ttl  time.Duration
}

func (redisSystem) name() string { return "Redis SET NX PX" }

var (
	redisAcquire = redis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0`)
	redisRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	errNotOwner  = errors.New("redis lock not held by this client")
)

func (s redisSystem) newClient(id string) (lockClient, error) {
	return &redisClient{rdb: redis.NewClient(&redis.Options{Addr: s.addr}), id: id, ttl: s.ttl}, nil
}

type redisClient struct {
	rdb *redis.Client
	id  string
	ttl time.Duration
}

func (c *redisClient) acquire(ctx context.Context, key string) (int64, func(context.Context) error, error) {
	for {
		token, err := redisAcquire.Run(ctx, c.rdb, []string{"lock:" + key, "fence:" + key}, c.id, c.ttl.Milliseconds()).Int64()
		if err != nil {
			return 0, nil, err
		}
		if token > 0 {
			release := func(ctx context.Context) error {
				n, err := redisRelease.Run(ctx, c.rdb, []string{"lock:" + key}, c.id).Int64()
				if err == nil && n == 0 {
					return errNotOwner
				}
				return err
			}
			return token, release, nil
		}
		select {
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-time.After(time.Millisecond): // Redis cannot notify a waiter
		}
	}
}

func (c *redisClient) close() { _ = c.rdb.Close() }
