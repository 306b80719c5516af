package main

import (
	"slices"
	"testing"
)

func TestReportedArgsLeaveOutThisMachinesPaths(t *testing.T) {
	got := reportedArgs([]string{"--iterations", "20", "--report", "out.json", "--assets=/x/k8s", "--admission", "",
		"-cpuprofile", "cpu.prof", "--peers=false", "--price-apiserver-profile", "api.prof"})
	if want := []string{"--iterations", "20", "--admission", "", "--peers=false"}; !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
}
