package integration

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// What became of the adversary's writes: outcomes, counts, the journal.

// guardRules name the lease policies' refusals by a fragment of each
// message (config/lease-policy/policy.yaml).
var guardRules = []struct{ fragment, rule string }{
	{"may never decrease", "token lowered"},
	{"only the frontdesk manager creates a Lease", "create"},
	{"only the frontdesk manager changes what ties", "manager's keys"},
	{"a participant writes only a grant and its marks", "default deny"},
	{"only its holder renews, releases or hands it on", "another's live grant"},
	{"renews its grant (spec.renewTime only)", "holder's write"},
	{"is free: take it by raising", "free lock"},
	{"names a holder of 1 to 253", "grant shape"},
	{"names the place it grants", "hand-off shape"},
	{"goes to the head of the queue", "hand-off not to the head"},
	{"a release or break of", "release marks"},
	{"is added in your own name only", "place shape"},
	{"takes the seq one more than", "place seq"},
	{"a place above the default priority", "place priority"},
	{"is removed (both its keys) only by", "place removal"},
	{"holds at most 256 places", "place bounds"},
	{"a front label of DistributedLock", "front label"},
	{"deleting it ends its grant", "delete guard"},
}

// fencingRules name the fencing policy's refusals by a fragment of each
// message (config/fencing-policy/policy.yaml).
var fencingRules = []struct{ fragment, rule string }{
	{"this object was last written with token", "fencing: below the object's token"},
	{"its current fencing token is", "fencing: below the lock's token"},
	{"was never granted", "fencing: never granted"},
	{"must be a non-negative integer", "fencing: not a token"},
	{"fenced label was removed", "fencing: label removed"},
	{"fencing-token annotation was removed", "fencing: token removed"},
	{"fencing-lock annotation may not change", "fencing: lock changed"},
	{"failed to find any param", "fencing: no lock to check"},
	{"no params found", "fencing: no lock to check"},
}

// classify names the outcome of a write.
func classify(err error) string {
	if err == nil {
		return "accepted"
	}
	msg := err.Error()
	switch {
	case (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(msg, "ValidatingAdmissionPolicy 'frontdesk-fencing-token"):
		for _, g := range fencingRules {
			if strings.Contains(msg, g.fragment) {
				return "refused: " + g.rule
			}
		}
		return "refused: fencing: other: " + trunc(msg)
	case apierrors.IsForbidden(err) && strings.Contains(msg, "denied request"):
		for _, g := range guardRules {
			if strings.Contains(msg, g.fragment) {
				return "refused: " + g.rule
			}
		}
		if strings.Contains(msg, "cost") || strings.Contains(msg, "evaluat") {
			return "refused: CEL error: " + trunc(msg[strings.Index(msg, "denied request")+len("denied request: "):])
		}
		return "refused: other: " + trunc(msg[strings.Index(msg, "denied request")+len("denied request: "):])
	case apierrors.IsForbidden(err) && strings.Contains(msg, " cannot "):
		return "refused by RBAC"
	case apierrors.IsForbidden(err):
		return "refused: admission: " + trunc(msg)
	case apierrors.IsConflict(err):
		return "conflict"
	case lease.PatchDidNotApply(err):
		return "patch did not apply"
	case apierrors.IsInvalid(err):
		var st apierrors.APIStatus
		if errors.As(err, &st) && st.Status().Details != nil && len(st.Status().Details.Causes) > 0 {
			return "invalid: " + st.Status().Details.Causes[0].Field
		}
		return "invalid"
	case apierrors.IsBadRequest(err):
		return "bad request"
	case apierrors.IsRequestEntityTooLargeError(err):
		return "too large"
	case apierrors.IsNotFound(err):
		return "not found"
	}
	return "other: " + trunc(msg)
}

func outcomeGroup(outcome string) string {
	switch {
	case outcome == "accepted":
		return "accepted"
	case outcome == "accepted, no change":
		return "no change"
	case outcome == "refused by RBAC":
		return "RBAC"
	case strings.HasPrefix(outcome, "refused"):
		return "refused"
	case outcome == "conflict":
		return "conflict"
	case outcome == "patch did not apply", strings.HasPrefix(outcome, "invalid"), outcome == "bad request", outcome == "too large":
		return "invalid"
	}
	return "other"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func trunc(s string) string {
	if len(s) > 120 {
		return s[:120] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}

// writeStats counts writes by surface (the lock's Lease, pods, fenced
// objects), kind, theme and outcome.
type writeStats struct {
	mu     sync.Mutex
	counts map[[4]string]int
}

func newWriteStats() *writeStats { return &writeStats{counts: map[[4]string]int{}} }

func (s *writeStats) add(surface, kind, theme, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[[4]string{surface, kind, theme, outcome}]++
}

// table is a Markdown table of counts by row (0: surface, 1: kind, 2:
// theme) and outcome group.
func (s *writeStats) table(by int, title string) string {
	return s.tableOf(by, title, "")
}

// tableOf is table for one surface ("": all).
func (s *writeStats) tableOf(by int, title, surface string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	groups := []string{"accepted", "no change", "refused", "RBAC", "conflict", "invalid", "other"}
	rows := map[string]map[string]int{}
	total := map[string]int{}
	for k, n := range s.counts {
		if k[1] == "read" || surface != "" && k[0] != surface {
			continue
		}
		if rows[k[by]] == nil {
			rows[k[by]] = map[string]int{}
		}
		rows[k[by]][outcomeGroup(k[3])] += n
		rows[k[by]]["tried"] += n
		total[outcomeGroup(k[3])] += n
		total["tried"] += n
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| %s | tried | %s |\n|---|---|%s\n", title, strings.Join(groups, " | "), strings.Repeat("---|", len(groups)))
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	slices.Sort(names)
	line := func(name string, row map[string]int) {
		fmt.Fprintf(&b, "| %s | %d |", name, row["tried"])
		for _, g := range groups {
			fmt.Fprintf(&b, " %d |", row[g])
		}
		b.WriteString("\n")
	}
	for _, n := range names {
		line(n, rows[n])
	}
	line("**all**", total)
	return b.String()
}

// outcomes lists every outcome but acceptance with its count, most first.
func (s *writeStats) outcomes() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	byOutcome := map[string]int{}
	for k, n := range s.counts {
		byOutcome[k[0]+": "+k[3]] += n
	}
	names := make([]string, 0, len(byOutcome))
	for n := range byOutcome {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(byOutcome[b], byOutcome[a]), strings.Compare(a, b)) })
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %6d  %s\n", byOutcome[n], n)
	}
	return b.String()
}

