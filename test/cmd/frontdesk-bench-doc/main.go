// Command frontdesk-bench-doc rewrites the generated part of
// docs/benchmarks.md (between its bench:begin and bench:end markers) from
// the reports of runs of frontdesk-bench (--report): the commit and the
// machine, then every table with a column per run, the span across runs,
// the goal and whether it is met. `make bench-doc` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/frontdesk-dev/frontdesk/test/bench/report"
)

func main() {
	doc := flag.String("doc", "docs/benchmarks.md", "The document to rewrite (run from the repository's root).")
	assets := flag.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "Directory with the kube-apiserver the runs used (default: $KUBEBUILDER_ASSETS).")
	var runs []report.Run
	flag.Func("run", "One run's reports, comma-separated, in order (the main bench, then the guard's price); once per run.", func(v string) error {
		var run report.Run
		for path := range strings.SplitSeq(v, ",") {
			r, err := report.Read(path)
			if err != nil {
				return err
			}
			run = append(run, r)
		}
		runs = append(runs, run)
		return nil
	})
	flag.Parse()
	if len(runs) == 0 {
		fail(fmt.Errorf("no --run given"))
	}
	meta, err := describe(*doc, *assets)
	if err != nil {
		fail(err)
	}
	text, err := os.ReadFile(*doc)
	if err != nil {
		fail(err)
	}
	out, err := report.Splice(string(text), report.Render(meta, runs))
	if err != nil {
		fail(fmt.Errorf("%s: %w", *doc, err))
	}
	if err := os.WriteFile(*doc, []byte(out), 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("%s: the tables of %d runs at %s\n", *doc, len(runs), meta.Commit)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "frontdesk-bench-doc:", err)
	os.Exit(1)
}

// describe is the commit, whether the tree has changes other than doc
// (which this command writes), today's date and the machine.
func describe(doc, assets string) (report.Meta, error) {
	meta := report.Meta{Date: time.Now().UTC().Format(time.DateOnly)}
	commit, err := output("git", "rev-parse", "--short", "HEAD")
	if err != nil {
		return meta, err
	}
	meta.Commit = commit
	if meta.Dirty, err = changedBesides(doc); err != nil {
		return meta, err
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		meta.CPUModel = report.CPUModel(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		meta.Memory = report.Memory(string(b))
	}
	meta.APIServer = "(version unknown)"
	if v, err := output(filepath.Join(assets, "kube-apiserver"), "--version"); err == nil {
		meta.APIServer = strings.TrimPrefix(v, "Kubernetes ")
	}
	return meta, nil
}

// changedBesides says whether the work tree has changes (untracked files
// included) other than to doc.
func changedBesides(doc string) (bool, error) {
	top, err := output("git", "rev-parse", "--show-toplevel")
	if err != nil {
		return false, err
	}
	abs, err := filepath.Abs(doc)
	if err != nil {
		return false, err
	}
	rel, err := filepath.Rel(top, abs)
	if err != nil {
		return false, err
	}
	status, err := output("git", "status", "--porcelain")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(status, "\n") {
		if len(line) > 3 && line[3:] != filepath.ToSlash(rel) {
			return true, nil
		}
	}
	return false, nil
}

// output runs a command and returns its trimmed standard output.
func output(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
