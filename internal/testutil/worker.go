package testutil

import (
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// WorkerFlags are the flags every lock-holding test worker process takes.
type WorkerFlags struct {
	Kubeconfig string
	Namespace  string
	Lock       string
	URL        string
}

// Register adds the flags to fs.
func (w *WorkerFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&w.Kubeconfig, "kubeconfig", "", "admin kubeconfig")
	fs.StringVar(&w.Namespace, "namespace", "", "lock namespace")
	fs.StringVar(&w.Lock, "lock", "", "lock name")
	fs.StringVar(&w.URL, "url", "", "URL of the fenced resource")
}

// Client builds a lock client from the flags; an empty identity means the
// default one. Requests time out after timeout (0: none).
func (w *WorkerFlags) Client(identity string, timeout time.Duration) (*lock.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", w.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.Timeout = timeout
	return lock.New(cfg, lock.Config{Namespace: w.Namespace, Name: w.Lock, Identity: identity})
}
