package harness

import (
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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

// RestConfig is the client configuration of the flags' kubeconfig, its
// requests timing out after timeout (0: none).
func (w *WorkerFlags) RestConfig(timeout time.Duration) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", w.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.Timeout = timeout
	return cfg, nil
}
