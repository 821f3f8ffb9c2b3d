package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestParseBad pins the exact errors of every file in testdata/bad.
func TestParseBad(t *testing.T) {
	tests := []struct {
		file    string
		wantErr string
	}{
		{"alias_cycle.yaml", "alias_cycle.yaml:3:5: descriptor \"k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k\": descriptors nested deeper than 16 levels"},
		{"merge_cycle.yaml", "merge_cycle.yaml:3:9: a merge key (<<) brings in the mapping that contains it"},
		{"merge_not_mapping.yaml", "merge_not_mapping.yaml:2:1: unknown key \"base\" in domain (allowed: domain, descriptors, http_descriptors, reservation_key)\n" +
			"merge_not_mapping.yaml:6:19: descriptor \"k\": a merge key (<<) takes mappings, got number 5"},
		{"unit_not_string.yaml", "unit_not_string.yaml:4:24: descriptor \"user\": unit must be a string, got a list"},
		{"alias_text_bomb.yaml", "alias_text_bomb.yaml:7:1044: aliases expand to more than 1054019 bytes of text (the file's size plus 1 MiB): each use of an alias repeats its text"},
		{"alias_bomb.yaml", "alias_bomb.yaml:6:26: aliases expand to more than 100000 nodes (an alias cycle, or an exponential expansion)"},
		{"bad_algorithm.yaml", "bad_algorithm.yaml:4:66: descriptor \"user\": algorithm \"leaky_bucket\" is not one of fixed_window|sliding_window|sliding_log|token_bucket|concurrency"},
		{"bad_unit.yaml", "bad_unit.yaml:4:24: descriptor \"user\": unit \"fortnight\" is not one of second|minute|hour|day|week|month|year"},
		{"bool_wrong.yaml", "bool_wrong.yaml:4:18: descriptor \"user\": shadow_mode must be true or false, got number 1\n" +
			"bool_wrong.yaml:5:17: descriptor \"user\": quota_mode must be true or false, got string \"yes\""},
		{"both_rate_limit.yaml", "both_rate_limit.yaml:5:5: descriptor \"user\": rate_limit and rate_limits are both set (use rate_limits for several limits)"},
		{"burst_not_token_bucket.yaml", "burst_not_token_bucket.yaml:4:55: descriptor \"user\": burst is only for algorithm token_bucket, not fixed_window"},
		{"burst_without_rate.yaml", "burst_without_rate.yaml:4:86: descriptor \"user\": burst 5 needs requests_per_unit above 0 (a token_bucket with requests_per_unit 0 denies every request)"},
		{"burst_zero.yaml", "burst_zero.yaml:4:87: descriptor \"user\": burst must be at least 1 when requests_per_unit is above 0 (a bucket of 0 admits nothing)"},
		{"concurrency_beside_rate_limit.yaml", "concurrency_beside_rate_limit.yaml:5:10: descriptor \"tenant\": a fixed_window limit beside the concurrency limit at 6:10: the release of an acquisition (is_negative_hits) would give its hits back to this limit too; give the concurrency limit a descriptor of its own\n" +
			"concurrency_beside_rate_limit.yaml:7:10: descriptor \"tenant\": a token_bucket limit beside the concurrency limit at 6:10: the release of an acquisition (is_negative_hits) would give its hits back to this limit too; give the concurrency limit a descriptor of its own"},
		{"concurrency_no_lease_ttl.yaml", "concurrency_no_lease_ttl.yaml:4:18: descriptor \"user\": lease_ttl is required for algorithm concurrency: how long an acquisition that is never released holds its slot (a duration such as 30s)"},
		{"descriptors_not_list.yaml", "descriptors_not_list.yaml:3:3: descriptors must be a list, got a mapping"},
		{"domain_in_descriptor.yaml", "domain_in_descriptor.yaml:1:1: domain is required\n" +
			"domain_in_descriptor.yaml:3:5: descriptor \"user\": key \"domain\" is not allowed in a descriptor (it belongs at the top of a document)"},
		{"duplicate_descriptor.yaml", "duplicate_descriptor.yaml:8:5: duplicate descriptor \"user=alice\" (first at 3:5)\n" +
			"duplicate_descriptor.yaml:11:5: duplicate descriptor \"user\" (first at 6:5)"},
		{"duplicate_domain.yaml", "duplicate_domain.yaml:5:9: duplicate domain \"api\" (first defined at duplicate_domain.yaml:1:9)"},
		{"duplicate_key.yaml", "duplicate_key.yaml:7:7: descriptor \"user\": duplicate key \"unit\" (first at 5:7)"},
		{"duplicate_limit.yaml", "duplicate_limit.yaml:7:10: descriptor \"user\": duplicate limit fw60s (same algorithm, window and name as the limit at 5:10)"},
		{"duplicate_wildcard.yaml", "duplicate_wildcard.yaml:7:9: duplicate descriptor \"path/method=/api/*\" (first at 5:9)"},
		{"empty_domain.yaml", "empty_domain.yaml:1:9: domain is empty"},
		{"empty_file.yaml", "empty_file.yaml:1:1: no domain in file (want a mapping with domain: and descriptors:)"},
		{"empty_key.yaml", "empty_key.yaml:3:10: descriptor has empty key\n" +
			"empty_key.yaml:5:5: descriptor has empty key"},
		{"http_bad_header_name.yaml", "http_bad_header_name.yaml:4:40: header_name \"x api key\" is not a valid header name\n" +
			"http_bad_header_name.yaml:5:40: header_name must not be empty"},
		{"http_bad_regex.yaml", "http_bad_regex.yaml:8:50: safe_regex \"/api/(v1\": error parsing regexp: missing closing ): `/api/(v1`"},
		{"http_ignore_case_regex.yaml", "http_ignore_case_regex.yaml:8:57: ignore_case does not apply to safe_regex (start the regex with (?i))"},
		{"http_legacy_matcher.yaml", "http_legacy_matcher.yaml:6:39: exact_match is not supported; write string_match: {exact: ...}"},
		{"http_mask_len.yaml", "http_mask_len.yaml:4:53: v4_prefix_mask_len 33 is out of range (at most 32)\n" +
			"http_mask_len.yaml:4:77: v6_prefix_mask_len must not be negative, got -1"},
		{"http_matcher_two.yaml", "http_matcher_two.yaml:8:40: string_match takes one of exact, prefix, suffix, contains, safe_regex, got exact and prefix\n" +
			"http_matcher_two.yaml:10:38: string_match prefix must not be empty\n" +
			"http_matcher_two.yaml:11:15: a header matcher takes one of string_match and present_match, got both\n" +
			"http_matcher_two.yaml:12:15: a header matcher needs name"},
		{"http_missing_fields.yaml", "http_missing_fields.yaml:4:9: request_headers needs descriptor_key\n" +
			"http_missing_fields.yaml:5:9: query_parameters needs query_parameter_name\n" +
			"http_missing_fields.yaml:6:9: generic_key needs descriptor_value\n" +
			"http_missing_fields.yaml:7:9: header_value_match needs headers"},
		{"http_no_actions.yaml", "http_no_actions.yaml:3:5: http_descriptors item has no actions\n" +
			"http_no_actions.yaml:4:5: http_descriptors item has no actions\n" +
			"http_no_actions.yaml:4:5: unknown key \"stage\" in http_descriptors item (allowed: actions)"},
		{"http_skip_on_generic.yaml", "http_skip_on_generic.yaml:4:44: unknown key \"skip_if_absent\" in generic_key (allowed: descriptor_value, descriptor_key)\n" +
			"http_skip_on_generic.yaml:5:26: unknown key \"descriptor_key\" in remote_address (it takes no keys)"},
		{"http_two_kinds.yaml", "http_two_kinds.yaml:5:9: an action has exactly one kind, got \"remote_address\" and \"generic_key\" (give each its own list item)"},
		{"http_unknown_action.yaml", "http_unknown_action.yaml:4:9: unsupported action \"destination_cluster\" (supported: remote_address|masked_remote_address|request_headers|query_parameters|generic_key|header_value_match)"},
		{"key_at_top.yaml", "key_at_top.yaml:2:1: key \"key\" is not allowed at the top of a document (it belongs in a descriptor)\n" +
			"key_at_top.yaml:3:1: key \"rate_limit\" is not allowed at the top of a document (it belongs in a descriptor)"},
		{"key_in_rate_limit.yaml", "key_in_rate_limit.yaml:3:5: descriptor has empty key\n" +
			"key_in_rate_limit.yaml:4:7: key \"key\" is not allowed in a rate_limit (it belongs in a descriptor)"},
		{"lease_ttl_bad.yaml", "lease_ttl_bad.yaml:4:89: descriptor \"a\": lease_ttl must be a duration (e.g. 1.5s, 2m, 1h30m), got number 30\n" +
			"lease_ttl_bad.yaml:6:89: descriptor \"b\": lease_ttl 0s is not between 1ms and 100 years\n" +
			"lease_ttl_bad.yaml:8:89: descriptor \"c\": lease_ttl 1.5ms is not a whole number of milliseconds\n" +
			"lease_ttl_bad.yaml:10:94: descriptor \"d\": burst is only for algorithm token_bucket, not concurrency\n" +
			"lease_ttl_bad.yaml:12:35: descriptor \"e\": should not specify lease_ttl when unlimited"},
		{"lease_ttl_not_concurrency.yaml", "lease_ttl_not_concurrency.yaml:4:54: descriptor \"user\": lease_ttl is only for algorithm concurrency, not fixed_window\n" +
			"lease_ttl_not_concurrency.yaml:6:78: descriptor \"tenant\": lease_ttl is only for algorithm concurrency, not sliding_log"},
		{"metadata_nan.yaml", "metadata_nan.yaml:5:15: descriptor \"user\": metadata value .nan is not a finite number\n" +
			"metadata_nan.yaml:6:24: descriptor \"user\": duplicate key \"dup\" (first at 6:16)"},
		{"metadata_not_mapping.yaml", "metadata_not_mapping.yaml:4:15: descriptor \"user\": metadata must be a mapping, got a list"},
		{"missing_domain.yaml", "missing_domain.yaml:1:1: domain is required"},
		{"missing_unit.yaml", "missing_unit.yaml:5:7: descriptor \"user\": unit is required (one of second|minute|hour|day|week|month|year), or unlimited: true"},
		{"multiple_errors.yaml", "multiple_errors.yaml:4:24: descriptor \"user\": unit \"fortnight\" is not one of second|minute|hour|day|week|month|year\n" +
			"multiple_errors.yaml:6:51: descriptor \"ip\": requests_per_unit must not be negative, got -5\n" +
			"multiple_errors.yaml:7:5: descriptor \"ip\": unknown key \"shadow\" in descriptor (allowed: key, value, descriptors, rate_limit, rate_limits, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata, count_denied_hits, lease, reserve)\n" +
			"multiple_errors.yaml:8:10: descriptor has empty key"},
		{"negative_rpu.yaml", "negative_rpu.yaml:4:51: descriptor \"user\": requests_per_unit must not be negative, got -1"},
		{"not_mapping.yaml", "not_mapping.yaml:1:1: a document must be a mapping with domain: and descriptors:, got a list"},
		{"overflow_burst.yaml", "overflow_burst.yaml:4:87: descriptor \"user\": burst 99999999999999999999999 is out of range (at most 4294967295)"},
		{"overflow_rpu.yaml", "overflow_rpu.yaml:4:51: descriptor \"user\": requests_per_unit 4294967296 is out of range (at most 4294967295)"},
		{"plural_unit.yaml", "plural_unit.yaml:4:24: descriptor \"user\": unit \"seconds\" is not one of second|minute|hour|day|week|month|year"},
		{"rate_limit_list.yaml", "rate_limit_list.yaml:5:7: descriptor \"user\": rate_limit must be a mapping, got a list (use rate_limits for several limits)"},
		{"rate_limits_empty.yaml", "rate_limits_empty.yaml:4:18: descriptor \"user\": rate_limits is empty (leave it out for a descriptor without limits)"},
		{"replaces_empty.yaml", "replaces_empty.yaml:8:11: descriptor \"user\": replaces item has an empty name"},
		{"replaces_not_mapping.yaml", "replaces_not_mapping.yaml:7:18: descriptor \"user\": each replaces item must be a mapping like {name: other_limit}, got string \"other\""},
		{"replaces_self.yaml", "replaces_self.yaml:10:11: descriptor \"user\": replaces names this limit itself (\"per_user\")"},
		{"rpu_float.yaml", "rpu_float.yaml:4:51: descriptor \"user\": requests_per_unit must be a whole number, got number 1.5"},
		{"rpu_string.yaml", "rpu_string.yaml:4:51: descriptor \"user\": requests_per_unit must be a whole number, got string \"10\""},
		{"share_threshold_no_wildcard.yaml", "share_threshold_no_wildcard.yaml:5:5: descriptor \"path=/api/users\": share_threshold needs a value with a * wildcard, got value \"/api/users\""},
		{"sliding_log_too_big.yaml", "sliding_log_too_big.yaml:4:49: descriptor \"user\": requests_per_unit 200000 is too large for sliding_log (at most 100000: it keeps one entry per hit; use sliding_window)"},
		{"syntax_error.yaml", "syntax_error.yaml:4:1: invalid YAML: did not find expected ',' or '}'"},
		{"tab_indent.yaml", "tab_indent.yaml:3:1: invalid YAML: found character that cannot start any token"},
		{"test_file.yaml", "test_file.yaml:2:1: a test file of rls test (a top-level tests: and no descriptors:), not a config: run it with rls test CONFIG test_file.yaml"},
		{"token_bucket_span.yaml", "token_bucket_span.yaml:4:83: descriptor \"user\": burst 200000 × emission interval 86400000000µs is more than 2^53µs (about 285 years)"},
		{"token_bucket_too_fast.yaml", "token_bucket_too_fast.yaml:4:51: descriptor \"user\": requests_per_unit 2000000 per 1 second is more than one token per microsecond (token_bucket allows at most 1000000 per second)"},
		{"too_deep.yaml", "too_deep.yaml:35:69: descriptor \"k0/k1/k2/k3/k4/k5/k6/k7/k8/k9/k10/k11/k12/k13/k14/k15\": descriptors nested deeper than 16 levels"},
		{"typo_key.yaml", "typo_key.yaml:6:7: descriptor \"user\": unknown key \"requests_per_units\" in rate_limit (did you mean \"requests_per_unit\"?)"},
		{"unit_multiplier_zero.yaml", "unit_multiplier_zero.yaml:4:49: descriptor \"user\": unit_multiplier must be at least 1"},
		{"unit_on_descriptor.yaml", "unit_on_descriptor.yaml:4:5: descriptor \"user\": key \"unit\" is not allowed in a descriptor (it belongs in a rate_limit)\n" +
			"unit_on_descriptor.yaml:5:5: descriptor \"user\": key \"requests_per_unit\" is not allowed in a descriptor (it belongs in a rate_limit)"},
		{"unknown_anchor.yaml", "unknown_anchor.yaml:4:17: invalid YAML: unknown anchor 'per_second' referenced"},
		{"unknown_key.yaml", "unknown_key.yaml:4:5: descriptor \"user\": unknown key \"colour\" in descriptor (allowed: key, value, descriptors, rate_limit, rate_limits, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata, count_denied_hits, lease, reserve)"},
		{"unlimited_in_list.yaml", "unlimited_in_list.yaml:6:10: descriptor \"user\": an unlimited limit must be the only limit of its descriptor"},
		{"unlimited_with_unit.yaml", "unlimited_with_unit.yaml:7:7: descriptor \"user=admin\": should not specify rate limit unit when unlimited\n" +
			"unlimited_with_unit.yaml:9:7: descriptor \"user=admin\": should not specify algorithm when unlimited"},
		{"value_mapping.yaml", "value_mapping.yaml:4:13: value must be a string, got a mapping"},
		{"reserve_bad.yaml", "reserve_bad.yaml:5:64: descriptor \"a\": reserve must be a mapping like {estimate: 4000, ttl: 5m}, got number 4000\n" +
			"reserve_bad.yaml:7:65: descriptor \"b\": reserve needs estimate (the hits a request holds until it settles) and ttl (how long a hold lasts unsettled)\n" +
			"reserve_bad.yaml:9:65: descriptor \"c\": reserve's estimate must be at least 1\n" +
			"reserve_bad.yaml:11:65: descriptor \"d\": reserve's ttl 25h0m0s is not between 1ms and 24h\n" +
			"reserve_bad.yaml:13:65: descriptor \"e\": reserve's ttl 1.5ms is not a whole number of milliseconds\n" +
			"reserve_bad.yaml:15:88: descriptor \"f\": unknown key \"cost\" in reserve (allowed: estimate, ttl)\n" +
			"reserve_bad.yaml:17:65: descriptor \"g\": reserve's estimate 4000 is more than the limit admits at once (1000): every reservation would be denied\n" +
			"reserve_bad.yaml:19:68: descriptor \"h\": reserve is not for lease: true limits: a hold lives in the store until its settle, which a slice decided in process cannot see\n" +
			"reserve_bad.yaml:21:35: descriptor \"i\": should not specify reserve when unlimited\n" +
			"reserve_bad.yaml:22:5: descriptor \"request_id\": key \"request_id\" is the domain's reservation_key: that entry carries a request's id and is never matched against the descriptors"},
		{"reserve_concurrency.yaml", "reserve_concurrency.yaml:5:5: descriptor \"tenant\": reserve is for algorithms fixed_window (calendar: true too), sliding_window, sliding_log and token_bucket; not concurrency, whose acquisitions are holds already (released by is_negative_hits or lease_ttl)"},
		{"reserve_no_key.yaml", "reserve_no_key.yaml:5:49: descriptor \"tenant\": reserve needs the domain's reservation_key: the descriptor entry that carries a request's id (such as request_id), with which a later call settles"},
		{"reservation_key_empty.yaml", "reservation_key_empty.yaml:2:18: reservation_key is empty (the key of the descriptor entry that carries a request's id, such as request_id)"},
		{"window_too_long.yaml", "window_too_long.yaml:4:47: descriptor \"user\": window 101 × year is longer than 100 years"},
	}
	covered := make(map[string]bool)
	for _, tt := range tests {
		covered[tt.file] = true
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "bad", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(tt.file, data)
			if err == nil {
				t.Fatalf("Parse(%s) = %v, nil; want error:\n%s", tt.file, c, tt.wantErr)
			}
			if c != nil {
				t.Errorf("Parse(%s) returned a Config with its error", tt.file)
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("Parse(%s) error is %T, want ErrorList", tt.file, err)
			}
			if got := err.Error(); got != tt.wantErr {
				t.Errorf("Parse(%s) error:\n%s\nwant:\n%s", tt.file, got, tt.wantErr)
			}
		})
	}
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !covered[filepath.Base(f)] {
			t.Errorf("%s has no entry in the table", f)
		}
	}
}

