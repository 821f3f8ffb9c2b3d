package main

import (
	"io"
	"testing"
)

// TestUIFlag: the operator page is off by default, on with --ui or
// RLS_UI; in the envoyproxy/ratelimit mode only --ui on the command line
// turns it on (the mode reads the reference's environment, not RLS_*).
func TestUIFlag(t *testing.T) {
	for _, tc := range []struct {
		args, env []string
		want      bool
	}{
		{nil, nil, false},
		{[]string{"--ui"}, nil, true},
		{nil, []string{"RLS_UI=true"}, true},
		{[]string{"--ui=false"}, []string{"RLS_UI=true"}, false},
		{[]string{"--compat", "envoy-ratelimit"}, nil, false},
		{[]string{"--compat", "envoy-ratelimit"}, []string{"RLS_UI=true"}, false},
		{[]string{"--compat", "envoy-ratelimit", "--ui"}, nil, true},
	} {
		cfg, err := parseServeFlags(tc.args, tc.env, io.Discard)
		if err != nil {
			t.Errorf("rls serve %q with %q: %v", tc.args, tc.env, err)
			continue
		}
		if cfg.Listeners.UI != tc.want {
			t.Errorf("rls serve %q with %q: UI = %v, want %v", tc.args, tc.env, cfg.Listeners.UI, tc.want)
		}
	}
}
