"""The page's inline style and script. The script reads the embedded data block, pages, sorts
and filters the table rows the server drew, and draws a decision's detail when it is selected
(lazily: 100,000 detail panels up front would not open). It builds DOM nodes and sets
``textContent`` only, so no text from the inputs is ever parsed as HTML."""

CSS = """
:root{--fg:#1d232b;--muted:#5b6673;--line:#d5dbe2;--bg:#fff;--alt:#f5f7fa;--sel:#dcebff;
--diff:#ffe08a;--bad:#a3261b}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1280px;padding:16px 24px 48px;color:var(--fg);background:var(--bg);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:26px 0 8px}
.meta,.note{color:var(--muted)}.warn{color:var(--bad)}
table{border-collapse:collapse}
th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
#summary th{background:var(--alt)}
.chart{max-width:100%;height:auto;font-size:11px}
.chart .grid{stroke:var(--line)}.chart .tick{fill:var(--muted)}.chart .axis{fill:var(--fg)}
.s0{fill:#2f6db3}.s1{fill:#d9822b}.s2{fill:#3b9b5f}.s3{fill:#b8434e}.s4{fill:#7a5bb0}
.s5{fill:#8c6d3f}.s6{fill:#c75b9b}.s7{fill:#5f7080}
.filters{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;margin:6px 0}
.filters input{width:9em}.filters input[type=number]{width:5em}
.pager{margin:6px 0;display:flex;gap:10px;align-items:center}
.rows{max-height:32em;overflow:auto;border:1px solid var(--line)}#alerts{width:100%}
#alerts thead th{position:sticky;top:0;background:var(--alt);white-space:nowrap}
#alerts th button{font:inherit;font-weight:600;border:0;background:none;padding:0;cursor:pointer}
#alerts th[aria-sort=ascending] button::after{content:" \\25b2"}
#alerts th[aria-sort=descending] button::after{content:" \\25bc"}
#rows tr{display:none;cursor:pointer}#rows tr.on{display:table-row}
#rows tr:hover{background:var(--alt)}#rows tr.sel{background:var(--sel)}
#rows tr:focus{outline:2px solid #2f6db3;outline-offset:-2px}
#rows ul{margin:0;padding:0;list-style:none;max-height:7.5em;overflow:auto}
#rows li{display:inline}#rows li+li::before{content:", "}
#detail{border:1px solid var(--line);border-radius:6px;padding:4px 16px 16px;margin-top:18px}
#detail .scroll{overflow:auto;max-height:75vh}
#detail table th{white-space:nowrap}
#detail thead th{position:sticky;top:0;background:var(--alt)}
#detail td.diff{background:var(--diff)}
#detail tr.ign th,#detail tr.ign td{color:var(--muted);font-style:italic}
@media print{#rows tr{display:table-row}.rows{max-height:none}.pager,.filters{display:none}}
"""

