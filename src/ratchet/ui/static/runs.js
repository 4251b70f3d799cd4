// The runs list: the server renders it; this swaps in a fresh table whenever the server's
// stream says the tenant's runs changed (a run started, changed status or ended).
import { coalesced, wireRetries } from "./api.js";

const table = document.getElementById("runs-table");
const live = document.getElementById("live");
const refresh = coalesced(async () => {
  const r = await fetch(`/ui/runs/rows?${table.dataset.query}`, { credentials: "same-origin" });
  if (r.ok) table.innerHTML = await r.text();
});

const source = new EventSource("/ui/runs/live");
// The stream reports changes after it connects: whatever changed between the page's
// rendering (or a lost connection) and now is fetched once on every (re)connect.
source.addEventListener("open", () => { live.textContent = "live"; refresh(); });
source.addEventListener("error", () => { live.textContent = "reconnecting…"; });
source.addEventListener("changed", refresh);

wireRetries(document, (text) => { live.textContent = text; refresh(); });
