/* trajforge run report: the trajectory browser. Model output is placed with textContent only. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("tf-data").textContent);
  var recs = data.records, systems = data.systems, PAGE = 50;
  var KNOWN = { completed: 1, filtered: 1, partial: 1, failed: 1 };
  var $ = function (id) { return document.getElementById(id); };
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function haystack(r) {
    if (r._h === undefined) {
      var parts = [r.key, r.p, r.r, r.lbl];
      for (var t = 0; t < r.t.length; t++) {
        var segs = r.t[t][1];
        for (var s = 0; s < segs.length; s++) { parts.push(segs[s].text || ""); if (segs[s].name) parts.push(segs[s].name); }
      }
      r._h = parts.join("\n").toLowerCase();
    }
    return r._h;
  }
  function options(select, values) {
    values.forEach(function (v) { var o = el("option", null, v); o.value = v; select.appendChild(o); });
  }
  function distinct(field) {
    var seen = {};
    recs.forEach(function (r) { (Array.isArray(r[field]) ? r[field] : [r[field]]).forEach(function (v) { seen[v] = 1; }); });
    return Object.keys(seen).sort();
  }
  options($("f-status"), distinct("s"));
  options($("f-toolset"), distinct("ts"));
  options($("f-tool"), distinct("tu"));

  var shown = recs, page = 0, selected = null;
  function num(id) { var v = $(id).value; return v === "" ? null : Number(v); }
  function applyFilters() {
    var q = $("f-q").value.trim().toLowerCase(), st = $("f-status").value, ts = $("f-toolset").value;
    var tool = $("f-tool").value, rmin = num("f-rmin"), rmax = num("f-rmax"), hasR = $("f-hasr").checked;
    shown = recs.filter(function (r) {
      if (st && r.s !== st) return false;
      if (ts && r.ts.indexOf(ts) < 0) return false;
      if (tool && r.tu.indexOf(tool) < 0) return false;
      if ((hasR || rmin !== null || rmax !== null) && (r.rw === null || r.rw === undefined)) return false;
      if (rmin !== null && r.rw < rmin) return false;
      if (rmax !== null && r.rw > rmax) return false;
      if (q && haystack(r).indexOf(q) < 0) return false;
      return true;
    });
    page = 0;
    if (shown.indexOf(selected) < 0) {  // the trajectory shown no longer matches: show one that does
      selected = shown.length ? shown[0] : null;
      if (selected) renderDetail(selected);
      else $("tf-detail").replaceChildren(el("p", "empty", "no embedded trajectory matches the filters"));
    }
    renderList();
  }
  function fmt(v) { return v === null || v === undefined ? "" : (typeof v === "number" && v % 1 ? v.toFixed(3) : String(v)); }
  function renderList() {
    var body = $("tf-rows");
    body.replaceChildren();
    var pages = Math.max(1, Math.ceil(shown.length / PAGE));
    page = Math.min(page, pages - 1);
    shown.slice(page * PAGE, page * PAGE + PAGE).forEach(function (r) {
      var tr = el("tr");
      tr.setAttribute("data-key", r.key);
      if (r === selected) tr.className = "sel";
      var lbl = el("td", "num lbl", r.lbl); lbl.title = r.lbl; tr.appendChild(lbl);
      var std = el("td"); std.appendChild(el("span", "st" + (KNOWN[r.s] ? " st-" + r.s : ""), r.s)); tr.appendChild(std);
      tr.appendChild(el("td", "num", r.n));
      tr.appendChild(el("td", "num", fmt(r.rw)));
      tr.appendChild(el("td", "prompt", r.p));
      tr.addEventListener("click", function () { selected = r; renderList(); renderDetail(r); });
      body.appendChild(tr);
    });
    $("tf-count").textContent = shown.length + " of " + recs.length + " embedded trajectories match";
    $("tf-page").textContent = "page " + (page + 1) + " / " + pages;
  }
  function segment(seg) {
    if (seg.k === "think") {
      var d = el("details", "think"); d.open = true;
      d.appendChild(el("summary", null, "think")); d.appendChild(el("pre", null, seg.text)); return d;
    }
    if (seg.k === "call" || seg.k === "result") {
      var box = el("div", seg.k + (seg.err || seg.unp ? " err" : ""));
      var head = el("div");
      if (seg.unp) head.appendChild(el("span", "warn", "unparsed tool call (not run) — as the model wrote it:"));
      else {
        head.appendChild(el("span", null, seg.k === "call" ? "tool call → " : "tool result ← "));
        head.appendChild(el("span", "name", seg.name)); if (seg.bad) head.appendChild(el("span", "warn", " (arguments are not a JSON object)"));
      }
      box.appendChild(head); box.appendChild(el("pre", null, seg.text));
      if (seg.meta) box.appendChild(el("pre", "note", seg.meta));
      return box;
    }
    return el("pre", "text", seg.text);
  }
  function kv(table, key, value) {
    if (value === null || value === undefined || value === "") return;
    var tr = el("tr"); tr.appendChild(el("td", null, key)); tr.appendChild(el("td", null, value)); table.appendChild(tr);
  }
  function renderDetail(r) {
    var box = $("tf-detail");
    box.replaceChildren();
    box.appendChild(el("h3", null, r.ttl));
    var t = el("table", "kv");
    kv(t, "status", r.s); kv(t, "reason", r.r); kv(t, "model", r.m); kv(t, "toolsets", r.ts.join(", "));
    kv(t, "tools used", r.tu.join(", ")); kv(t, "tools that failed", r.tf.join(", ")); kv(t, "model turns", r.n);
    kv(t, "tokens", r.tok); kv(t, "wall s", fmt(r.w)); kv(t, "reward", fmt(r.rw));
    if (r.rb && Object.keys(r.rb).length) kv(t, "reward breakdown", JSON.stringify(r.rb));
    kv(t, "model s", fmt(r.ms)); kv(t, "tool s", fmt(r.tls));
    box.appendChild(t);
    if (r.sys !== null && r.sys !== undefined) {
      var sys = el("details", "turn role-system"); sys.appendChild(el("summary", "role", "system"));
      sys.appendChild(el("pre", null, systems[r.sys])); box.appendChild(sys);
    }
    r.t.forEach(function (turn) {
      var div = el("div", "turn role-" + (turn[0] === "user" || turn[0] === "assistant" || turn[0] === "tool" ? turn[0] : "other"));
      div.appendChild(el("div", "role", turn[0]));
      turn[1].forEach(function (seg) { div.appendChild(segment(seg)); });
      box.appendChild(div);
    });
  }
  var timer = null;
  function soon() { clearTimeout(timer); timer = setTimeout(applyFilters, 120); }
  // typed boxes apply as you type (as the search does), not only on Enter or leaving the box
  ["f-q", "f-rmin", "f-rmax"].forEach(function (id) { $(id).addEventListener("input", soon); });
  ["f-status", "f-toolset", "f-tool", "f-rmin", "f-rmax", "f-hasr"].forEach(function (id) { $(id).addEventListener("change", applyFilters); });
  $("tf-prev").addEventListener("click", function () { if (page > 0) { page--; renderList(); } });
  $("tf-next").addEventListener("click", function () { if ((page + 1) * PAGE < shown.length) { page++; renderList(); } });
  renderList();
  if (recs.length) { selected = recs[0]; renderList(); renderDetail(recs[0]); }
  document.body.setAttribute("data-browser", "ready");
})();
