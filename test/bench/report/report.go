// Package report is a bench run's results in a form a program reads
// (frontdesk-bench --report FILE writes one), and what compares runs with
// each other and with the goals: the generated tables of
// docs/benchmarks.md.
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
)

// Report is one invocation of the bench: every table it printed, a row for
// each figure printed, and the goal of the rows that have one.
type Report struct {
	// Args are the bench's flags.
	Args []string `json:"args"`
	// GoVersion and CPUs are the bench's runtime.Version and NumCPU.
	GoVersion string `json:"goVersion"`
	CPUs      int    `json:"cpus"`
	// Seconds is how long the run took.
	Seconds float64 `json:"seconds"`
	Tables  []Table `json:"tables"`
}

// Table is one table of the console output.
type Table struct {
	Title string `json:"title"`
	// Note says what every row of the table shares (sizes, units).
	Note string `json:"note,omitempty"`
	Rows []Row  `json:"rows"`
}

// Row is one measured figure, the figures printed beside it, and its goal.
type Row struct {
	Name string `json:"name"`
	// N is how many samples Value stands on (0: not a sample count).
	N int `json:"n,omitempty"`
	Figure
	// Lo and Hi are Value's 90 % band within this run, where the bench
	// computes one (the guard's price).
	Lo *float64 `json:"lo,omitempty"`
	Hi *float64 `json:"hi,omitempty"`
	// Detail are the other figures printed on the same line.
	Detail []Figure `json:"detail,omitempty"`
	Goal   *Goal    `json:"goal,omitempty"`
}

// Figure is a value with its unit.
type Figure struct {
	Label string  `json:"label,omitempty"`
	Value float64 `json:"value"`
	Unit  Unit    `json:"unit"`
}

// Unit says what a Figure counts, and how it is printed.
type Unit string

// The units of the bench's figures.
const (
	Millis   Unit = "ms"   // a latency
	Seconds  Unit = "s"    // a longer latency (failover)
	Ratio    Unit = "x"    // one figure over another
	Delta    Unit = "Δms"  // one latency minus another
	PerSec   Unit = "/s"   // operations per second
	PerGrant Unit = "each" // requests per grant, renewal or admission
	Count    Unit = "n"    // a whole number
)

// Format prints f as the docs show it (the console's precision).
func (f Figure) Format() string {
	v := f.Value
	s := ""
	switch f.Unit {
	case Millis:
		s = fmt.Sprintf("%.2f ms", v)
	case Seconds:
		s = fmt.Sprintf("%.3f s", v)
	case Ratio:
		s = fmt.Sprintf("%.2fx", v)
	case Delta:
		s = fmt.Sprintf("%+.2f ms", v)
	case PerSec:
		if math.Abs(v) >= 100 {
			s = fmt.Sprintf("%.0f/s", v)
		} else {
			s = fmt.Sprintf("%.1f/s", v)
		}
	case Count:
		s = fmt.Sprintf("%.0f", v)
	case PerGrant:
		s = fmt.Sprintf("%.2f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	if f.Label != "" {
		return f.Label + " " + s
	}
	return s
}

// Goal is what a Row's Value should be.
type Goal struct {
	// Cmp is how Value compares with Bound when the goal is met: "<=",
	// "<" or ">=".
	Cmp   string  `json:"cmp"`
	Bound float64 `json:"bound"`
	// Text is the goal as docs/benchmarks.md states it.
	Text string `json:"text"`
}

// AtMost is the goal of a Value no higher than bound.
func AtMost(bound float64, text string) *Goal { return &Goal{Cmp: "<=", Bound: bound, Text: text} }

// Below is the goal of a Value lower than bound.
func Below(bound float64, text string) *Goal { return &Goal{Cmp: "<", Bound: bound, Text: text} }

// AtLeast is the goal of a Value no lower than bound.
func AtLeast(bound float64, text string) *Goal { return &Goal{Cmp: ">=", Bound: bound, Text: text} }

// Verdict says whether a goal is met over several runs.
type Verdict string

// The verdicts of Goal.Judge.
const (
	Met     Verdict = "met"
	NotMet  Verdict = "not met"
	InNoise Verdict = "within noise"
)

// ok says whether v meets the goal.
func (g Goal) ok(v float64) bool {
	switch g.Cmp {
	case "<":
		return v < g.Bound
	case ">=":
		return v >= g.Bound
	default:
		return v <= g.Bound
	}
}

// Judge is the goal's verdict on the span lo..hi of what the runs measured
// (each run's figure, and its band where it has one): met when all of it
// meets the goal, not met when none of it does, within noise otherwise.
func (g Goal) Judge(lo, hi float64) Verdict {
	switch okLo, okHi := g.ok(lo), g.ok(hi); {
	case okLo && okHi:
		return Met
	case !okLo && !okHi:
		return NotMet
	default:
		return InNoise
	}
}

// Write writes r to path as indented JSON.
func (r Report) Write(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Read reads a report written by Write.
func Read(path string) (Report, error) {
	var r Report
	data, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("reading report %s: %w", path, err)
	}
	return r, nil
}