// TestGolden dumps testdata/good.yaml and compares it with
// testdata/good.golden.json; -update rewrites the golden file.
func TestGolden(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("good.yaml", data)
	if err != nil {
		t.Fatalf("Parse(good.yaml): %v", err)
	}
	got, err := c.MarshalJSON()
	if err != nil {
		t.Fatalf("MarshalJSON: %v", err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "good.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("MarshalJSON(good.yaml) differs from %s (run go test -run TestGolden -update and review the diff):\n%s", golden, got)
	}
	again, _ := Parse("good.yaml", data)
	if b, _ := again.MarshalJSON(); !bytes.Equal(append(b, '\n'), got) {
		t.Errorf("MarshalJSON is not stable: two parses of good.yaml dump differently")
	}
}

// TestParseGood checks the fields that the golden dump shows only in part.
func TestParseGood(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("testdata/good.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Files(), []string{"testdata/good.yaml"}; !slices.Equal(got, want) {
		t.Errorf("Files() = %q, want %q", got, want)
	}
	var names []string
	for _, d := range c.Domains() {
		names = append(names, d.Name)
		if d.File != "testdata/good.yaml" {
			t.Errorf("domain %s: File = %q, want testdata/good.yaml", d.Name, d.File)
		}
	}
	if want := []string{"empty", "ext", "llm", "reference"}; !slices.Equal(names, want) {
		t.Errorf("Domains() = %q, want %q (sorted)", names, want)
	}
	if d := c.Domain("nope"); d != nil {
		t.Errorf("Domain(nope) = %v, want nil", d)
	}
	if d := c.Domain("empty"); d == nil || len(d.Descriptors) != 0 || d.HTTPDescriptors != nil {
		t.Errorf("Domain(empty) = %+v, want a domain with no descriptors and nil HTTPDescriptors", d)
	}

	// Limits(): Index is the position; order is file, document, pre-order.
	var labels []string
	for i, l := range c.Limits() {
		if l.Index != i {
			t.Errorf("Limits()[%d].Index = %d", i, l.Index)
		}
		if !slices.Contains(l.Descriptor.Limits, l) {
			t.Errorf("limit %s: not in its Descriptor's Limits", l.Label)
		}
		labels = append(labels, l.Label)
	}
	wantLabels := []string{
		"remote_address/1s", "remote_address=10.0.0.1/unlimited", "user_42", "per_user",
		"path=/api/*/action/1h", "path=/api/*/1d", "per_tenant", "tenant/method=GET/status=200/1mo",
		"tenant/method/1y",
		"api_key/1s", "steady", "daily_quota", "api_key/5m/sliding_log", "api_key/5m/sliding_window", "api_key/5m",
		"tier=gold/1s", "tier=gold/api_key/1d",
		"tokens_per_hour", "tokens_per_day", "tokens_per_minute",
	}
	if !slices.Equal(labels, wantLabels) {
		t.Errorf("labels of Limits() =\n%q\nwant\n%q", labels, wantLabels)
	}

	// Reservations: the domain's key, the descriptor's reserve on its
	// limits, a limit's own instead.
	llm := c.Domain("llm")
	if llm.ReservationKey != "request_id" {
		t.Errorf("llm: reservation_key %q, want request_id", llm.ReservationKey)
	}
	for i, want := range []engine.Reserve{{Estimate: 4000, TTL: 5 * time.Minute}, {Estimate: 8000, TTL: 10 * time.Minute}, {Estimate: 4000, TTL: 5 * time.Minute}} {
		if got := llm.Descriptors[0].Limits[i].Rule.Reserve; got == nil || *got != want {
			t.Errorf("llm limit %d: reserve %+v, want %+v", i, got, want)
		}
	}

	ref := c.Domain("reference")
	if ref.Line != 3 || ref.Column != 1 {
		t.Errorf("reference: position %d:%d, want 3:1 (its first key)", ref.Line, ref.Column)
	}
	status := ref.Descriptors[6].Children[0].Children[0]
	if status.Path != "tenant/method=GET/status=200" || status.Depth != 2 || status.Parent != ref.Descriptors[6].Children[0] ||
		status.Parent.Parent != ref.Descriptors[6] || ref.Descriptors[6].Parent != nil {
		t.Errorf("status node: Path %q Depth %d, or wrong parents", status.Path, status.Depth)
	}
	if status.Line != 45 || status.Column != 13 {
		t.Errorf("status node at %d:%d, want 45:13", status.Line, status.Column)
	}
	month := status.Limits[0]
	if month.Rule.Unit != engine.Month || month.Rule.Window != 30*24*time.Hour || month.ID() != "fw2592000s" || month.Line != 47 || month.Column != 26 {
		t.Errorf("month limit = %+v", month)
	}
	unlimited := ref.Descriptors[1].Limits[0]
	if !unlimited.Unlimited || unlimited.Rule != nil || unlimited.ID() != "unlimited" {
		t.Errorf("unlimited limit = %+v", unlimited)
	}
	if rpu := ref.Descriptors[4].Limits[0].Rule.Limit; rpu != 0 {
		t.Errorf("requests_per_unit: 0 read as %d", rpu)
	}
	wild := ref.Descriptors[4]
	if !wild.Wildcard || !wild.ShareThreshold || !wild.QuotaMode {
		t.Errorf("path=/api/*/action: Wildcard %v ShareThreshold %v QuotaMode %v, want all true", wild.Wildcard, wild.ShareThreshold, wild.QuotaMode)
	}
	md := wild.Metadata
	if md["route"] != "primary" || md["weight"] != 3.0 || !slices.Equal(md["tags"].([]any), []any{"a", "b"}) {
		t.Errorf("metadata = %#v", md)
	}
	if nested := md["nested"].(map[string]any); nested["on"] != true || nested["none"] != nil || len(nested) != 2 {
		t.Errorf("metadata.nested = %#v", nested)
	}
	if !ref.Descriptors[5].ShadowMode || !ref.Descriptors[5].Limits[0].Shadow {
		t.Errorf("shadow_mode: yes: descriptor ShadowMode %v, limit Shadow %v; want both true",
			ref.Descriptors[5].ShadowMode, ref.Descriptors[5].Limits[0].Shadow)
	}
	if !ref.Descriptors[2].DetailedMetric || !ref.Descriptors[3].ValueToMetric {
		t.Errorf("detailed_metric / value_to_metric not read")
	}
	if got := ref.Descriptors[3].Limits[0].Replaces; !slices.Equal(got, []string{"per_tenant"}) {
		t.Errorf("replaces = %q, want [per_tenant]", got)
	}
	if allow := ref.Descriptors[7]; allow.Path != "allowlisted" || len(allow.Limits) != 0 {
		t.Errorf("allowlisted = %+v, want a node with no limits", allow)
	}

	ext := c.Domain("ext")
	apiKey := ext.Descriptors[0].Limits
	if tb := apiKey[0].Rule; tb.Algorithm() != engine.TokenBucket || tb.Burst != 100 || tb.Limit != 50 {
		t.Errorf("token bucket = %+v", tb)
	}
	if steady := apiKey[1].Rule; steady.Burst != 20 || steady.Algorithm() != engine.TokenBucket {
		t.Errorf("steady: Burst %d Algorithm %v, want the default burst 20 and token_bucket", steady.Burst, steady.Algorithm())
	}
	if daily := apiKey[2]; !daily.Shadow || daily.Descriptor.ShadowMode {
		t.Errorf("daily_quota: Shadow %v (want true: its own shadow_mode), descriptor ShadowMode %v (want false)", daily.Shadow, daily.Descriptor.ShadowMode)
	}
	for _, l := range apiKey[3:] {
		if r := l.Rule; r.Window != 5*time.Minute || r.Multiplier != 5 || r.Burst != 0 {
			t.Errorf("%s: Window %v UnitMultiplier %d Burst %d, want 5m, 5, 0", l.ID(), r.Window, r.Multiplier, r.Burst)
		}
	}
	gold := ext.Descriptors[1]
	if l := gold.Limits[0]; l.Rule.Limit != 500 || l.Rule.Burst != 500 || !l.Shadow || l.Rule.Algorithm() != engine.TokenBucket {
		t.Errorf("tier=gold limit (merge key, overrides) = %+v", l)
	}
	if l := gold.Children[0].Limits[0]; l.Shadow {
		t.Errorf("%s: Shadow true; shadow_mode is not inherited by child descriptors", l.Label)
	}

	h := ext.HTTPDescriptors
	if len(h) != 5 {
		t.Fatalf("ext: %d http_descriptors, want 5", len(h))
	}
	// What the items parsed to, seen through what they make of requests.
	build := func(items httpdesc.List, r *httpdesc.StaticRequest) [][]Entry { return items.Build(r, nil) }
	post := build(h[2:4], &httpdesc.StaticRequest{Method: "POST"})
	if want := [][]Entry{entries("generic_key", "writes", "header_match", "post")}; !reflect.DeepEqual(post, want) {
		t.Errorf("items 2 and 3, POST: %v, want %v (:METHOD read as :method, exact POST)", post, want)
	}
	if got := build(h[2:4], &httpdesc.StaticRequest{Method: "post", Headers: map[string]string{"X-Api-Key": "k"}}); !reflect.DeepEqual(got, [][]Entry{entries("api_key", "k")}) {
		t.Errorf("items 2 and 3, post with X-Api-Key: %v, want only api_key=k (exact is case-sensitive; header_name X-Api-Key)", got)
	}
	bot := map[string]string{"user-agent": "a Bot", "x-a": "a1", "x-b": "c", "x-c": "v12"}
	if got := build(h[4:], &httpdesc.StaticRequest{Headers: bot}); got != nil {
		t.Errorf("item 4, every header matching (expect_match: false): %v, want nothing", got)
	}
	for _, c := range []string{"xv12", "v12x"} {
		bot["x-c"] = c
		if got := build(h[4:], &httpdesc.StaticRequest{Headers: bot}); !reflect.DeepEqual(got, [][]Entry{entries("kind", "browser", "not_bot", "yes")}) {
			t.Errorf("item 4, x-c: %s: %v, want kind=browser, not_bot=yes (safe_regex v[0-9]+ matches the whole value only)", c, got)
		}
	}
}

// TestLimitIdentity pins Limit.ID, Label, Window and the defaults of one
// limit per row.
func TestLimitIdentity(t *testing.T) {
	tests := []struct {
		limit      string
		wantID     string
		wantLabel  string
		wantWindow time.Duration
		wantBurst  uint32
	}{
		{"{unit: second, requests_per_unit: 1}", "fw1s", "k/1s", time.Second, 0},
		{"{unit: MINUTE, requests_per_unit: 1}", "fw60s", "k/1m", time.Minute, 0},
		{"{unit: hour, requests_per_unit: 1, algorithm: sliding_window}", "sw3600s", "k/1h", time.Hour, 0},
		{"{unit: day, requests_per_unit: 1, algorithm: sliding_log}", "sl86400s", "k/1d", 24 * time.Hour, 0},
		{"{unit: week, requests_per_unit: 7}", "fw604800s", "k/1w", 7 * 24 * time.Hour, 0},
		{"{unit: month, requests_per_unit: 1}", "fw2592000s", "k/1mo", 30 * 24 * time.Hour, 0},
		{"{unit: year, requests_per_unit: 1}", "fw31536000s", "k/1y", 365 * 24 * time.Hour, 0},
		{"{unit: minute, unit_multiplier: 5, requests_per_unit: 1}", "fw300s", "k/5m", 5 * time.Minute, 0},
		{"{unit: second, unit_multiplier: 90, requests_per_unit: 1}", "fw90s", "k/90s", 90 * time.Second, 0},
		{"{unit: second, requests_per_unit: 5, algorithm: token_bucket}", "tb1s", "k/1s", time.Second, 5},
		{"{unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 5, name: burst}", "tb1s:5:burst", "burst", time.Second, 5},
		{"{unit: second, requests_per_unit: 0, algorithm: token_bucket}", "tb1s", "k/1s", time.Second, 0},
		{"{unit: second, requests_per_unit: 1000000, algorithm: token_bucket}", "tb1s", "k/1s", time.Second, 1000000},
		{"{unit: year, unit_multiplier: 100, requests_per_unit: 1}", "fw3153600000s", "k/100y", 100 * 365 * 24 * time.Hour, 0},
		{"{unit: hour, requests_per_unit: 100000, algorithm: sliding_log}", "sl3600s", "k/1h", time.Hour, 0},
		{"{unit: second, requests_per_unit: 1, name: \"ünï:{x}\"}", "fw1s:9:ünï:{x}", "ünï:{x}", time.Second, 0},
		{"{unlimited: true, name: vip}", "unlimited:3:vip", "vip", 0, 0},
	}
	for _, tt := range tests {
		c := parseString(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tt.limit+"\n")
		l := c.Limits()[0]
		var window time.Duration
		var burst uint32
		if l.Rule != nil {
			window, burst = l.Rule.Window, l.Rule.Burst
		}
		if l.ID() != tt.wantID || l.Label != tt.wantLabel || window != tt.wantWindow || burst != tt.wantBurst {
			t.Errorf("rate_limit: %s: ID %q Label %q Window %v Burst %d; want %q %q %v %d",
				tt.limit, l.ID(), l.Label, window, burst, tt.wantID, tt.wantLabel, tt.wantWindow, tt.wantBurst)
		}
	}
}

// TestParseDocuments: several documents per file, empty documents skipped,
// domains of one file in document order.
func TestParseDocuments(t *testing.T) {
	c := parseString(t, "---\ndomain: b\ndescriptors: [{key: x, rate_limit: {unit: second, requests_per_unit: 1}}]\n"+
		"---\n---\ndomain: a\ndescriptors: [{key: y, rate_limit: {unit: second, requests_per_unit: 1}}]\n---\n")
	var got []string
	for _, l := range c.Limits() {
		got = append(got, l.Label)
	}
	if want := []string{"x/1s", "y/1s"}; !slices.Equal(got, want) {
		t.Errorf("Limits() = %q, want %q (document order)", got, want)
	}
	if a := c.Domain("a"); a == nil || a.Line != 6 {
		t.Errorf("Domain(a) = %+v, want one at line 6", a)
	}
}

// TestParseReportsAllProblems: problems in several documents and at several
// levels all come back, in line order.
func TestParseReportsAllProblems(t *testing.T) {
	_, err := Parse("f.yaml", []byte(`domain: a
descriptors:
  - key: k
    rate_limit: {unit: lightyear}
---
domain: b
bogus: 1
descriptors:
  - key: k
    descriptors:
      - key: j
        rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}
`))
	want := `f.yaml:4:24: descriptor "k": unit "lightyear" is not one of second|minute|hour|day|week|month|year
f.yaml:7:1: unknown key "bogus" in domain (allowed: domain, descriptors, http_descriptors, reservation_key)
f.yaml:12:69: descriptor "k/j": algorithm "magic" is not one of fixed_window|sliding_window|sliding_log|token_bucket|concurrency`
	if err == nil || err.Error() != want {
		t.Errorf("Parse error:\n%v\nwant:\n%s", err, want)
	}
}

// TestParseLenientScalars: what yaml.v2 (and so envoyproxy/ratelimit)
// accepts for strings and booleans is accepted too.
func TestParseLenientScalars(t *testing.T) {
	c := parseString(t, `domain: 7
descriptors:
  - key: code
    value: 404
    shadow_mode: on
    quota_mode: True
    rate_limit: {unit: second, requests_per_unit: 0x10}
  - key: flag
    value: true
    detailed_metric: NO
    rate_limit: {unit: second, requests_per_unit: 1_000}
`)
	d := c.Domain("7")
	if d == nil {
		t.Fatalf("domain: 7 not read as \"7\"; domains %v", c.Domains())
	}
	code, flagNode := d.Descriptors[0], d.Descriptors[1]
	if code.Value != "404" || !code.ShadowMode || !code.QuotaMode || code.Limits[0].Rule.Limit != 16 {
		t.Errorf("code = %+v, limit %+v", code, code.Limits[0])
	}
	if flagNode.Value != "true" || flagNode.DetailedMetric || flagNode.Limits[0].Rule.Limit != 1000 {
		t.Errorf("flag = %+v, limit %+v", flagNode, flagNode.Limits[0])
	}
}

// TestParseDeepestAllowed: 16 levels load; TestParseBad/too_deep.yaml has 17.
func TestParseDeepestAllowed(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range MaxDepth {
		indent := strings.Repeat("    ", i)
		b.WriteString(indent + "  - key: k\n")
		if i < MaxDepth-1 {
			b.WriteString(indent + "    descriptors:\n")
		}
	}
	c := parseString(t, b.String())
	entries := make([]Entry, MaxDepth)
	for i := range entries {
		entries[i] = Entry{Key: "k", Value: "v"}
	}
	if n := c.Domain("d").Match(entries); n == nil || n.Depth != MaxDepth-1 {
		t.Errorf("Match(16 entries) = %v, want the node at depth 15", n)
	}
}

// envoyproxy/ratelimit accepts requests_per_unit next to unlimited: true and
// ignores it; such files must load here too.
func TestUnlimitedIgnoresRequestsPerUnit(t *testing.T) {
	cfg, err := Parse("u.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatalf("Parse = %v, want the file accepted as the reference accepts it", err)
	}
	l := cfg.Domain("d").Descriptors[0].Limits[0]
	if !l.Unlimited || l.Rule != nil {
		t.Errorf("limit = %+v, want unlimited with requests_per_unit ignored", l)
	}
}

// TestParseNumbers: whole numbers in every form yaml.v3 reads as an
// integer, and the bounds, one per row.
func TestParseNumbers(t *testing.T) {
	tests := []struct {
		rpu     string
		want    uint32
		wantErr string
	}{
		{"10", 10, ""},
		{"+10", 10, ""},
		{"1_000", 1000, ""},
		{"0x10", 16, ""},
		{"0o17", 15, ""},
		{"017", 15, ""},
		{"0b101", 5, ""},
		{"4294967295", 4294967295, ""},
		{"4294967296", 0, "requests_per_unit 4294967296 is out of range (at most 4294967295)"},
		{"18446744073709551615", 0, "requests_per_unit 18446744073709551615 is out of range (at most 4294967295)"},
		{"-0x1", 0, "requests_per_unit must not be negative, got -1"},
		{"1e3", 0, "requests_per_unit must be a whole number, got number 1e3"},
	}
	for _, tt := range tests {
		c, err := Parse("n.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: "+tt.rpu+"}\n"))
		if tt.wantErr != "" {
			if want := `n.yaml:4:51: descriptor "k": ` + tt.wantErr; err == nil || err.Error() != want {
				t.Errorf("requests_per_unit: %s: error %v, want %s", tt.rpu, err, want)
			}
			continue
		}
		if err != nil || c.Limits()[0].Rule.Limit != tt.want {
			t.Errorf("requests_per_unit: %s: %v, %v; want %d", tt.rpu, c, err, tt.want)
		}
	}
}

