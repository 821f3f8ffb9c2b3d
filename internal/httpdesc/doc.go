// Package httpdesc is a domain's http_descriptors: how /auth/{domain} and
// ext_authz make rate-limit descriptors of an HTTP request, written like
// Envoy's route rate-limit actions. It reads the grammar (with
// strictyaml, inside a config file), evaluates it on a request (Build),
// says why an item made nothing (Explain) and writes its part of the
// config dump. It knows nothing of limits or of how descriptors match
// them, nor of any transport: a request is what Request says.
package httpdesc
