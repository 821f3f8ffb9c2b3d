package engine

import (
	"strings"
	"time"
)

// Unit is the time unit of a limit's window. The zero value is UnitUnknown,
// which no rule has. Month and year are fixed blocks of 30 and 365 days, as
// in Envoy and envoyproxy/ratelimit, unless a rule follows the calendar.
type Unit uint8

// Units in the order of their length.
const (
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Week
	Month
	Year
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "week", "month", "year"}

var unitDurations = [...]time.Duration{
	0,
	time.Second,
	time.Minute,
	time.Hour,
	24 * time.Hour,
	7 * 24 * time.Hour,
	30 * 24 * time.Hour,
	365 * 24 * time.Hour,
}

// unitCodes are the short forms of units ("5m", "1d").
var unitCodes = [...]string{"", "s", "m", "h", "d", "w", "mo", "y"}

// String returns the lower-case name used in config files ("second", ...).
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unknown"
}

// Duration returns the length of one unit, or 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	if int(u) < len(unitDurations) {
		return unitDurations[u]
	}
	return 0
}

// Code returns the unit's short form ("s", "m", "h", "d", "w", "mo", "y"),
// "" for UnitUnknown.
func (u Unit) Code() string {
	if int(u) < len(unitCodes) {
		return unitCodes[u]
	}
	return ""
}

// ParseUnit reads a unit name in any case.
func ParseUnit(s string) (Unit, bool) {
	for u := Second; u <= Year; u++ {
		if strings.EqualFold(s, unitNames[u]) {
			return u, true
		}
	}
	return UnitUnknown, false
}

// UnitNames returns the names of the units, shortest first, joined by "|".
func UnitNames() string { return strings.Join(unitNames[1:], "|") }
