// A run's page: draws the waterfall the server computed (rows of segments, markers), follows
// the run over Server-Sent Events until its terminal event, and scrubs through the journal:
// at each seq it shows the state the server's fold computes (GET .../state?at_seq=N) and the
// waterfall cut there (GET .../waterfall?at_seq=N). Nothing here folds events.
import { api, coalesced, runPath, wireRetries } from "./api.js";

const data = JSON.parse(document.getElementById("run-data").textContent);
const base = `/v1/runs/${runPath(data.run_id)}`;
const $ = (id) => document.getElementById(id);
const list = $("waterfall");
const marks = $("wf-marks");
const slider = $("seq");
const stateBox = $("state");
const compress = $("compress");
const TERMINAL = ["run_succeeded", "run_failed", "run_cancelled"];
const KINDS = ["run_queued", "run_started", "run_resumed", "step_started", "step_completed",
  "step_failed", "step_retrying", "step_waiting", "approval_decided", "signal_received",
  "tool_called", "anomaly_detected", "confidence_evaluated", "confidence_gate_bypassed",
  "patch_marked",
  "request_drifted",
  ...TERMINAL];

// The page embeds its waterfall compact (rows and segments as lists of values, named by
// row_fields and segment_fields); the API serves objects. Either way, objects here.
function expand(w) {
  if (!w.row_fields) return w;
  const rf = w.row_fields;
  const sf = w.segment_fields;
  const obj = (names, values) => {
    const o = {};
    for (let i = 0; i < names.length; i++) o[names[i]] = values[i];
    return o;
  };
  return { ...w, rows: w.rows.map((r) => ({ ...obj(rf, r), segments: r[rf.length].map((s) => obj(sf, s)) })) };
}

let latest = expand(data.waterfall); // the waterfall at the journal's head
let latestAt = performance.now(); // when it was fetched: the server's clock moves on from there
let scrubbed = null; // the seq being looked at, or null at the head
let shown = latest; // the waterfall drawn: the latest, or the one cut at the scrubbed seq
let source = null;
const since = new Map(); // "step|status" -> when this page first drew it (ms since epoch)

const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const secs = (s) => (s < 1 ? `${(s * 1000).toFixed(0)} ms` : s < 120 ? `${s.toFixed(1)} s`
  : s < 7200 ? `${(s / 60).toFixed(0)} min` : `${(s / 3600).toFixed(1)} h`);

function serverNow() {
  return latest.now + (performance.now() - latestAt) / 1000;
}

// Time to x (percent). Parked stretches are shown at most `cap` long when compressed, so a
// three-day approval does not squash the seconds of work around it.
function axis(w, end, squeeze) {
  const start = w.start ?? end;
  const pieces = squeeze ? w.parked.map(([s, e]) => [s, e ?? end]).filter(([s, e]) => e > s) : [];
  const parkedTotal = pieces.reduce((n, [s, e]) => n + (e - s), 0);
  const active = Math.max(end - start - parkedTotal, 1e-3);
  const cap = active * 0.08;
  const squeezed = pieces.map(([s, e]) => ({ s, e, k: Math.min(e - s, cap) / (e - s) }));
  const total = Math.max(active + squeezed.reduce((n, p) => n + (p.e - p.s) * p.k, 0), 1e-3);
  return (t) => {
    let x = t - start;
    for (const p of squeezed) {
      if (t <= p.s) break;
      const inside = Math.min(t, p.e) - p.s;
      x -= inside * (1 - p.k);
    }
    return Math.min(100, Math.max(0, (100 * x) / total));
  };
}

// A percentage to a thousandth: enough for any screen, and a shorter style to parse.
const pct = (v) => Math.round(v * 1000) / 1000;

