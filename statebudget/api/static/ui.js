"use strict";
const GB = 1e9;
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const gb = (b) => (b / GB).toFixed(2);
let token = sessionStorage.getItem("sb-token") || "";
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) { token = fromHash; sessionStorage.setItem("sb-token", token); history.replaceState(null, "", location.pathname); }

$("signin").addEventListener("submit", (e) => {
  e.preventDefault(); token = $("token").value.trim(); sessionStorage.setItem("sb-token", token); refresh();
});

function gpuRow(g) {
  const kinds = ["weights", "kv", "experts", "loading", "engine"];
  const segs = kinds.map((k) => `<div class="seg ${k}" title="${k} ${gb(g[k])} GB" style="width:${(100 * g[k] / g.capacity).toFixed(3)}%"></div>`).join("");
  const engines = g.engines.map((e) => `<span class="${e.state}">${esc(e.model)} ${e.state}</span>`).join(", ") || "no engine";
  const data = kinds.map((k) => `data-${k}="${g[k]}"`).join(" ");
  return `<div class="gpu" data-gpu="${g.index}" data-capacity="${g.capacity}" ${data}>
    <div>${esc(g.id)} <small>${esc(g.kind)}</small></div><div class="bar">${segs}</div>
    <div class="eng"><span class="used">${gb(g.used)}</span> / ${gb(g.capacity)} GB · ${engines}</div></div>`;
}

function rows(tbody, items, cells) {
  tbody.innerHTML = items.length ? items.map((x) => "<tr>" + cells(x).join("") + "</tr>").join("") :
    `<tr><td colspan="7"><i>none</i></td></tr>`;
}

function histogram(st) {
  const w = 640, h = 140, n = st.counts.length, max = Math.max(1, ...st.counts), bw = w / n;
  let bars = "";
  st.counts.forEach((c, i) => {
    const y = h - 20 - (h - 35) * c / max, hh = (h - 35) * c / max, hy = (h - 35) * st.handoff_counts[i] / max;
    const label = i + 1 < n ? `${st.edges_s[i]}–${st.edges_s[i + 1]}` : `≥${st.edges_s[i]}`;
    bars += `<g class="bin" data-count="${c}" data-handoff="${st.handoff_counts[i]}"><rect x="${i * bw + 2}" y="${y}" width="${bw - 4}" height="${hh}" fill="#9db7dd"/>` +
      `<rect x="${i * bw + 2}" y="${h - 20 - hy}" width="${bw - 4}" height="${hy}" fill="#3b6fb6"/>` +
      `<text x="${i * bw + bw / 2}" y="${y - 3}" font-size="11" text-anchor="middle">${c || ""}</text>` +
      `<text x="${i * bw + bw / 2}" y="${h - 6}" font-size="9" text-anchor="middle">${label}</text></g>`;
  });
  return `<svg width="${w}" height="${h}" role="img" aria-label="stall histogram">${bars}</svg>` +
    `<div><small>${st.n} calls; seconds of stall per bin; dark: handoffs</small></div>`;
}

function draw(s) {
  $("cluster").textContent = `· ${s.cluster} · plan ${s.plan_version}` + (s.scope === "all" ? "" : ` · tenant ${s.scope}`);
  $("gpus").innerHTML = s.gpus.map(gpuRow).join("");
  rows($("nodes").tBodies[0], s.nodes, (n) => [`<td>${esc(n.name)}</td>`,
    `<td class="num dram" data-used="${n.dram_used}">${gb(n.dram_used)} / ${gb(n.dram_capacity)}</td>`,
    `<td class="num">${gb(n.dram_weights)} / ${gb(n.dram_kv)} / ${gb(n.dram_experts)}</td>`,
    `<td class="num">${gb(n.nvme_used)} / ${gb(n.nvme_capacity)}</td>`]);
  rows($("transfers").tBodies[0], s.transfers, (t) => [`<td>${esc(t.op)}</td>`, `<td>${esc(t.kind)}</td>`,
    `<td>${esc(t.object.join("/"))}</td>`, `<td>${esc(t.src)} → ${esc(t.dst)}</td>`, `<td class="num">${gb(t.bytes)}</td>`,
    `<td class="num">${t.elapsed_s} / ${t.expected_s}</td>`,
    `<td>${t.progress == null ? "" : `<span class="prog"><b style="width:${100 * t.progress}%"></b></span>`}</td>`]);
  rows($("leases").tBodies[0], s.leases, (l) => [`<td class="lease" data-lease="${esc(l.lease_id)}">${esc(l.lease_id)}</td>`,
    `<td>${esc(l.program)}</td>`, `<td>${esc(l.model)}</td>`, `<td class="state">${esc(l.state)}</td>`,
    `<td class="num">${l.deadline_in_s.toFixed(1)}</td>`, `<td class="num">${l.confidence}</td>`, `<td>${esc(l.reason)}</td>`]);
  $("hist").innerHTML = histogram(s.stalls);
}

async function refresh() {
  if (!token) return;
  try {
    const r = await fetch("/v1/ui/state", {headers: {"Authorization": "Bearer " + token}, cache: "no-store"});
    if (r.status === 401 || r.status === 403) {
      $("status").textContent = "token refused: " + ((await r.json()).detail || r.status); $("view").hidden = true; return;
    }
    const s = await r.json();
    draw(s);
    $("view").hidden = false; $("signin").hidden = true;
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.ready = "1";
  } catch (e) {
    $("status").textContent = "planner unreachable: " + e;
  }
}
refresh();
setInterval(refresh, 2000);
