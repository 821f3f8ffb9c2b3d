// Package overrides keeps runtime overrides of configured limits: an
// override names a domain, a request descriptor's entries (a value ending
// in '*' stands for every value with that prefix) and optionally one limit
// by name, and gives those limits another requests_per_unit (and burst),
// on the same counters, until it is deleted or expires. It checks them
// against the loaded config, indexes them per config (Table: what the
// service consults in each decision, without allocating), and keeps them
// where every process sharing the counters finds them (a Backend: Redis,
// or this process's memory with an optional file), following the changes
// that other processes make (Keeper).
//
// It knows the config and the engine's rules; it knows no store, no wire
// protocol and no transport: a Backend hands it records as bytes.
package overrides
