package httpapi

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Browsers can be made to send requests by pages of other sites, and a
// name an attacker controls can be made to resolve to 127.0.0.1 (DNS
// rebinding): a loopback client is then not the operator. Requests that
// a browser sends say so (Origin, Sec-Fetch-Site); programs such as rls,
// curl and Envoy send neither, and nothing changes for them.

// fromBrowser reports whether r carries the headers browsers add.
func fromBrowser(r *http.Request) bool {
	return r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") != ""
}

// crossSite says why an admin request sent by a browser was refused: it
// came from another site's page (Sec-Fetch-Site, or an Origin other than
// the host asked). "" when it came from rls's own page, or not from a
// browser.
func crossSite(r *http.Request) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		return "a " + site + " request from a browser (only rls's own page may act)"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return "Origin " + o + " is not this server (" + r.Host + ")"
		}
	}
	return ""
}

// rebound says why a browser's request admitted for coming from loopback
// was refused: it names a host other than a loopback one, as a page of a
// name rebound to 127.0.0.1 does. "" when it is fine.
func rebound(r *http.Request) string {
	if !fromBrowser(r) {
		return ""
	}
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	if strings.EqualFold(host, "localhost") {
		return ""
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsLoopback() {
		return ""
	}
	return "a browser on loopback asked for host " + r.Host + ": open the page at http://localhost:PORT/ or 127.0.0.1 (or send the bearer token)"
}