// TestParseBigMappings: duplicate keys are found in mappings of any size,
// merged ones included.
func TestParseBigMappings(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: a\n    metadata: &big\n")
	for i := range 100 {
		fmt.Fprintf(&b, "      k%d: %d\n", i, i)
	}
	b.WriteString("      k42: again\n  - key: b\n    metadata: {<<: *big, k7: mine}\n")
	_, err := Parse("big.yaml", []byte(b.String()))
	// Reported where the mapping is used, and again where it is merged.
	want := `big.yaml:105:7: descriptor "a": duplicate key "k42" (first at 47:7)` + "\n" +
		`big.yaml:105:7: descriptor "b": duplicate key "k42" (first at 47:7)`
	if err == nil || err.Error() != want {
		t.Errorf("Parse(metadata of 100 keys and a duplicate) error = %v, want %s", err, want)
	}
	// Without the duplicate: the merged mapping's keys, the explicit one winning.
	c := parseString(t, strings.Replace(b.String(), "      k42: again\n", "", 1))
	md := c.Domain("d").Descriptors[1].Metadata
	if len(md) != 100 || md["k7"] != "mine" || md["k99"] != 99.0 {
		t.Errorf("metadata merged from 100 keys = %d keys, k7 %v, k99 %v; want 100, mine, 99", len(md), md["k7"], md["k99"])
	}
}

