package report

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// The markers around the generated part of docs/benchmarks.md.
const (
	Begin = "<!-- bench:begin -->"
	End   = "<!-- bench:end -->"
)

// Run is one run of the bench: its invocations' reports, in order (the
// main bench, then the guard's price).
type Run []Report

// Meta is what the generated part says about where the runs were made.
type Meta struct {
	// Commit is the short commit measured; Dirty, whether the tree had
	// changes besides.
	Commit string
	Dirty  bool
	// Date the runs ended, YYYY-MM-DD.
	Date string
	// Machine: the CPUs' model, the memory, kube-apiserver's version.
	CPUModel, Memory, APIServer string
}

// Line is one row compared across runs.
type Line struct {
	Name string
	// Runs are the row in each run (nil where a run did not measure it).
	Runs []*Row
	// Lo and Hi are the lowest and highest figure of the runs.
	Lo, Hi float64
	Unit   Unit
	Goal   *Goal
	// Verdict is the goal's over every run: met when each run's figure
	// (and its band, where it has one) meets it, not met when none of
	// them does, within noise otherwise ("" without a goal).
	Verdict Verdict
}

// Section is one table compared across runs.
type Section struct {
	Title, Note string
	Lines       []Line
}

// Compare lines up the tables of runs, by title and row name, in the order
// of the first run that has them.
func Compare(runs []Run) []Section {
	var sections []Section
	at := map[string]int{}     // section title -> index
	lineAt := map[string]int{} // title + "\x00" + row name -> index
	for ri, run := range runs {
		for _, rep := range run {
			for _, t := range rep.Tables {
				si, ok := at[t.Title]
				if !ok {
					si = len(sections)
					at[t.Title] = si
					sections = append(sections, Section{Title: t.Title, Note: t.Note})
				}
				s := &sections[si]
				for _, r := range t.Rows {
					key := t.Title + "\x00" + r.Name
					li, ok := lineAt[key]
					if !ok {
						li = len(s.Lines)
						lineAt[key] = li
						s.Lines = append(s.Lines, Line{Name: r.Name, Runs: make([]*Row, len(runs)), Unit: r.Unit, Goal: r.Goal})
					}
					s.Lines[li].Runs[ri] = &r
				}
			}
		}
	}
	for si := range sections {
		for li := range sections[si].Lines {
			sections[si].Lines[li].judge()
		}
	}
	return sections
}

// judge sets the line's span and verdict from its runs.
func (l *Line) judge() {
	l.Lo, l.Hi = math.Inf(1), math.Inf(-1)
	verdicts := map[Verdict]int{}
	measured := 0
	for _, r := range l.Runs {
		if r == nil {
			continue
		}
		measured++
		l.Lo, l.Hi = min(l.Lo, r.Value), max(l.Hi, r.Value)
		if r.Goal == nil {
			continue
		}
		lo, hi := r.Value, r.Value
		if r.Lo != nil && r.Hi != nil {
			lo, hi = min(lo, *r.Lo), max(hi, *r.Hi)
		}
		verdicts[r.Goal.Judge(lo, hi)]++
	}
	if l.Goal == nil || measured == 0 {
		return
	}
	switch {
	case verdicts[Met] == measured:
		l.Verdict = Met
	case verdicts[NotMet] == measured:
		l.Verdict = NotMet
	default:
		l.Verdict = InNoise
	}
}

