package lock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// maxWriteAttempts bounds the retries of a write that should land whatever
// the contention (a release, an admin edit): each retry follows a write of
// the grant's own fields by someone else, which is rare, since the queue's
// writes never make a grant's patch fail.
const maxWriteAttempts = 25

// errNothingToDo ends a modifyLease that has nothing to write.
var errNothingToDo = errors.New("nothing to do")

// writeLease sends a write of the grant path, the patch p judged on
// current, through the client's unthrottled writer, and remembers the Lease
// it answers with. Exact, it is current with p applied, written with an
// Update carrying current's resourceVersion (a compare-and-swap on the
// whole object, in the apiserver's cheapest encoding: a Conflict when
// anything wrote the Lease since current); otherwise it is p itself, whose
// tests are the compare-and-swap, on the fields the judgement rests on.
func (c *Client) writeLease(ctx context.Context, current *coordinationv1.Lease, p *lease.Patch, exact bool) (*coordinationv1.Lease, error) {
	var l *coordinationv1.Lease
	var err error
	if exact {
		var next *coordinationv1.Lease
		if next, err = p.ApplyTo(current); err != nil {
			return nil, err
		}
		l, err = c.writes.Update(ctx, next, metav1.UpdateOptions{})
	} else {
		l, err = c.writes.Patch(ctx, current.Name, types.JSONPatchType, p.Bytes(), metav1.PatchOptions{})
	}
	if err != nil {
		return nil, err
	}
	c.remember(l)
	return l, nil
}

// lostRace reports whether a write failed because the Lease was no longer
// the copy it was judged on: a patch whose tests failed, or that removed
// something already gone, or an Update whose resourceVersion had moved.
// Re-read and judge again.
func lostRace(err error) bool {
	return apierrors.IsConflict(err) || lease.PatchDidNotApply(err)
}

// refusal is err, saying plainly when the apiserver refused the write
// (its admission policies, or RBAC): the message names the rule.
func refusal(err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("the apiserver refused the write: %w", err)
	}
	return err
}

// mayHaveLanded reports whether a write that failed with err may still
// have been applied: an answer from the apiserver below 500 (other than a
// request timeout) is a refusal; a 5xx, a timeout or no answer is not.
func mayHaveLanded(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == http.StatusRequestTimeout
	}
	return true
}

// passingReadError reports whether a failed read is one that passes by
// itself: the apiserver timed out, was overloaded (429, 5xx) or the
// connection broke or timed out; never when the caller's ctx has ended, and
// never an error that retrying cannot mend (a refusal, bad credentials).
func passingReadError(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		utilnet.IsTimeout(err) || utilnet.IsProbableEOF(err) || utilnet.IsConnectionReset(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsHTTP2ConnectionLost(err)
}

// releasePatch gives up current's grant, held by this client: handed to the
// head of the queue in the same write, or simply released when nobody is
// queued, or when the Lease is being deleted or no longer serves the lock
// (retired): nobody could take a hand-off up there. An exact release lands
// only on current's very version, so the hand-off goes to the head of the
// queue as it is when the release lands; a release that is not exact lands
// whatever the queue did since current (a waiter whose registration it did
// not see finds the lock free, and takes it at its turn). Releases try
// exact first (writeLease), and once the Lease changed, read it again and
// go on not exact: a crowd registering cannot keep a release from landing.
func (c *Client) releasePatch(current *coordinationv1.Lease, info lockInfo) *lease.Patch {
	if current.DeletionTimestamp == nil && controlledBy(current, info.uid) {
		if handed, _, ok, err := lease.HandOffPatch(current, c.cfg.Identity, info.duration, c.cfg.Clock.Now()); err == nil && ok {
			return handed
		}
	}
	return lease.ReleasePatch(current)
}

// modifyLease applies edit to a fresh read of the Lease and sends the patch
// it returns, reading again when the patch finds the Lease changed. edit
// may refuse by returning an error, which is returned as is.
//
// The first attempt is exact (see writeLease), the others are not.
func (c *Client) modifyLease(ctx context.Context, info lockInfo, edit func(l *coordinationv1.Lease) (*lease.Patch, error)) error {
	for attempt := range maxWriteAttempts {
		current, err := c.readLease(ctx, info.leaseName)
		if err != nil {
			return err
		}
		p, err := edit(current)
		if err != nil {
			return err
		}
		_, err = c.writeLease(ctx, current, p, attempt == 0)
		if err == nil {
			return nil
		}
		if !lostRace(err) {
			return fmt.Errorf("updating lease %s/%s: %w", c.cfg.Namespace, info.leaseName, refusal(err))
		}
	}
	return fmt.Errorf("updating lease %s/%s: the Lease changed under %d writes in a row", c.cfg.Namespace, info.leaseName, maxWriteAttempts)
}