JS = """
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const D = JSON.parse($("data").textContent);
  const A = D.alerts, G = D.groups, IDS = D.ids, X = D.x;
  const PAGE = D.page;
  const tbody = $("rows");
  const rows = Array.from(tbody.rows);
  rows.forEach((tr, i) => { tr.vi = i; });
  const coll = new Intl.Collator(undefined, { numeric: true });
  // a[3] lists the witnesses flat: id ref, output, distance, id ref, ...
  const witnesses = (a) => {
    const out = [];
    for (let k = 0; k < a[3].length; k += 3) out.push(a[3].slice(k, k + 3));
    return out;
  };
  const near = A.map((a) => {
    let m = Infinity;
    for (let k = 2; k < a[3].length; k += 3) m = Math.min(m, a[3][k]);
    return m;
  });
  const hasWitness = (a, refs) => {
    for (let k = 0; k < a[3].length; k += 3) if (refs.has(a[3][k])) return true;
    return false;
  };
  const ratio = (a) => (a[5] ? (a[5][0] === null ? Infinity : a[5][0]) : -1);
  const cmpId = (p, q) =>
    typeof p === "number" && typeof q === "number" ? p - q : coll.compare(String(p), String(q));
  const compare = {
    pos: (i, j) => i - j,
    id: (i, j) => cmpId(IDS[A[i][1]], IDS[A[j][1]]),
    y: (i, j) => coll.compare(A[i][2], A[j][2]),
    n: (i, j) => A[i][4] - A[j][4],
    d: (i, j) => near[i] - near[j],
    r: (i, j) => ratio(A[i]) - ratio(A[j]),
  };
  let order = A.map((_, i) => i), view = order, page = 0, shown = [], selected = null;
  let sortKey = "pos", dir = 1;

  function show() {
    for (const tr of shown) { tr.classList.remove("on"); tr.removeAttribute("tabindex"); }
    const pages = Math.max(1, Math.ceil(view.length / PAGE));
    page = Math.min(Math.max(page, 0), pages - 1);
    shown = view.slice(page * PAGE, (page + 1) * PAGE).map((i) => rows[i]);
    for (const tr of shown) { tr.classList.add("on"); tr.tabIndex = 0; }
    $("page-info").textContent =
      `page ${page + 1} of ${pages} \\u00b7 ${view.length} of ${A.length} flagged decisions`;
    $("prev").disabled = page === 0;
    $("next").disabled = page >= pages - 1;
  }

  const number = (id) => { const v = $(id).value.trim(); return v === "" ? null : Number(v); };
  function filter() {
    const fid = $("f-id").value.trim(), fw = $("f-wid").value.trim(), fy = $("f-y").value;
    const lo = number("f-min"), hi = number("f-max");
    let refs = null;
    if (fw) { refs = new Set(); IDS.forEach((id, r) => { if (String(id) === fw) refs.add(r); }); }
    view = order.filter((i) => {
      const a = A[i];
      return (!fid || String(IDS[a[1]]).includes(fid)) && (!fy || a[2] === fy) &&
        (lo === null || a[4] >= lo) && (hi === null || a[4] <= hi) &&
        (!refs || hasWitness(a, refs));
    });
    page = 0;
    show();
  }

  function sortBy(key, ascending) {
    dir = key === sortKey && !ascending ? -dir : 1;
    sortKey = key;
    const c = compare[key];
    order = A.map((_, i) => i).sort((i, j) => dir * c(i, j) || i - j);
    // reorder the rows detached: moved one by one in place, each move would update the
    // selection (a click leaves a caret in a row) and cost a layout
    const table = tbody.parentNode;
    tbody.remove();
    for (const i of order) tbody.appendChild(rows[i]);
    table.appendChild(tbody);
    for (const th of document.querySelectorAll("#alerts th[data-k]")) {
      if (th.dataset.k === key) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
    filter();
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  const fmtDiff = (v) => (v === 0 ? "0" : (v > 0 ? "+" : "") + String(+v.toPrecision(12)));

  function sideBySide(a, ws, g) {
    const names = g.features, dx = X[a[1]];
    const table = el("table");
    table.id = "side";
    const head = el("tr");
    head.append(el("th", "feature"), el("th", `decision ${IDS[a[1]]}`, "dec"));
    for (const w of ws) {
      const th = el("th", `witness ${IDS[w[0]]}`);
      th.colSpan = 2;
      head.append(th);
    }
    const thead = el("thead");
    thead.append(head);
    const sub = el("tr");
    sub.append(el("th"), el("th", "value"));
    for (let k = 0; k < ws.length; k++) sub.append(el("th", "value"), el("th", "difference"));
    thead.append(sub);
    const body = el("tbody");
    const line = (label, first, cells, cls) => {
      const tr = el("tr", undefined, cls);
      tr.append(el("th", label), first);
      for (const c of cells) tr.append(c);
      body.append(tr);
    };
    const wide = (text, cls) => { const td = el("td", text, cls); td.colSpan = 2; return td; };
    line("output", el("td", a[2]), ws.map((w) => wide(w[1], w[1] !== a[2] ? "diff" : "")));
    line(`input distance (${g.metric})`, el("td", "\\u2014"), ws.map((w) => wide(w[2], "n")));
    const differing = ws.map((w) => {
      const wx = X[w[0]];
      return !dx || !wx ? "\\u2014" : names.filter((_, f) => g.ignored[f] === false &&
        dx[f] !== wx[f]).length;
    });
    line("differing features (in d_in)", el("td", "\\u2014"), differing.map((n) => wide(n, "n")));
    names.forEach((name, f) => {
      let label = name;
      if (g.scale[f] !== 1) label += ` (\\u00d7${g.scale[f]})`;
      if (g.ignored[f]) label += " (not in d_in)";
      const v = dx ? dx[f] ?? null : null;
      const cells = [];
      for (const w of ws) {
        const wx = X[w[0]], u = wx ? wx[f] ?? null : null;
        const differs = v !== null && u !== null && u !== v;
        cells.push(el("td", u === null ? "\\u2014" : u, differs ? "n diff" : "n"));
        cells.push(el("td", v === null || u === null ? "\\u2014" : fmtDiff(u - v),
          differs ? "n diff" : "n"));
      }
      line(label, el("td", v === null ? "\\u2014" : v, "n"), cells, g.ignored[f] ? "ign" : "");
    });
    table.append(thead, body);
    return table;
  }

  function witnessList(ws) {
    const table = el("table");
    table.id = "side";
    const head = el("tr");
    head.append(el("th", "witness"), el("th", "output"), el("th", "input distance"));
    const thead = el("thead");
    thead.append(head);
    const body = el("tbody");
    for (const w of ws) {
      const tr = el("tr");
      tr.append(el("td", IDS[w[0]]), el("td", w[1]), el("td", w[2], "n"));
      body.append(tr);
    }
    table.append(thead, body);
    return table;
  }

  function select(i) {
    if (selected) selected.classList.remove("sel");
    selected = rows[i];
    selected.classList.add("sel");
    const a = A[i], g = G[a[0]], box = $("detail");
    box.replaceChildren();
    box.append(el("h2", `Decision ${IDS[a[1]]}`));
    let about = `rule ${g.rule} \\u00b7 model ${g.model} \\u00b7 output ${a[2]} \\u00b7 ` +
      `${a[4]} witness${a[4] === 1 ? "" : "es"} within eps ${g.eps} (${g.metric})`;
    if (g.delta !== null) about += `, outputs further apart than delta ${g.delta}`;
    box.append(el("p", about));
    const ws = witnesses(a);
    if (ws.length < a[4]) {
      const listed = `The alert lists the ${ws.length} nearest of the ${a[4]} witnesses.`;
      box.append(el("p", listed, "note"));
    }
    if (!a[6]) {
      box.append(el("p", "History incomplete (retention deleted decisions before a snapshot " +
        "covered them): witnesses among those are missing from this set.", "warn"));
    }
    if (a[5]) {
      const by = a[5][1] === null ? "" : ` (witness ${a[5][1]})`;
      box.append(el("p", a[5][0] === null
        ? `Largest d_out / d_in within eps: infinite, an identical input with another output${by}`
        : `Largest d_out / d_in within eps: ${a[5][0]}${by}`));
    }
    const wrap = el("div", undefined, "scroll");
    if (X && g.features) {
      box.append(el("p", "Each witness beside the decision: differing values are highlighted; " +
        "difference = witness \\u2212 decision.", "note"));
      wrap.append(sideBySide(a, ws, g));
    } else {
      if (X) box.append(el("p", "This model's decisions are not in the decision stream.", "warn"));
      wrap.append(witnessList(ws));
    }
    box.append(wrap);
    box.hidden = false;
    box.scrollIntoView({ block: "start" });
  }

  tbody.addEventListener("click", (e) => {
    const tr = e.target.closest("tr");
    if (tr) select(tr.vi);
  });
  tbody.addEventListener("keydown", (e) => {
    const tr = e.target.closest("tr");
    if (tr && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); select(tr.vi); }
  });
  for (const th of document.querySelectorAll("#alerts th[data-k]")) {
    th.querySelector("button").addEventListener("click", () => sortBy(th.dataset.k));
  }
  let timer = 0;
  const later = () => { clearTimeout(timer); timer = setTimeout(filter, 150); };
  const fields = ["f-id", "f-wid", "f-y", "f-min", "f-max"];
  for (const id of fields) $(id).addEventListener("input", later);
  $("f-clear").addEventListener("click", () => {
    for (const id of fields) $(id).value = "";
    filter();
  });
  $("f-order").addEventListener("click", () => sortBy("pos", true));
  $("prev").addEventListener("click", () => { page--; show(); });
  $("next").addEventListener("click", () => { page++; show(); });
  shown = rows.filter((tr) => tr.classList.contains("on"));
  show();
  document.body.dataset.ready = "1";
})();
"""