func TestCountDeniedHits(t *testing.T) {
	cfg, err := Parse("cd.yaml", []byte(`
domain: llm
descriptors:
  - key: tenant
    count_denied_hits: true
    rate_limits:
      - {unit: hour, requests_per_unit: 1000}
      - {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limits:
      - {unit: hour, requests_per_unit: 1000, count_denied_hits: true}
      - {unit: minute, requests_per_unit: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want []bool
	}{{"tenant", []bool{true, true}}, {"user", []bool{true, false}}} {
		node := cfg.Domain("llm").Match([]Entry{{Key: tc.key, Value: "x"}})
		for i, l := range node.Limits {
			if l.CountDeniedHits != tc.want[i] {
				t.Errorf("%s limit %d: CountDeniedHits = %v, want %v", tc.key, i, l.CountDeniedHits, tc.want[i])
			}
		}
	}
}

func TestCalendar(t *testing.T) {
	cfg, err := Parse("cal.yaml", []byte(`
domain: quota
descriptors:
  - key: tenant
    rate_limits:
      - {unit: month, requests_per_unit: 1000, calendar: true, time_zone: Europe/Paris}
      - {unit: month, requests_per_unit: 1000}
      - {unit: day, requests_per_unit: 100, calendar: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	ls := cfg.Domain("quota").Match([]Entry{{Key: "tenant", Value: "a"}}).Limits
	if ls[0].Rule.Calendar == nil || ls[0].Rule.Calendar.String() != "Europe/Paris" || ls[0].ID() != "cal.month@Europe/Paris" {
		t.Errorf("calendar month in Paris: Calendar %v, ID %q", ls[0].Rule.Calendar, ls[0].ID())
	}
	if ls[1].Rule.Calendar != nil || ls[1].ID() == ls[0].ID() || ls[1].Label == ls[0].Label {
		t.Errorf("a plain month (30 days) must be another counter and label: %q %q / %q %q", ls[1].ID(), ls[1].Label, ls[0].ID(), ls[0].Label)
	}
	if ls[2].Rule.Calendar != time.UTC {
		t.Errorf("calendar without time_zone: %v, want UTC", ls[2].Rule.Calendar)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"{unit: hour, requests_per_unit: 1, calendar: true}", "calendar: true needs unit day, week, month or year"},
		{"{unit: day, requests_per_unit: 1, calendar: true, algorithm: token_bucket}", "calendar: true is for algorithm fixed_window"},
		{"{unit: day, requests_per_unit: 1, calendar: true, unit_multiplier: 2}", "unit_multiplier must be 1"},
		{"{unit: day, requests_per_unit: 1, calendar: true, time_zone: Mars/Olympus}", `time_zone "Mars/Olympus" is not an IANA time zone`},
		{"{unit: day, requests_per_unit: 1, time_zone: UTC}", "time_zone is only for calendar: true limits"},
	} {
		_, err := Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+bad.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error containing %q", bad.yaml, err, bad.want)
		}
	}
}

// lease: true leases a limit, or every limit of its descriptor; the
// algorithms whose counters a slice cannot be taken from are refused at
// the key that asks, naming the ones that can.
func TestLease(t *testing.T) {
	cfg, err := Parse("lease.yaml", []byte(`
domain: d
descriptors:
  - key: tenant
    lease: true
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 1000, calendar: true}
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: token_bucket, lease: true}
      - {unit: minute, requests_per_unit: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key   string
		lease []bool
	}{{"tenant", []bool{true, true}}, {"user", []bool{true, false}}} {
		ls := cfg.Domain("d").Match([]Entry{{Key: c.key, Value: "x"}}).Limits
		for i, l := range ls {
			if l.Rule.Lease != c.lease[i] {
				t.Errorf("%s limit %d: Lease %v, want %v", c.key, i, l.Rule.Lease, c.lease[i])
			}
		}
	}
	for _, bad := range []struct{ yaml, want string }{
		{"rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_window, lease: true}", "4:81: descriptor \"k\": lease: true is for algorithms fixed_window (calendar: true too) and token_bucket; not sliding_window"},
		{"lease: true\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_log}", "not sliding_log"},
		{"rate_limit: {unit: second, requests_per_unit: 1, lease: 3}", "lease"},
	} {
		_, err := Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    "+bad.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error containing %q", bad.yaml, err, bad.want)
		}
	}
}
