package demo

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// printReport prints the rounds side by side, then each round's timeline:
// which worker held which token when, and what the ledger did with its
// writes.
func printReport(out io.Writer, opts Options, res Result) {
	fmt.Fprintf(out, "\nRESULT: %d customers, %d workers, TTL %s, job ~%s, holder frozen at %.0f%% (counted from the ledger's database)\n\n",
		opts.Customers, opts.Workers, opts.LeaseDuration, opts.JobDuration, 100*opts.PauseAt)
	w := tabwriter.NewWriter(out, 0, 4, 3, ' ', tabwriter.AlignRight)
	var header strings.Builder
	header.WriteString("\t")
	for _, r := range res.Rounds {
		header.WriteString(fencingLabel(r.Fenced) + "\t")
	}
	fmt.Fprintln(w, header.String())
	row := func(name string, value func(RoundResult) string) {
		var line strings.Builder
		line.WriteString(name + "\t")
		for _, r := range res.Rounds {
			line.WriteString(value(r) + "\t")
		}
		fmt.Fprintln(w, line.String())
	}
	row("customers", func(r RoundResult) string { return commas(r.Stats.Customers) })
	row("charges recorded", func(r RoundResult) string { return commas(r.Stats.Charges) })
	row("duplicate charges", func(r RoundResult) string { return commas(r.Stats.Duplicates) })
	row("customers charged exactly once", func(r RoundResult) string { return commas(r.Stats.ChargedOnce) })
	row("customers never charged", func(r RoundResult) string { return commas(r.Stats.NeverCharged) })
	row("stale writes rejected", func(r RoundResult) string { return commas(r.Stats.Rejected) })
	row("fencing tokens used", func(r RoundResult) string { return tokenRange(r.Grants) })
	row("frozen worker (token)", func(r RoundResult) string {
		return fmt.Sprintf("%s (%d)", strings.TrimPrefix(r.FrozenWorker, "worker-"), r.FrozenToken)
	})
	row("round took", func(r RoundResult) string { return r.Duration.Round(100 * 1e6).String() })
	_ = w.Flush()

	for _, r := range res.Rounds {
		fmt.Fprintf(out, "\ntimeline, %s:\n", fencingLabel(r.Fenced))
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  token\tworker\tgranted at\twrites accepted\twrites rejected\twriting from → to")
		for _, g := range r.Grants {
			acc, rej, span := 0, 0, "-"
			for _, t := range sortedTokens(r.Stats.Tokens) {
				if t.Token == g.Token {
					acc, rej = t.Accepted, t.Rejected
					span = fmt.Sprintf("%.1fs → %.1fs", float64(t.FirstMS)/1000, float64(t.LastMS)/1000)
				}
			}
			fmt.Fprintf(tw, "  %d\t%s\t%.1fs\t%s\t%s\t%s\n", g.Token, lock.PodNameOf(g.Worker), float64(g.AtMS)/1000, commas(acc), commas(rej), span)
		}
		_ = tw.Flush()
	}
}

func fencingLabel(fenced bool) string {
	if fenced {
		return "with fencing"
	}
	return "without fencing"
}

func tokenRange(grants []Grant) string {
	if len(grants) == 0 {
		return "-"
	}
	var parts []string
	for _, g := range grants {
		parts = append(parts, fmt.Sprint(g.Token))
	}
	return strings.Join(parts, ",")
}

// commas formats n with thousands separators.
func commas(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
