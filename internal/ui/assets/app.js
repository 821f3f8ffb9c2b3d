// rls operator page. A client of rls's JSON endpoints like any other: it
// reads /debug/status for live counts, asks the server for views rendered
// from /debug/config, /debug/status and /debug/top (/ui/part/NAME), and
// acts through /debug/explain, /admin/reset and /admin/overrides. The admin
// token, when typed, lives in this page's memory only and goes in the
// Authorization header, never in a URL or a cookie.
"use strict";
(function () {
  document.documentElement.classList.add("js");
  var token = "";
  var EVERY = 3000;            // ms between refreshes
  var KEEP = 100;              // samples kept per limit: 5 minutes at 3 s
  var history = {};            // "domain\u0000label" -> [{t, ok, denied}]
  var lastLoad = null;         // time of the newest config load seen
  var timer = null;

  function headers(extra) {
    var h = extra || {};
    if (token) h["Authorization"] = "Bearer " + token;
    return h;
  }
  function say(text, bad) {
    var el = document.getElementById("say");
    el.textContent = text;
    el.className = bad ? "error" : "";
  }
  function refused(what, resp, body) {
    var hint = resp.status === 401 || resp.status === 403 ? " (type the admin token above)" : "";
    return what + " refused: " + resp.status + " " + body.trim() + hint;
  }

  // call sends a JSON request to rls and resolves with the parsed answer,
  // or rejects with a message that says what rls answered.
  function call(method, path, body, what) {
    var opts = { method: method, headers: headers({ "Content-Type": "application/json" }), credentials: "omit" };
    if (body !== undefined) opts.body = JSON.stringify(body);
    return fetch(path, opts).then(function (resp) {
      return resp.text().then(function (text) {
        if (!resp.ok) throw new Error(refused(what, resp, text));
        return text ? JSON.parse(text) : null;
      });
    });
  }

  function part(name) {
    var el = document.querySelector('[data-part="' + name + '"]');
    if (!el) return Promise.resolve();
    return fetch("/ui/part/" + name, { headers: headers(), credentials: "omit" }).then(function (resp) {
      return resp.text().then(function (html) {
        if (!resp.ok) throw new Error(refused("view " + name, resp, html));
        el.innerHTML = html; // rendered by rls's html/template: escaped
        if (name === "limits") drawAll();
        if (name === "explain") defaultDomains();
      });
    });
  }

  // Live counts: rates from two successive /debug/status answers.
  function tick() {
    call("GET", "/debug/status", undefined, "status").then(function (st) {
      var t = Date.parse(st.time);
      (st.limits || []).forEach(function (l) {
        var key = l.domain + "\u0000" + l.limit;
        var h = history[key] || (history[key] = []);
        h.push({ t: t, ok: l.ok, denied: l.over_limit });
        if (h.length > KEEP + 1) h.shift();
      });
      var newest = st.reloads && st.reloads.length ? st.reloads[0].time : null;
      var work = [part("top"), part("system")];
      if (newest !== lastLoad) {
        work.push(part("limits"), part("reloads"));
        lastLoad = newest;
      } else {
        drawAll();
      }
      return Promise.all(work);
    }).catch(function (e) {
      say(e.message, true);
    });
  }

  function rates(h) {
    var out = [];
    for (var i = 1; i < h.length; i++) {
      var dt = (h[i].t - h[i - 1].t) / 1000;
      if (dt <= 0) continue;
      out.push({ ok: Math.max(0, h[i].ok - h[i - 1].ok) / dt, denied: Math.max(0, h[i].denied - h[i - 1].denied) / dt });
    }
    return out;
  }

  function drawAll() {
    document.querySelectorAll("tr[data-label]").forEach(function (row) {
      var h = history[row.dataset.domain + "\u0000" + row.dataset.label];
      if (!h || !h.length) return;
      var last = h[h.length - 1], r = rates(h), now = r.length ? r[r.length - 1] : null;
      var ok = row.querySelector('[data-f="ok"]'), denied = row.querySelector('[data-f="denied"]');
      ok.textContent = last.ok + (now ? " (" + now.ok.toFixed(1) + "/s)" : "");
      denied.textContent = last.denied + (now ? " (" + now.denied.toFixed(1) + "/s)" : "");
      denied.className = "num" + (now && now.denied > 0 ? " denied-now" : "");
      spark(row.querySelector("svg.spark"), r);
    });
  }

  var SVG = "http://www.w3.org/2000/svg";
  function spark(svg, r) {
    if (!svg) return;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    if (r.length < 2) return;
    var max = 0;
    r.forEach(function (p) { max = Math.max(max, p.ok, p.denied); });
    max = max || 1;
    ["ok", "denied"].forEach(function (f) {
      var pts = r.map(function (p, i) {
        return (i * 100 / (r.length - 1)).toFixed(1) + "," + (19 - p[f] / max * 18).toFixed(1);
      });
      var line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", f);
      line.setAttribute("points", pts.join(" "));
      svg.appendChild(line);
    });
  }

  // Descriptors are written key=value,key=value (a key alone: value "").
  function parseDescriptor(text) {
    return text.split(",").map(function (kv) { return kv.trim(); }).filter(Boolean).map(function (kv) {
      var i = kv.indexOf("=");
      return i < 0 ? { key: kv, value: "" } : { key: kv.slice(0, i), value: kv.slice(i + 1) };
    });
  }
  function descriptorText(entries) {
    return (entries || []).map(function (e) { return e.value ? e.key + "=" + e.value : e.key; }).join(",");
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // explain draws /debug/explain's answer as the path each descriptor
  // took through the tree, then the limits it reached and their state.
  function explain(req) {
    return call("POST", "/debug/explain", req, "explain").then(function (ex) {
      var out = document.getElementById("explain-out");
      out.textContent = "";
      out.appendChild(el("p", ex.code === "OK" ? "ok" : "error", ex.domain + ": " + ex.code + (ex.known_domain ? "" : " (no such domain)")));
      document.querySelectorAll("tr.on-path").forEach(function (r) { r.classList.remove("on-path"); });
      (ex.descriptors || []).forEach(function (d) {
        out.appendChild(el("h3", "", descriptorText(d.entries) + " (hits " + d.hits + ")"));
        var ol = el("ol", "explain-path");
        // One level of the tree per step, indented as the tree is; the
        // nodes passed are marked in the limits view too.
        var steps = d.match.steps || [];
        steps.forEach(function (s, i) {
          ol.appendChild(el("li", "matched depth-" + Math.min(i, 4), s.key + "=" + s.value + " → node " + s.node + " (" + s.how.replace(/_/g, " ") + ")"));
          document.querySelectorAll("tr[data-path]").forEach(function (r) {
            if (r.dataset.path === ex.domain + " " + s.node) r.classList.add("on-path");
          });
        });
        ol.appendChild(el("li", (d.match.result === "matched" ? "matched" : "stopped") + " depth-" + Math.min(steps.length, 4), d.match.message));
        (d.limits || []).forEach(function (l) {
          var text = l.label + ": " + l.requests_per_unit + " per " + (l.window || l.unit || "") + (l.algorithm ? ", " + l.algorithm : "") + " — " + l.applies;
          if (l.override) text += "; override in force: " + l.override.requests_per_unit + (l.override.reason ? " (" + l.override.reason + ")" : "") +
            (l.override.configured ? ", configured " + l.override.configured.requests_per_unit : "");
          if (l.state) text += "; remaining " + l.state.remaining + ", resets in " + l.state.reset + (l.state.admits ? ", admits" : ", denies");
          ol.appendChild(el("li", "limit depth-" + Math.min(steps.length, 4) + " " + (l.state && !l.state.admits ? "stopped" : "matched"), text));
        });
        out.appendChild(ol);
      });
      say("explained " + ex.domain + " " + (ex.descriptors || []).map(function (d) { return descriptorText(d.entries); }).join(" | "));
      document.getElementById("explain").scrollIntoView();
    });
  }

  // Empty domain fields take the first domain of the config.
  function defaultDomains() {
    var first = document.querySelector("#domains option");
    if (!first) return;
    document.querySelectorAll('input[name="domain"]').forEach(function (f) {
      if (!f.value) f.value = first.value;
    });
  }

  function overrideForm() { return document.getElementById("override-form"); }
  function fillOverride(o) {
    var f = overrideForm();
    f.domain.value = o.domain;
    f.descriptor.value = descriptorText(o.descriptor);
    f.name.value = o.name || "";
    f.requests_per_unit.value = o.requests_per_unit === undefined ? "" : o.requests_per_unit;
    f.burst.value = o.burst === undefined || o.burst === null ? "" : o.burst;
    f.ttl.value = o.expires_at ? Math.max(1, Math.round((Date.parse(o.expires_at) - Date.now()) / 1000)) + "s" : "";
    f.reason.value = o.reason || "";
    document.getElementById("overrides").scrollIntoView();
    f.requests_per_unit.focus();
  }

  function done(p, refresh) {
    return p.then(function (msg) {
      say(msg);
      return Promise.all(refresh.map(part));
    }).catch(function (e) { say(e.message, true); });
  }

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-act]");
    if (!b) return;
    var act = b.dataset.act;
    if (act === "explain") {
      explain(JSON.parse(b.dataset.request)).catch(function (e) { say(e.message, true); });
    } else if (act === "reset") {
      var req = JSON.parse(b.dataset.request);
      done(call("POST", "/admin/reset", req, "reset").then(function (r) {
        return "reset " + req.domain + " " + descriptorText(req.descriptors[0].entries) + ": " + r.cleared + " counters cleared";
      }), ["top"]);
    } else if (act === "override") {
      fillOverride({ domain: b.dataset.domain, descriptor: parseDescriptor(b.dataset.descriptor), reason: "" });
    } else if (act === "edit") {
      fillOverride(JSON.parse(b.dataset.override));
    } else if (act === "expire") {
      fillOverride(JSON.parse(b.dataset.override));
      var f = overrideForm();
      f.ttl.value = "10m";
      f.ttl.focus();
      f.ttl.select();
      say("set when the override expires (Expires in), then Save override");
    } else if (act === "delete") {
      var o = JSON.parse(b.dataset.override);
      done(call("DELETE", "/admin/overrides", { domain: o.domain, descriptor: o.descriptor, name: o.name || "" }, "delete override").then(function () {
        return "override deleted: " + o.domain + " " + descriptorText(o.descriptor);
      }), ["overrides", "limits"]);
    }
  });

  document.getElementById("explain-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var f = ev.target, hits = parseInt(f.hits.value, 10);
    var d = { entries: parseDescriptor(f.descriptor.value) };
    var req = { domain: f.domain.value, descriptors: [d] };
    if (!isNaN(hits) && hits !== 1) req.hits_addend = hits;
    explain(req).catch(function (e) { say(e.message, true); });
  });

  overrideForm().addEventListener("submit", function (ev) {
    ev.preventDefault();
    var f = ev.target;
    var body = {
      domain: f.domain.value,
      descriptor: parseDescriptor(f.descriptor.value),
      requests_per_unit: parseInt(f.requests_per_unit.value, 10),
      reason: f.reason.value
    };
    if (f.name.value) body.name = f.name.value;
    if (f.burst.value !== "") body.burst = parseInt(f.burst.value, 10);
    if (f.ttl.value) body.ttl = f.ttl.value;
    done(call("PUT", "/admin/overrides", body, "override").then(function (o) {
      return "override saved: " + o.domain + " " + descriptorText(o.descriptor) + " → " + o.requests_per_unit;
    }), ["overrides", "limits"]);
  });

  document.getElementById("token-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var input = document.getElementById("token");
    token = input.value.trim();
    input.value = "";
    say(token ? "token in use (kept in this page only)" : "no token");
    lastLoad = null;
    Promise.all(["limits", "top", "explain", "overrides", "reloads", "system"].map(part)).then(function () {
      start();
    }).catch(function (e) { say(e.message, true); });
  });

  function start() {
    if (timer === null) timer = setInterval(tick, EVERY);
    tick();
  }
  // Views the server could not read for this client (the token is needed)
  // wait for the token instead of asking again and again.
  if (document.querySelector('.part [role="alert"]')) {
    say("Some views need the admin token (--admin-require-token, or off loopback): type it above.", true);
  } else {
    lastLoad = undefined;
    start();
  }
})();
