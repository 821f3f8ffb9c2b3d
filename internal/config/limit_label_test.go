package config

import "testing"

// TestLabelsOfOneWindowDiffer: unnamed limits of one descriptor with the
// same window and different algorithms get different labels (their metrics
// would merge otherwise); a lone limit keeps the bare label.
func TestLabelsOfOneWindowDiffer(t *testing.T) {
	cfg, err := Parse("l.yaml", []byte(`
domain: d
descriptors:
  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 5}
      - {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range cfg.Limits() {
		got = append(got, l.Label)
	}
	want := []string{"a/1m", "a/1m/sliding_window", "a/1m/token_bucket", "a/1h"}
	if len(got) != len(want) {
		t.Fatalf("labels %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("labels %q, want %q", got, want)
			break
		}
	}
}