// A row's markup is kept lean (no whitespace between tags, each label once): a long run
// has thousands of rows, and parsing them is most of the page's work. A segment's tooltip
// is its aria-label, set as its title when first hovered (below).
function segment(s, x, end) {
  const stop = s.end ?? end;
  const left = x(s.start);
  const width = Math.max(x(stop) - left, 0.15);
  const what = s.kind === "attempt" ? `attempt ${s.attempt ?? ""} ${s.outcome}`
    : `${s.kind}${s.reason && s.reason !== s.kind ? ` (${s.reason})` : ""}`;
  const label = `${what}, ${secs(stop - s.start)}, seq ${s.start_seq}–${s.end_seq ?? "…"}`;
  const cls = s.kind === "attempt" ? s.outcome : s.kind;
  const tick = s.outcome === "retrying"
    ? `<span class="tick" style="left:${pct(x(stop))}%" title="step_retrying"></span>` : "";
  return `<span class="seg ${esc(cls)}" role="img" aria-label="${esc(label)}" style="left:${pct(left)}%;width:${pct(width)}%"></span>${tick}`;
}

// Rows beyond the first screenful are added after the first paint, so a run of thousands
// of steps shows its top at once and the rest follows. They go in a few large chunks: each
// chunk costs a layout of the whole list, so 1,000-row chunks cost three times as much
// layout for 5,000 rows as one chunk does.
const FIRST_ROWS = 150;
const MORE_ROWS = 5000;
let drawing = 0; // the draw whose remaining rows are still being added

function rowHtml(r, x, end, now) {
  const key = `${r.step_id}|${r.status}`;
  if (!since.has(key)) since.set(key, now);
  const id = esc(r.step_id);
  const child = r.child_run_id
    ? ` <a class="child" href="/runs/${esc(runPath(r.child_run_id))}">child run</a>` : "";
  const tries = r.attempts > 1 ? ` <small>${r.attempts} attempts</small>` : "";
  return `<li class="wf-row st-${esc(r.status)}" data-step="${id}" data-status="${esc(r.status)}" data-since="${since.get(key)}"><span class="wf-label" title="${id}"><button type="button" class="step">${id}</button>${tries}${child}</span><span class="wf-track">${r.segments.map((s) => segment(s, x, end)).join("")}</span></li>`;
}

// An isolated run's sandboxes, one row each above its steps: when each lived, and how it
// ended (a finished one green, one that crashed, ran out of memory or time red).
function sandboxHtml(s, x, end) {
  const stop = s.end ?? end;
  const left = x(s.start);
  const width = Math.max(x(stop) - left, 0.15);
  const how = s.end === null ? "running"
    : `${s.end_reason ?? "ended"}${s.signal !== null ? `, signal ${s.signal}`
      : s.exit_code !== null ? `, exit ${s.exit_code}` : ""}`;
  const label = `sandbox ${s.attempt} (${s.sandbox_id}): ${how}, ${secs(stop - s.start)}`;
  const cls = s.end === null ? "running" : s.end_reason === "finished" ? "completed"
    : ["shutdown", "killed", "orphaned"].includes(s.end_reason) ? "cancelled" : "failed";
  return `<li class="wf-row wf-sandbox" data-sandbox="${esc(s.sandbox_id)}">
    <span class="wf-label" title="${esc(s.sandbox_id)}">sandbox ${esc(s.attempt)}
      <small>${esc(how)}</small></span>
    <span class="wf-track"><span class="seg ${cls}" role="img" aria-label="${esc(label)}"
      title="${esc(label)}" style="left:${left}%;width:${width}%"></span></span></li>`;
}

