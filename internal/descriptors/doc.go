// Package descriptors parses and validates rate-limit config files (the
// envoyproxy/ratelimit YAML format plus rls's extensions) into an immutable
// *Config, matches request descriptors against its trees without allocating,
// and builds descriptors from HTTP requests with a domain's http_descriptors.
// It knows nothing about counting, stores or transports.
package descriptors

// The IANA time zone database is embedded, so that calendar limits load on
// machines (and distroless images) without /usr/share/zoneinfo.
import _ "time/tzdata"
