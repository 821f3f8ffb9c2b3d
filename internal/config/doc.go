// Package config loads rate-limit config files (the envoyproxy/ratelimit
// YAML format plus rls's extensions) into an immutable *Config: files and
// directories within caps, each read with strictyaml, each limit compiled
// into the engine's rule (engine.Compile). It walks a domain's descriptor
// tree for a request (Match, with match.Level at each level; Explain) and
// dumps the config as JSON. A domain's http_descriptors are httpdesc's. It
// knows nothing about stores or transports.
package config
