package engine

import (
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
)

// calendarWindow is a fixed window on the calendar of a time zone
// (calendar: true): a day from local midnight, an ISO week from Monday, a
// month from the 1st, a year from January 1, each as long as the calendar
// makes it (a DST day has 23 or 25 hours, a month 28 to 31 days). State:
// as fixedWindow, Count hits in the window that starts at Start; it judges,
// consumes and gives back as fixedWindow, whose methods it embeds.
type calendarWindow struct{ fixedWindow }

// calendarBounds returns the start and end (µs) of l's calendar window
// holding t. time.Date normalizes a midnight that a DST change skips.
func calendarBounds(l *descriptors.Limit, t int64) (start, end int64) {
	tm := time.UnixMicro(t).In(l.Calendar)
	y, m, d := tm.Date()
	var from, to time.Time
	switch l.Unit {
	case descriptors.Day:
		from, to = time.Date(y, m, d, 0, 0, 0, 0, l.Calendar), time.Date(y, m, d+1, 0, 0, 0, 0, l.Calendar)
	case descriptors.Week:
		monday := d - (int(tm.Weekday())+6)%7
		from, to = time.Date(y, m, monday, 0, 0, 0, 0, l.Calendar), time.Date(y, m, monday+7, 0, 0, 0, 0, l.Calendar)
	case descriptors.Month:
		from, to = time.Date(y, m, 1, 0, 0, 0, 0, l.Calendar), time.Date(y, m+1, 1, 0, 0, 0, 0, l.Calendar)
	default: // Year; the config admits no other unit
		from, to = time.Date(y, 1, 1, 0, 0, 0, 0, l.Calendar), time.Date(y+1, 1, 1, 0, 0, 0, 0, l.Calendar)
	}
	return from.UnixMicro(), to.UnixMicro()
}

// calendarEnd returns the end of the window that starts at start.
func calendarEnd(l *descriptors.Limit, start int64) int64 {
	_, end := calendarBounds(l, start)
	return end
}

func (calendarWindow) normalize(l *descriptors.Limit, st *State, t int64) int64 {
	ws, _ := calendarBounds(l, t)
	return enterWindow(st, ws, t)
}

func (calendarWindow) resetAt(l *descriptors.Limit, st *State, _ int64) int64 {
	return calendarEnd(l, st.Start)
}

func (calendarWindow) retryAt(l *descriptors.Limit, st *State, _ int64, hits uint64) int64 {
	if hits > uint64(l.RequestsPerUnit) {
		return never
	}
	return calendarEnd(l, st.Start)
}

func (calendarWindow) expiry(l *descriptors.Limit, st *State) int64 {
	if st.Count == 0 {
		return 0
	}
	return calendarEnd(l, st.Start)
}

// CalendarBounds returns, for a calendar limit, the starts of the windows
// before, at and after the one holding t, and the end of the last (µs):
// what a store that decides at another clock (Redis's) needs to find the
// window holding its own instant.
func CalendarBounds(l *descriptors.Limit, t time.Time) [4]int64 {
	start, end := calendarBounds(l, t.UnixMicro())
	prev, _ := calendarBounds(l, start-1)
	return [4]int64{prev, start, end, calendarEnd(l, end)}
}
