// Package config parses and validates rate-limit config files (the
// envoyproxy/ratelimit YAML format plus rls's extensions) into an immutable
// *Config, compiling each limit into the engine's rule (engine.Compile);
// matches request descriptors against its trees without allocating; and
// builds descriptors from HTTP requests with a domain's http_descriptors.
// It knows nothing about stores or transports.
package config
