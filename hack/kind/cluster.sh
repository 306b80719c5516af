#!/usr/bin/env bash
# cluster.sh runs a kind cluster to try frontdesk on, from the images
# hack/kind builds with no registry (`make kind-cluster`, `make kind-delete`):
#
#   create NAME       creates the cluster NAME (skipped if it exists): one
#                     control plane and KIND_WORKERS workers (default 1),
#                     kube-proxy in nftables mode (docs/kind.md); loads
#                     frontdesk's images into its nodes; installs the bundles
#                     of config/default and, where the cluster serves
#                     MutatingAdmissionPolicy (1.36 and later),
#                     config/mutating, with the manager's image set to
#                     MANAGER_IMAGE (rendered by hack/dist into a temporary
#                     directory: dist/ is left as it is); waits for the
#                     manager's rollout; prints how to use and delete it.
#   delete NAME       deletes the cluster and its kubeconfig file.
#   load NAME IMAGE...  loads more images from the engine into its nodes.
#
# The images must exist (`make kind-node-image kind-images` build them; `make
# kind-cluster` runs both first, cached). kind's commands go through
# hack/kind/docker-shim when this engine cannot start privileged containers,
# as in the e2e test (docs/kind.md).
#
# Environment: KIND (the kind CLI, default bin/kind-cli/kind, `make kind`),
# KUBECTL (default bin/k8s/kubectl), KIND_KUBECONFIG (default
# bin/kind-NAME.kubeconfig; the cluster's context is written there, not into
# ~/.kube/config), KIND_WORKERS, NODE_IMAGE (default
# frontdesk-kind-node:KUBERNETES_VERSION of hack/kind/go.mod), MANAGER_IMAGE,
# PLUGIN_IMAGE, DEMO_IMAGE (default frontdesk-{controller,kubectl-dlock,demo}:e2e).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
usage="usage: cluster.sh create NAME | delete NAME | load NAME IMAGE..."
cmd=${1:?$usage}
name=${2:?$usage}
shift 2
kind=${KIND:-$root/bin/kind-cli/kind}
kubectl=${KUBECTL:-$root/bin/k8s/kubectl}
kubeconfig=${KIND_KUBECONFIG:-$root/bin/kind-$name.kubeconfig}
workers=${KIND_WORKERS:-1}
manager_image=${MANAGER_IMAGE:-frontdesk-controller:e2e}
plugin_image=${PLUGIN_IMAGE:-frontdesk-kubectl-dlock:e2e}
demo_image=${DEMO_IMAGE:-frontdesk-demo:e2e}
start=$(date +%s)

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

[[ -x "$kind" ]] || { echo "cluster.sh: no kind CLI at $kind (make kind)" >&2; exit 1; }

node_image=${NODE_IMAGE:-}
if [[ -z "$node_image" ]]; then
  node_image="frontdesk-kind-node:$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
fi

# kind runs its nodes with `docker run --privileged`; where this engine
# cannot start a privileged container ("unable to apply caps"), its docker
# commands go through the shim (the e2e test's usePrivilegedShimIfNeeded).
use_privileged_shim_if_needed() {
  local out
  if out=$(docker run --rm --privileged --entrypoint /bin/true "$node_image" 2>&1); then
    return 0
  fi
  if [[ "$out" != *"unable to apply caps"* ]]; then
    echo "cluster.sh: docker run --privileged $node_image failed: $out" >&2
    return 1
  fi
  log "this engine cannot start privileged containers; kind's docker commands go through hack/kind/docker-shim"
  export PATH="$here/docker-shim:$PATH"
}

exists() { "$kind" get clusters 2>/dev/null | grep -qx "$name"; }

load() {
  log "loading $* into the nodes of $name"
  "$kind" load docker-image --name "$name" "$@"
}