function draw(w) {
  shown = w;
  const live = !w.terminal && scrubbed === null;
  const end = live ? Math.max(serverNow(), w.end ?? 0) : (w.end ?? w.start ?? 0);
  const x = axis(w, end, compress.checked);
  const now = Date.now();
  const mine = ++drawing;
  const html = (from, to) => w.rows.slice(from, to).map((r) => rowHtml(r, x, end, now)).join("");
  list.innerHTML = (w.sandboxes ?? []).map((s) => sandboxHtml(s, x, end)).join("")
    + html(0, FIRST_ROWS);
  const more = (from) => {
    if (mine !== drawing || from >= w.rows.length) {
      if (mine === drawing) performance.mark("ratchet:complete");
      return;
    }
    list.insertAdjacentHTML("beforeend", html(from, from + MORE_ROWS));
    setTimeout(() => more(from + MORE_ROWS));
  };
  if (w.rows.length > FIRST_ROWS) requestAnimationFrame(() => setTimeout(() => more(FIRST_ROWS)));
  else performance.mark("ratchet:complete");
  marks.innerHTML = w.markers.map((m) => `<span class="mk ${esc(m.kind)}" role="img"
    aria-label="${esc(m.label)}" title="${esc(`seq ${m.seq}: ${m.label}`)}"
    style="left:${x(m.at)}%"></span>`).join("");
  $("wf-axis").textContent = w.start == null ? "no events yet"
    : `${secs(end - w.start)} from the first event${compress.checked && w.parked.length ? " (parked time compressed)" : ""}`;
}

function showSeq() {
  slider.max = String(latest.last_seq);
  if (scrubbed === null) slider.value = String(latest.last_seq);
  $("seq-label").textContent = `seq ${slider.value} of ${latest.last_seq}`;
  $("run-events").textContent = String(latest.last_seq);
}

// -- the scrubber ------------------------------------------------------------------------
let asked = 0;
async function scrubTo(seq) {
  const mine = ++asked;
  scrubbed = seq >= latest.last_seq ? null : seq;
  showSeq();
  const at = scrubbed === null ? latest.last_seq : seq;
  const [state, w] = await Promise.all([
    api(`${base}/state?at_seq=${at}`),
    scrubbed === null ? Promise.resolve(latest) : api(`${base}/waterfall?at_seq=${at}`),
  ]);
  if (mine !== asked) return; // a later position was asked for meanwhile
  stateBox.textContent = JSON.stringify(state, null, 2);
  stateBox.dataset.seq = String(at);
  draw(w);
}

let pending = null;
slider.addEventListener("input", () => {
  clearTimeout(pending);
  pending = setTimeout(() => scrubTo(Number(slider.value)), 80);
});
$("seq-prev").addEventListener("click", () => scrubTo(Math.max(0, Number(slider.value) - 1)));
$("seq-next").addEventListener("click", () => scrubTo(Math.min(latest.last_seq, Number(slider.value) + 1)));
$("seq-live").addEventListener("click", () => scrubTo(latest.last_seq));
compress.addEventListener("change", () => draw(shown));

// -- following the run ------------------------------------------------------------------
const refresh = coalesced(async () => {
  const [w, run] = await Promise.all([api(`${base}/waterfall`), api(base)]);
  latest = w;
  latestAt = performance.now();
  const badge = $("run-status");
  badge.textContent = run.status;
  badge.className = `badge st-${run.status}`;
  $("run-error").hidden = !run.error;
  $("run-error").textContent = run.error ?? "";
  story(run);
  loadTurns();
  if (scrubbed === null) {
    draw(latest);
    if ($("state-box").open) scrubTo(latest.last_seq);
    else showSeq();
  } else showSeq();
});

function follow() {
  source = new EventSource(`${base}/events?after_seq=${latest.last_seq}`);
  for (const kind of KINDS) source.addEventListener(kind, onEvent);
}

function onEvent(e) {
  if (TERMINAL.includes(e.type)) {
    source.close(); // the server ends the stream; without this the browser would reconnect
    source = null;
  }
  refresh();
}

if (!latest.terminal) {
  follow();
  // Bars still going grow with the clock between events.
  setInterval(() => { if (scrubbed === null && !latest.terminal && latest.rows.length < 800) draw(latest); }, 1000);
}

