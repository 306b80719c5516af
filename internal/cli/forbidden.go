package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The ClusterRoles config/default installs for the users of locks
// (config/rbac/lock_user_role.yaml, lock_admin_role.yaml).
const (
	lockUserRole  = "frontdesk-lock-user"
	lockAdminRole = "frontdesk-lock-admin"
)

// lockResources are the resources whose refusal by RBAC binding a lock
// role mends: the plugin touches no others (the roles grant what it needs
// on each: get, list and watch on locks; get, watch, update and patch on
// Leases; list on events, frontdesk-lock-admin's).
var lockResources = map[string]bool{
	"distributedlocks": true, "leases": true, "events": true,
}

// rbacDenial is how the apiserver's authorizer words a refusal:
// `User "NAME" cannot VERB resource "RESOURCE" in API group "GROUP" in the
// namespace "NS"`.
var rbacDenial = regexp.MustCompile(`User "([^"]*)" cannot (\S+) resource "([^"/]*)(?:/[^"]*)?"(?: in API group "[^"]*")?(?: in the namespace "([^"]*)")?`)

// forbiddenHint says which ClusterRole to bind, and how, when err is an
// RBAC refusal of what the plugin needs on locks, Leases or events; "" for
// any other error. The lease-guard policy's refusals are Forbidden too, but
// they say themselves what is needed (their message names the policy), so
// they get no hint; nor does a refusal of anything else (impersonation,
// say). verb is the plugin's command: break (and listing events) needs
// frontdesk-lock-admin, everything else frontdesk-lock-user. namespace is the lock's, for a
// refusal that names none.
func forbiddenHint(err error, verb, namespace string) string {
	msg := ""
	var status apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err) && errors.As(err, &status):
		msg = status.Status().Message
	case err != nil && strings.Contains(err.Error(), " is forbidden: User \""):
		msg = err.Error() // wrapped without %w on the way
	default:
		return ""
	}
	if strings.Contains(msg, "ValidatingAdmissionPolicy") || strings.Contains(msg, "admission webhook") {
		return ""
	}
	m := rbacDenial.FindStringSubmatch(msg)
	if m == nil || !lockResources[m[3]] {
		return ""
	}
	user := m[1]
	if m[4] != "" {
		namespace = m[4]
	}
	role := lockUserRole
	if verb == "break" || m[3] == "events" {
		role = lockAdminRole
	}
	subject, name := "--user="+shellQuote(user), user
	if sa, ok := strings.CutPrefix(user, "system:serviceaccount:"); ok {
		if saNS, saName, ok := strings.Cut(sa, ":"); ok {
			subject, name = "--serviceaccount="+shellQuote(saNS+":"+saName), saName
		}
	}
	return fmt.Sprintf("bind ClusterRole %s to %s in namespace %s: kubectl create rolebinding %s --clusterrole=%s %s -n %s",
		role, user, namespace, bindingName(role, name), role, subject, shellQuote(namespace))
}

// bindingName is a RoleBinding name for role and a subject's name: the
// role, a dash and the name lowercased with anything a name may not hold
// turned into dashes, at most 63 characters.
func bindingName(role, subject string) string {
	var b strings.Builder
	b.WriteString(role + "-")
	for _, r := range strings.ToLower(subject) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' || r == '.' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	name := b.String()
	if len(name) > 63 {
		name = name[:63]
	}
	return strings.TrimRight(name, "-.")
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// characters a shell leaves alone.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("-_./=:,+@%", r)
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