case "$cmd" in
create)
  docker image inspect "$node_image" >/dev/null 2>&1 ||
    { echo "cluster.sh: no image $node_image (make kind-node-image)" >&2; exit 1; }
  for i in "$manager_image" "$plugin_image" "$demo_image"; do
    docker image inspect "$i" >/dev/null 2>&1 || { echo "cluster.sh: no image $i (make kind-images)" >&2; exit 1; }
  done
  use_privileged_shim_if_needed
  mkdir -p "$(dirname "$kubeconfig")"
  if exists; then
    log "kind cluster $name exists: not created again (make kind-delete first for a new one)"
    "$kind" export kubeconfig --name "$name" --kubeconfig "$kubeconfig"
  else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    {
      echo 'kind: Cluster'
      echo 'apiVersion: kind.x-k8s.io/v1alpha4'
      echo 'networking:'
      echo '  kubeProxyMode: nftables # the node image has nft, no iptables (docs/kind.md)'
      echo 'nodes:'
      echo '- role: control-plane'
      for ((i = 0; i < workers; i++)); do echo '- role: worker'; done
    } >"$tmp/kind.yaml"
    log "creating kind cluster $name ($node_image): 1 control plane, $workers worker(s)"
    "$kind" create cluster --name "$name" --image "$node_image" --config "$tmp/kind.yaml" \
      --kubeconfig "$kubeconfig" --wait 5m
    log "cluster up in $(($(date +%s) - start))s"
  fi
  load "$manager_image" "$plugin_image" "$demo_image"

  bundles=$(mktemp -d)
  trap 'rm -rf "$bundles" ${tmp:+"$tmp"}' EXIT
  log "rendering the install bundles with image $manager_image (hack/dist, into $bundles)"
  (cd "$root/hack/dist" && go build -o "$bundles/frontdesk-dist" .)
  (cd "$root" && "$bundles/frontdesk-dist" -bundle "$bundles/install.yaml" -mutating-bundle "$bundles/install-mutating.yaml" -image "$manager_image")
  k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }
  deploy=(-n frontdesk-system deployment/frontdesk-controller-manager)
  # The tag stays the same when make kind-images rebuilds the manager's
  # image: the Deployment records the image's ID, and its pods are restarted
  # when a later run loaded another.
  image_id=$(docker image inspect -f '{{.Id}}' "$manager_image")
  running_id=$(k get "${deploy[@]}" -o jsonpath='{.metadata.annotations.kind\.frontdesk\.dev/manager-image-id}' 2>/dev/null || true)
  log "installing install.yaml"
  k apply --server-side -f "$bundles/install.yaml" >/dev/null
  if k api-resources --api-group=admissionregistration.k8s.io -o name | grep -qx 'mutatingadmissionpolicies.admissionregistration.k8s.io'; then
    log "installing install-mutating.yaml (the cluster serves MutatingAdmissionPolicy)"
    k apply --server-side -f "$bundles/install-mutating.yaml" >/dev/null
  fi
  if [[ -n "$running_id" && "$running_id" != "$image_id" ]]; then
    log "$manager_image is another image than the manager runs: restarting it"
    k rollout restart "${deploy[@]}"
  fi
  k annotate --overwrite "${deploy[@]}" "kind.frontdesk.dev/manager-image-id=$image_id" >/dev/null
  log "waiting for the manager's rollout"
  k rollout status "${deploy[@]}" --timeout=5m
  log "ready in $(($(date +%s) - start))s"
  cat >&2 <<EOF

kind cluster $name is up, frontdesk installed (manager image $manager_image).
Use it:
  export KUBECONFIG=$kubeconfig    # context kind-$name
  export PATH=$root/bin/k8s:\$PATH  # this kubectl, or your own
  kubectl get dlock -A
Images for pods: $demo_image has sh (busybox), $plugin_image runs kubectl dlock;
both are loaded, and nothing can be pulled. Load another:
  hack/kind/cluster.sh load $name IMAGE...
Delete it: make kind-delete$([[ "$name" == frontdesk ]] || echo " KIND_CLUSTER=$name")
EOF
  ;;
delete)
  if exists; then
    use_privileged_shim_if_needed 2>/dev/null || true
    "$kind" delete cluster --name "$name" --kubeconfig "$kubeconfig"
  else
    log "no kind cluster $name"
  fi
  rm -f "$kubeconfig"
  ;;
load)
  [[ $# -gt 0 ]] || { echo "$usage" >&2; exit 1; }
  exists || { echo "cluster.sh: no kind cluster $name" >&2; exit 1; }
  use_privileged_shim_if_needed
  load "$@"
  ;;
*)
  echo "$usage" >&2
  exit 1
  ;;
esac