// The story at the top: drives (who drove, why each ended), the failure's traceback, the
// output, the duration, as GET /v1/runs/{id} tells them once the run moves on.
function story(run) {
  $("story-drives").innerHTML = run.drives.length ? run.drives.map((d) =>
    `<li data-drive="${esc(d.drive)}"><strong>${esc(d.worker_id ?? "?")}</strong>${d.reason && d.reason !== "claim" ? ` <small>(${esc(d.reason)})</small>` : ""}: ${esc(d.ended ?? "running")}</li>`).join("")
    : "<li>not driven yet</li>";
  const tb = $("story-traceback");
  tb.hidden = !run.traceback;
  tb.querySelector("pre").textContent = run.traceback ?? "";
  const out = $("story-output");
  out.hidden = run.status !== "succeeded";
  out.querySelector("pre").textContent = JSON.stringify(run.output, null, 2);
  if (run.duration_s != null) $("story-duration").textContent = secs(run.duration_s);
  $("story-tokens").textContent = (run.llm.input_tokens + run.llm.output_tokens).toLocaleString("en-US");
}

// -- a step's detail ---------------------------------------------------------------------
list.addEventListener("click", (e) => {
  const button = e.target.closest("button.step");
  if (button) showStep(button.closest("li").dataset.step);
});
// A turn's step name opens that step's detail, as its waterfall row does.
$("turns").addEventListener("click", (e) => {
  const button = e.target.closest("button.turn-step");
  if (button) showStep(button.closest("article").dataset.step);
});

async function showStep(stepId) {
  const d = await api(`${base}/step?step_id=${encodeURIComponent(stepId)}`);
  const s = d.state;
  $("detail-title").textContent = `Step ${s.step_id}`;
  const facts = [["Status", s.status], ["Attempts", s.attempts_used], ["Latest attempt", s.attempt],
    ["Idempotency key", d.idempotency_key ?? "–"], ["Lease epoch", d.lease_epoch ?? "–"],
    ["Tokens", d.tokens ?? "–"], ["Cost", d.cost_usd == null ? "–" : `$${d.cost_usd.toFixed(6)}`]];
  if (s.child_run_id) facts.push(["Child run", s.child_run_id]);
  $("detail-facts").innerHTML = facts.map(([k, v]) =>
    `<div><dt>${esc(k)}</dt><dd>${esc(v)}</dd></div>`).join("");
  // What the step was called with (journal_args=False, or an older journal: nothing).
  $("detail-input").textContent = d.args_journaled ? JSON.stringify(d.args, null, 2)
    : "(arguments not journaled)";
  // A model call's answer as text, its raw response one click away; other steps' output.
  const answer = $("detail-answer");
  answer.hidden = d.answer == null;
  answer.textContent = d.answer ?? "";
  $("detail-raw").open = d.answer == null;
  $("detail-output").textContent = JSON.stringify(s.output, null, 2);
  $("detail-error").textContent = s.error ?? "–";
  $("detail-tb").hidden = !s.traceback;
  $("detail-traceback").textContent = s.traceback ?? "";
  // A model call reads as its conversation: every message it was sent, then its reply.
  const talk = $("detail-conversation");
  talk.hidden = s.kind !== "llm";
  talk.querySelector(".turns").innerHTML = s.kind === "llm"
    ? await fragment(`${uiBase}/conversation?step_id=${encodeURIComponent(stepId)}`) : "";
  $("detail-events").textContent = d.events.map((ev) =>
    JSON.stringify({ seq: ev.seq, kind: ev.kind, attempt: ev.attempt, at: ev.at, payload: ev.payload })).join("\n");
  const panel = $("detail");
  panel.hidden = false;
  panel.focus();
  // For the step's actions (fork.js), which work from the same detail.
  panel.dispatchEvent(new CustomEvent("step-shown", { detail: d }));
}
list.addEventListener("mouseover", (e) => {
  const seg = e.target.closest(".seg");
  if (seg && !seg.title) seg.title = seg.getAttribute("aria-label");
});
$("detail-close").addEventListener("click", () => { $("detail").hidden = true; });
document.addEventListener("keydown", (e) => { if (e.key === "Escape") $("detail").hidden = true; });

