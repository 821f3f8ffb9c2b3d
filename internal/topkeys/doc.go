// Package topkeys keeps, per configured limit, the keys (counters) that
// the current window denies most and the fullest ones, in a bounded sketch
// whatever the number of distinct keys (Space-Saving for denials, a
// bounded top list for fullness), as a service.Observer that the running
// server installs. It answers who is being limited (Keys.Top), merging the
// summaries that other processes sharing the store publish on a Board.
//
// It knows no wire protocol and no store: the Board is what the running
// server gives it (a small shared board on Redis), and the HTTP endpoint
// and rls top are its clients.
package topkeys
