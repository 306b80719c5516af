// Command nodenet is the pod network of the kind clusters built by hack/kind:
// the smallest thing that does what kind's default CNI (kindnetd) does on a
// single docker network. On every node it
//
//   - writes a CNI config for the node's pod CIDR (ptp veths, host-local
//     addresses) into /etc/cni/net.d, which makes the kubelet report the
//     network ready, and
//   - routes every other node's pod CIDR to that node's InternalIP.
//
// The nodes share one layer-2 network, so no encapsulation and no NAT are
// needed. It runs as a DaemonSet with the host's network
// (hack/kind/node/default-cni.yaml).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

func main() {
	cniDir := flag.String("cni-conf-dir", "/etc/cni/net.d", "where the CNI config is written")
	interval := flag.Duration("resync", 5*time.Second, "how often nodes are listed and routes checked")
	mtu := flag.Int("mtu", 1500, "MTU of the pod interfaces")
	flag.Parse()

	nodeName := os.Getenv("NODE_NAME")
	if nodeName == "" {
		klog.Fatal("NODE_NAME is not set (downward API spec.nodeName)")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		klog.Fatalf("in-cluster config: %v", err)
	}
	// kind sets CONTROL_PLANE_ENDPOINT so that the network can come up before
	// kube-proxy makes the kubernetes Service reachable.
	if ep := os.Getenv("CONTROL_PLANE_ENDPOINT"); ep != "" {
		cfg.Host = "https://" + ep
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		klog.Fatalf("enabling forwarding: %v", err)
	}

	ctx := context.Background()
	for {
		if err := sync(ctx, client, nodeName, *cniDir, *mtu); err != nil {
			klog.Errorf("sync: %v", err)
		}
		time.Sleep(*interval) // resync period
	}
}

// sync writes this node's CNI config and routes the other nodes' pod CIDRs.
func sync(ctx context.Context, client kubernetes.Interface, self, cniDir string, mtu int) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Name == self {
			if len(n.Spec.PodCIDRs) == 0 {
				return fmt.Errorf("node %s has no pod CIDR yet", self)
			}
			if err := writeCNIConfig(cniDir, n.Spec.PodCIDRs, mtu); err != nil {
				return err
			}
			continue
		}
		ip := internalIP(n)
		if ip == nil {
			continue
		}
		for _, cidr := range n.Spec.PodCIDRs {
			_, dst, err := net.ParseCIDR(cidr)
			if err != nil || (dst.IP.To4() == nil) != (ip.To4() == nil) {
				continue
			}
			route := &netlink.Route{Dst: dst, Gw: ip}
			if err := netlink.RouteReplace(route); err != nil {
				return fmt.Errorf("route %s via %s (node %s): %w", dst, ip, n.Name, err)
			}
		}
	}
	return nil
}

func internalIP(n *corev1.Node) net.IP {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
				return ip
			}
		}
	}
	return nil
}

// writeCNIConfig writes the conflist for the node's pod CIDRs, replacing the
// file only when its content changes.
func writeCNIConfig(dir string, podCIDRs []string, mtu int) error {
	var ranges [][]map[string]string
	for _, c := range podCIDRs {
		ranges = append(ranges, []map[string]string{{"subnet": c}})
	}
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "nodenet",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": false,
				"mtu":    mtu,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": "/run/cni-ipam-state",
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"ranges":  ranges,
				},
			},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "10-nodenet.conflist")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	klog.Infof("wrote %s for %v", path, podCIDRs)
	return nil
}