// Render is the generated part of docs/benchmarks.md, markers excluded:
// where and how the runs were made, then each table with a column per
// run, the span across runs, the goal and its verdict.
func Render(meta Meta, runs []Run) string {
	var b strings.Builder
	tree := "clean tree"
	if meta.Dirty {
		tree = "with uncommitted changes"
	}
	fmt.Fprintf(&b, "<!-- Written by `make bench-doc`; the next run replaces everything between the markers. -->\n\n")
	fmt.Fprintf(&b, "Measured at commit `%s` (%s) on %s, %d runs back to back.\n", meta.Commit, tree, meta.Date, len(runs))
	if len(runs) > 0 && len(runs[0]) > 0 {
		first := runs[0][0]
		fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s memory; %s, kube-apiserver %s.\n", first.CPUs, meta.CPUModel, meta.Memory, first.GoVersion, meta.APIServer)
	}
	b.WriteString("\n| run | invocations of `frontdesk-bench` | took |\n|---|---|---:|\n")
	for i, run := range runs {
		invocations := make([]string, 0, len(run))
		seconds := 0.0
		for _, rep := range run {
			invocations = append(invocations, "`"+strings.Join(quoteArgs(rep.Args), " ")+"`")
			seconds += rep.Seconds
		}
		fmt.Fprintf(&b, "| %d | %s | %s |\n", i+1, cell(strings.Join(invocations, "; ")), minutes(seconds))
	}
	b.WriteString("\nEach row: each run's figure (in brackets, the run's own 90 % band where the bench computes one; in parentheses, " +
		"what the bench printed beside it), the lowest to highest figure across the runs, the goal, and whether every run meets it " +
		"(met), none does (not met), or some do (within noise), as computed from the unrounded figures and bands.\n")
	for _, s := range Compare(runs) {
		fmt.Fprintf(&b, "\n### %s\n\n", s.Title)
		if s.Note != "" {
			fmt.Fprintf(&b, "%s.\n\n", s.Note)
		}
		b.WriteString("| row |")
		for i := range runs {
			fmt.Fprintf(&b, " run %d |", i+1)
		}
		b.WriteString(" across runs | goal | |\n|---|")
		b.WriteString(strings.Repeat("---:|", len(runs)))
		b.WriteString("---:|---|---|\n")
		for _, l := range s.Lines {
			fmt.Fprintf(&b, "| %s |", cell(l.Name))
			for _, r := range l.Runs {
				fmt.Fprintf(&b, " %s |", cell(runCell(r)))
			}
			goal := ""
			if l.Goal != nil {
				goal = l.Goal.Text
			}
			fmt.Fprintf(&b, " %s | %s | %s |\n", cell(l.span()), cell(goal), l.Verdict)
		}
	}
	return b.String()
}

// span is the line's lowest to highest figure.
func (l Line) span() string {
	if math.IsInf(l.Lo, 0) {
		return "-"
	}
	lo, hi := Figure{Value: l.Lo, Unit: l.Unit}.Format(), Figure{Value: l.Hi, Unit: l.Unit}.Format()
	if lo == hi {
		return lo
	}
	return lo + " – " + hi
}

// runCell is one run's figure, its band and the figures beside it.
func runCell(r *Row) string {
	if r == nil {
		return "-"
	}
	s := r.Format()
	if r.Lo != nil && r.Hi != nil {
		s += " [" + Figure{Value: *r.Lo, Unit: r.Unit}.Format() + ", " + Figure{Value: *r.Hi, Unit: r.Unit}.Format() + "]"
	}
	var more []string
	if r.N > 0 {
		more = append(more, fmt.Sprintf("n %d", r.N))
	}
	for _, f := range r.Detail {
		more = append(more, f.Format())
	}
	if len(more) > 0 {
		s += " (" + strings.Join(more, ", ") + ")"
	}
	return s
}

// cell escapes what would end a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// quoteArgs quotes the empty arguments (--admission "").
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t") {
			a = fmt.Sprintf("%q", a)
		}
		out[i] = a
	}
	return out
}

// minutes is s seconds as "8 min 12 s".
func minutes(s float64) string {
	total := int(math.Round(s))
	if total < 60 {
		return fmt.Sprintf("%d s", total)
	}
	return fmt.Sprintf("%d min %d s", total/60, total%60)
}

// Splice replaces what lies between the markers of doc with generated.
func Splice(doc, generated string) (string, error) {
	i := strings.Index(doc, Begin)
	j := strings.Index(doc, End)
	if i < 0 || j < 0 || j < i {
		return "", fmt.Errorf("the document has no %s ... %s section", Begin, End)
	}
	if strings.Count(doc, Begin) > 1 || strings.Count(doc, End) > 1 {
		return "", errors.New("the document has more than one generated section")
	}
	return doc[:i+len(Begin)] + "\n" + strings.TrimSpace(generated) + "\n" + doc[j:], nil
}

// CPUModel is the first "model name" of /proc/cpuinfo's text ("" if none).
func CPUModel(cpuinfo string) string {
	for line := range strings.SplitSeq(cpuinfo, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// Memory is MemTotal of /proc/meminfo's text, in GiB ("" if none).
func Memory(meminfo string) string {
	for line := range strings.SplitSeq(meminfo, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			var kib float64
			if _, err := fmt.Sscan(f[1], &kib); err == nil {
				return fmt.Sprintf("%.1f GiB", kib/(1<<20))
			}
		}
	}
	return ""
}
