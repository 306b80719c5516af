package report

import (
	"strings"
	"testing"
)

func band(lo, hi float64) (*float64, *float64) { return &lo, &hi }

// runOf is one run of one invocation with a single table.
func runOf(rows ...Row) Run {
	return Run{{Args: []string{"--iterations", "20", "--admission", ""}, GoVersion: "go1.26.8", CPUs: 2, Seconds: 125,
		Tables: []Table{{Title: "Latencies", Note: "Each row's p50", Rows: rows}}}}
}

func ratioRow(name string, v float64, goal *Goal) Row {
	return Row{Name: name, Figure: Figure{Value: v, Unit: Ratio}, Goal: goal}
}

func TestCompareJudgesEachGoalOverTheRuns(t *testing.T) {
	crowd := AtMost(1.3, "at most 1.3x")
	lo1, hi1 := band(1.05, 1.12)
	lo2, hi2 := band(1.08, 1.21)
	run1 := runOf(
		Row{Name: "acquire", N: 270, Figure: Figure{Label: "p50", Value: 6.124, Unit: Millis}, Detail: []Figure{{Label: "p99", Value: 19.1, Unit: Millis}}},
		ratioRow("50 waiters over 1", 1.10, crowd),
		ratioRow("200 waiters over 1", 1.25, crowd),
		ratioRow("10 waiters over 1", 1.35, crowd),
		Row{Name: "guarded acquire", Figure: Figure{Value: 1.09, Unit: Ratio}, Lo: lo1, Hi: hi1, Goal: AtMost(1.15, "at most +15 %")},
		Row{Name: "throughput", Figure: Figure{Value: 0.95, Unit: Ratio}, Goal: AtLeast(0.9, "at least 0.90x")},
		Row{Name: "handoff over etcd's", Figure: Figure{Value: 1, Unit: Ratio}, Goal: Below(1, "below 1x")},
		Row{Name: "only in run 1", Figure: Figure{Value: 3, Unit: PerGrant}},
	)
	run2 := runOf(
		Row{Name: "acquire", N: 270, Figure: Figure{Label: "p50", Value: 5.9, Unit: Millis}},
		ratioRow("50 waiters over 1", 1.20, crowd),
		ratioRow("200 waiters over 1", 1.41, crowd),
		ratioRow("10 waiters over 1", 1.31, crowd),
		Row{Name: "guarded acquire", Figure: Figure{Value: 1.12, Unit: Ratio}, Lo: lo2, Hi: hi2, Goal: AtMost(1.15, "at most +15 %")},
		Row{Name: "throughput", Figure: Figure{Value: 0.92, Unit: Ratio}, Goal: AtLeast(0.9, "at least 0.90x")},
		Row{Name: "handoff over etcd's", Figure: Figure{Value: 1.2, Unit: Ratio}, Goal: Below(1, "below 1x")},
	)
	sections := Compare([]Run{run1, run2})
	if len(sections) != 1 || sections[0].Title != "Latencies" {
		t.Fatalf("sections: %+v", sections)
	}
	want := []struct {
		name    string
		span    string
		verdict Verdict
	}{
		{"acquire", "5.90 ms – 6.12 ms", ""},
		{"50 waiters over 1", "1.10x – 1.20x", Met},
		{"200 waiters over 1", "1.25x – 1.41x", InNoise},
		{"10 waiters over 1", "1.31x – 1.35x", NotMet},
		{"guarded acquire", "1.09x – 1.12x", InNoise}, // both figures meet it, run 2's band does not
		{"throughput", "0.92x – 0.95x", Met},
		{"handoff over etcd's", "1.00x – 1.20x", NotMet}, // 1x is not below 1x
		{"only in run 1", "3.00", ""},
	}
	lines := sections[0].Lines
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(lines), len(want))
	}
	for i, w := range want {
		l := lines[i]
		if l.Name != w.name || l.span() != w.span || l.Verdict != w.verdict {
			t.Errorf("line %d: %s, %s, %q; want %s, %s, %q", i, l.Name, l.span(), l.Verdict, w.name, w.span, w.verdict)
		}
	}
	if lines[7].Runs[1] != nil {
		t.Errorf("a row run 2 did not measure has a figure there: %+v", lines[7].Runs[1])
	}
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		goal   *Goal
		lo, hi float64
		want   Verdict
	}{
		{AtMost(1, ""), 0.5, 1, Met},
		{AtMost(1, ""), 0.5, 1.01, InNoise},
		{AtMost(1, ""), 1.01, 2, NotMet},
		{AtMost(0, ""), 0, 0, Met},
		{Below(1, ""), 0.5, 0.99, Met},
		{Below(1, ""), 1, 1, NotMet},
		{AtLeast(0.9, ""), 0.9, 1.2, Met},
		{AtLeast(0.9, ""), 0.8, 1.2, InNoise},
		{AtLeast(0.9, ""), 0.6, 0.89, NotMet},
	} {
		if got := tc.goal.Judge(tc.lo, tc.hi); got != tc.want {
			t.Errorf("%s %g on %g..%g: %q, want %q", tc.goal.Cmp, tc.goal.Bound, tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestRenderWritesATablePerSectionWithAColumnPerRun(t *testing.T) {
	lo, hi := band(1.05, 1.21)
	run1 := runOf(Row{Name: "acquire | release", N: 270, Figure: Figure{Label: "p50", Value: 6.124, Unit: Millis},
		Detail: []Figure{{Label: "p99", Value: 19.1, Unit: Millis}}},
		Row{Name: "guarded", Figure: Figure{Value: 1.1, Unit: Ratio}, Lo: lo, Hi: hi, Goal: AtMost(1.15, "at most +15 %")})
	run2 := runOf(Row{Name: "acquire | release", N: 270, Figure: Figure{Label: "p50", Value: 5.9, Unit: Millis}},
		Row{Name: "guarded", Figure: Figure{Value: 1.12, Unit: Ratio}, Goal: AtMost(1.15, "at most +15 %")})
	got := Render(Meta{Commit: "abc1234", Dirty: true, Date: "2026-12-07", CPUModel: "Some CPU", Memory: "23.4 GiB", APIServer: "v1.37.2"},
		[]Run{run1, run2})
	for _, want := range []string{
		"Measured at commit `abc1234` (with uncommitted changes) on 2026-12-07, 2 runs back to back.",
		"Machine: 2 CPUs (Some CPU), 23.4 GiB memory; go1.26.8, kube-apiserver v1.37.2.",
		"| 1 | `--iterations 20 --admission \"\"` | 2 min 5 s |",
		"### Latencies\n\nEach row's p50.\n\n| row | run 1 | run 2 | across runs | goal | |\n|---|---:|---:|---:|---|---|\n",
		"| acquire \\| release | p50 6.12 ms (n 270, p99 19.10 ms) | p50 5.90 ms (n 270) | 5.90 ms – 6.12 ms |  |  |\n",
		"| guarded | 1.10x [1.05x, 1.21x] | 1.12x | 1.10x – 1.12x | at most +15 % | within noise |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
}

func TestSplice(t *testing.T) {
	doc := "# Benchmarks\n\n" + Begin + "\nRun `make bench-doc`.\n" + End + "\n\n## Rerun\n"
	got, err := Splice(doc, "tables\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Benchmarks\n\n" + Begin + "\ntables\n" + End + "\n\n## Rerun\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	again, err := Splice(got, "other tables")
	if err != nil || !strings.Contains(again, Begin+"\nother tables\n"+End) || strings.Contains(again, "\ntables\n") {
		t.Errorf("a second run does not replace the first's tables: %q, %v", again, err)
	}
	for _, bad := range []string{"# no markers\n", End + "\n" + Begin + "\n", doc + doc} {
		if _, err := Splice(bad, "x"); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

func TestMachine(t *testing.T) {
	cpuinfo := "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  7B13 64-Core Processor\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n"
	if got := CPUModel(cpuinfo); got != "AMD EPYC 7B13 64-Core Processor" {
		t.Errorf("CPUModel: %q", got)
	}
	if got := Memory("MemTotal:       24588876 kB\nMemFree:         1234 kB\n"); got != "23.4 GiB" {
		t.Errorf("Memory: %q", got)
	}
	if CPUModel("") != "" || Memory("") != "" {
		t.Error("a model or memory from nothing")
	}
}