// entry is one write as sent.
type entry struct {
	i                  uint64
	at                 time.Time
	pod, kind, theme   string
	desc, outcome, err string
	body               []byte
	// version is the resourceVersion it wrote, when accepted.
	version string
}

func (e entry) String() string {
	body := string(e.body)
	if len(body) > 800 {
		body = body[:800] + fmt.Sprintf("...(%d bytes)", len(e.body))
	}
	s := fmt.Sprintf("#%d %s %s %s/%s: %s -> %s %s\n    %s", e.i, e.at.Format("15:04:05.000"), e.pod, e.kind, e.theme, e.desc, e.outcome,
		e.version, body)
	return s
}

// journal keeps every write, for the writes around a violation.
type journal struct {
	mu      sync.Mutex
	entries []entry
}

func (j *journal) add(e entry) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, e)
}

// acceptedMentioning lists the accepted writes whose body or description
// contains needle.
func (j *journal) acceptedMentioning(needle string) []entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []entry
	for _, e := range j.entries {
		if e.outcome == "accepted" && (strings.Contains(string(e.body), needle) || strings.Contains(e.desc, needle)) {
			out = append(out, e)
		}
	}
	return out
}

// writeTo writes every entry to the file at path, with its error.
func (j *journal) writeTo(path string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var b strings.Builder
	for _, e := range j.entries {
		fmt.Fprintf(&b, "%s\n", e)
		if e.err != "" {
			fmt.Fprintf(&b, "    %s\n", e.err)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// wrote is the accepted write that wrote resourceVersion, if the
// adversary's.
func (j *journal) wrote(version string) (entry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, e := range j.entries {
		if e.version == version {
			return e, true
		}
	}
	return entry{}, false
}

// last lists the last n writes of theme.
func (j *journal) last(theme string, n int) []entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []entry
	for i := len(j.entries) - 1; i >= 0 && len(out) < n; i-- {
		if j.entries[i].theme == theme {
			out = append(out, j.entries[i])
		}
	}
	return out
}
