package v1alpha1

import "testing"

func TestPodUIDOf(t *testing.T) {
	const uid = "0b6f8c1e-3d2a-4f5b-9c7e-1a2b3c4d5e6f"
	cases := []struct {
		identity string
		want     string
	}{
		{PodIdentity("web-0", uid, ""), uid},
		{PodIdentity("web-0", uid, "a1b2c3d4"), uid},
		{"web-0_a1b2c3d4", ""},
		{"web-0", ""},
		{"web-0_" + uid[:35], ""},
		{"web-0_" + uid[:8] + "x" + uid[9:], ""},
		{"web-0_zb6f8c1e-3d2a-4f5b-9c7e-1a2b3c4d5e6f", ""},
		{"", ""},
	}
	for _, c := range cases {
		if got := PodUIDOf(c.identity); got != c.want {
			t.Errorf("PodUIDOf(%q) = %q, want %q", c.identity, got, c.want)
		}
	}
	if got := PodNameOf(PodIdentity("web-0", uid, "x")); got != "web-0" {
		t.Errorf("PodNameOf = %q, want web-0", got)
	}
}

func TestMayHold(t *testing.T) {
	cases := []struct {
		annotation string
		want       bool
	}{
		{"billing", true},
		{"payments, billing", true},
		{"*", true},
		{"billing-v2", false},
		{"", false},
	}
	for _, c := range cases {
		if got := MayHold(map[string]string{MayHoldAnnotation: c.annotation}, "billing"); got != c.want {
			t.Errorf("MayHold(%q, billing) = %v, want %v", c.annotation, got, c.want)
		}
	}
	if MayHold(nil, "billing") {
		t.Error("a pod without the annotation may hold")
	}
}
