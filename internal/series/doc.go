// Package series keeps Prometheus counter series whose label values come
// from a config that reloads: a series is made on its first use, a reload
// keeps the series of the labels that the new config still has (the same
// counters) and deletes the others, and where request values make a label,
// a group caps the distinct series and counts the rest in one overflow
// series. It knows nothing of rls's config, requests or service: label
// values are strings handed to it, and it imports only Prometheus's client.
package series
