package compat

import "github.com/rlsproject/rls/internal/config"

// ParseOptions are the config.ParseOptions of envoyproxy/ratelimit's
// files: domains defined in several files merged when mergeDomains
// (MERGE_DOMAIN_CONFIG=true), and the reference's key set (its validKeys)
// tolerated at any level. The reference checks its keys
// without regard to their level and ignores those its structures do not
// hold (unit in a descriptor, name in a document), so such files load
// there; here they load with a warning. Unknown keys are still errors.
func ParseOptions(mergeDomains bool) config.ParseOptions {
	return config.ParseOptions{
		MergeDomains: mergeDomains,
		TolerateKeys: []string{
			"domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit", "unlimited",
			"shadow_mode", "quota_mode", "name", "replaces", "detailed_metric", "value_to_metric",
			"share_threshold", "metadata", "unit_multiplier",
		},
		TolerateReason: "envoyproxy/ratelimit ignores it there too",
	}
}
