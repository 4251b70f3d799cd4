// Calls to Ratchet's own API on the session cookie. Every state-changing request carries
// the page's CSRF token; the server refuses one without it.
const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? "";

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = r.headers.get("content-type")?.includes("json") ? await r.json() : null;
  if (!r.ok) throw new Error(data?.message ?? `${r.status} ${r.statusText}`);
  return data;
}

export function runPath(runId) {
  // Run ids of child runs hold "/", which the API's routes take as they are.
  return runId.split("/").map(encodeURIComponent).join("/");
}

// Buttons with data-retry re-queue a dead-lettered run (admin scope).
export function wireRetries(root, report) {
  root.addEventListener("click", async (e) => {
    const button = e.target.closest("button[data-retry]");
    if (!button) return;
    button.disabled = true;
    try {
      const out = await api(`/v1/dead-letters/${runPath(button.dataset.retry)}/retry`,
                            { method: "POST" });
      report(`${out.run_id} re-queued: ${out.status}`);
    } catch (err) {
      report(`retry refused: ${err.message}`);
      button.disabled = false;
    }
  });
}

// `fn` run once at a time: a call while it runs makes it run once more afterwards, so
// a burst of events costs at most two fetches and the last one sees them all.
export function coalesced(fn) {
  let running = false;
  let again = false;
  const run = async () => {
    if (running) { again = true; return; }
    running = true;
    try {
      await fn();
    } finally {
      running = false;
      if (again) { again = false; run(); }
    }
  };
  return run;
}
