package engine

import "time"

// calendarWindow is a fixed window on the calendar of a time zone
// (calendar: true): a day from local midnight, an ISO week from Monday, a
// month from the 1st, a year from January 1, each as long as the calendar
// makes it (a DST day has 23 or 25 hours, a month 28 to 31 days). State:
// as fixedWindow, Count hits in the window that starts at Start; it judges,
// consumes and gives back as fixedWindow, whose methods it embeds. Configs
// write it as a fixed_window with calendar: true (compileCalendar).
type calendarWindow struct{ fixedWindow }

func (calendarWindow) name() string { return "calendar_window" }
func (calendarWindow) code() uint8  { return 4 }

// configName: configs name it as the fixed window it is a form of.
func (calendarWindow) configName() string { return FixedWindow }

// compileCalendar checks calendar: true on r, compiled so far with the
// algorithm r.alg, and returns the calendar window it makes (r.alg when it
// makes none: the problem is in errs).
func compileCalendar(s *Spec, r *Rule, errs *specErrors) algorithm {
	switch {
	case r.Unit < Day:
		errs.add("calendar", true, "calendar: true needs unit day, week, month or year, not %s", r.Unit)
		return r.alg
	case r.alg != algorithm(fixedWindow{}):
		errs.add("calendar", true, "calendar: true is for algorithm fixed_window, not %s (a calendar window is a fixed window)", r.alg.name())
		return r.alg
	case r.Multiplier != 1:
		errs.add("calendar", true, "calendar: true counts one %s at a time: unit_multiplier must be 1, not %d", r.Unit, r.Multiplier)
		return r.alg
	}
	r.Calendar = time.UTC
	if !s.TimeZone.Set {
		return calendarWindow{}
	}
	zone := s.TimeZone.V
	loc, err := time.LoadLocation(zone)
	if err != nil || zone == "" || zone == "Local" {
		errs.add("time_zone", false, "time_zone %q is not an IANA time zone name (such as Europe/Paris or UTC)", zone)
		return r.alg
	}
	r.Calendar = loc
	return calendarWindow{}
}

func (calendarWindow) counterID(r *Rule) string { return calendarID(r) }

// Its Window is its unit's nominal length, not part of its ID (the unit
// and the zone are).
func (calendarWindow) windowInIdentity() bool { return false }

// calendarBounds returns the start and end (µs) of r's calendar window
// holding t. time.Date normalizes a midnight that a DST change skips.
func calendarBounds(r *Rule, t int64) (start, end int64) {
	loc := r.Calendar
	tm := time.UnixMicro(t).In(loc)
	y, m, d := tm.Date()
	var from, to time.Time
	switch r.Unit {
	case Day:
		from, to = time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case Week:
		monday := d - (int(tm.Weekday())+6)%7
		from, to = time.Date(y, m, monday, 0, 0, 0, 0, loc), time.Date(y, m, monday+7, 0, 0, 0, 0, loc)
	case Month:
		from, to = time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	default: // Year; compileCalendar admits no other unit
		from, to = time.Date(y, 1, 1, 0, 0, 0, 0, loc), time.Date(y+1, 1, 1, 0, 0, 0, 0, loc)
	}
	return from.UnixMicro(), to.UnixMicro()
}

// calendarEnd returns the end of the window that starts at start.
func calendarEnd(r *Rule, start int64) int64 {
	_, end := calendarBounds(r, start)
	return end
}

func (calendarWindow) normalize(r *Rule, st *State, t int64) int64 {
	ws, _ := calendarBounds(r, t)
	return enterWindow(st, ws, t)
}

func (calendarWindow) resetAt(r *Rule, st *State, _ int64) int64 {
	return calendarEnd(r, st.Start)
}

func (calendarWindow) retryAt(r *Rule, st *State, _ int64, hits uint64) int64 {
	if hits > uint64(r.Limit) {
		return never
	}
	return calendarEnd(r, st.Start)
}

func (calendarWindow) expiry(r *Rule, st *State) int64 {
	if st.Count == 0 {
		return 0
	}
	return calendarEnd(r, st.Start)
}

// quotaWindow is the length of the calendar window that ends at end. It
// takes the window holding end − 12 h: every calendar window is at least 23
// hours long (a day that starts summer time), so that instant lies in the
// window ending at end even when end was computed at a clock hours away
// from the store's.
func (calendarWindow) quotaWindow(r *Rule, end time.Time) time.Duration {
	start, stop := calendarBounds(r, end.Add(-12*time.Hour).UnixMicro())
	return time.Duration(stop-start) * time.Microsecond
}

func (calendarWindow) calendarBounds(r *Rule, at int64) ([4]int64, bool) {
	start, end := calendarBounds(r, at)
	prev, _ := calendarBounds(r, start-1)
	return [4]int64{prev, start, end, calendarEnd(r, end)}, true
}