// -- the conversation --------------------------------------------------------------------
// The run's model calls as turns, rendered (and escaped) by the server, a page of turns at
// a time; each turn's raw JSON is fetched when it is opened, so a long conversation
// ships only what is read.
const uiBase = `/ui/runs/${runPath(data.run_id)}`;
const turnsBox = $("turns");
let pagedOn = false; // "More turns" was asked for: a refresh leaves the pages read alone

async function fragment(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "text/html" } });
  if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
  return r.text();
}

const loadTurns = coalesced(async () => {
  if (pagedOn || !latest.rows.some((r) => r.kind === "llm")) return;
  $("conversation").hidden = false;
  turnsBox.innerHTML = await fragment(`${uiBase}/conversation`);
  turnsBox.dataset.loaded = String(latest.last_seq);
});

document.addEventListener("click", async (e) => {
  const more = e.target.closest("button.more-turns");
  if (!more) return;
  pagedOn = true;
  more.disabled = true;
  more.outerHTML = await fragment(`${uiBase}/conversation?after=${encodeURIComponent(more.dataset.after)}`);
});

// A turn's raw JSON: the request as sent, the response, the call's usage and latency.
document.addEventListener("toggle", async (e) => {
  const box = e.target;
  if (!box.matches?.("details.raw") || !box.open || box.dataset.loaded) return;
  box.dataset.loaded = "1";
  const pre = box.querySelector("pre");
  try {
    const raw = await api(`${uiBase}/turn?step_id=${encodeURIComponent(box.dataset.step)}`);
    pre.textContent = JSON.stringify(raw, null, 2);
  } catch (err) {
    pre.textContent = `could not load: ${err.message}`;
    delete box.dataset.loaded;
  }
}, true);

// -- actions ------------------------------------------------------------------------------
const report = (text) => { $("action-result").textContent = text; };
wireRetries(document, (text) => { report(text); refresh(); if (!source) follow(); });

$("cancel")?.addEventListener("click", async () => {
  try {
    const out = await api(`${base}/cancel`, { method: "POST" });
    report(`cancel requested: ${out.status}`);
  } catch (err) { report(`cancel refused: ${err.message}`); }
});

$("signal")?.addEventListener("submit", async (e) => {
  e.preventDefault();
  const field = (name) => e.target.elements.namedItem(name).value;
  const name = field("name");
  let payload = null;
  try {
    payload = field("data").trim() ? JSON.parse(field("data")) : null;
  } catch {
    report("the signal's data is not valid JSON");
    return;
  }
  try {
    await api(`${base}/signals/${encodeURIComponent(name)}`,
              { method: "POST", body: { data: payload } });
    report(`signal ${name} sent`);
  } catch (err) { report(`signal refused: ${err.message}`); }
});

for (const form of document.querySelectorAll("form.approval")) {
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const approved = e.submitter?.value === "approve";
    try {
      const comment = form.elements.namedItem("comment").value;
      await api(`/v1/runs/${runPath(form.dataset.run)}/approvals/${runPath(form.dataset.step)}`, {
        method: "POST",
        body: { approved, by: data.by, comment: comment || null },
      });
      report(`${approved ? "approved" : "rejected"} ${form.dataset.step}`);
      form.hidden = true;
    } catch (err) { report(`decision refused: ${err.message}`); }
  });
}

// For the bench (bench/dashboard.py): the waterfall is in the DOM, then on screen (asked
// for before drawing, so it is marked before the rows past the first screenful go in).
requestAnimationFrame(() => setTimeout(() => performance.mark("ratchet:painted")));
draw(latest);
performance.mark("ratchet:drawn");
loadTurns();
// The state is folded on the server when first asked for (opening it, or scrubbing), not
// with every page load: for a long journal that is a second read of every event.
$("state-box").addEventListener("toggle", () => {
  if ($("state-box").open && !stateBox.dataset.seq) scrubTo(Number(slider.value));
});
