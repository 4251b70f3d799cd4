// The schedules page's buttons: pause, resume and run now, through the API
// (/v1/schedules/NAME/ACTION, admin scope) on the session cookie with the CSRF token.
import { api } from "./api.js";

const status = document.getElementById("schedule-status");

document.getElementById("schedules")?.addEventListener("click", async (e) => {
  const button = e.target.closest("button[data-action]");
  if (!button) return;
  const { action, name } = button.dataset;
  button.disabled = true;
  try {
    const out = await api(`/v1/schedules/${encodeURIComponent(name)}/${action}`, { method: "POST" });
    if (action === "trigger") {
      status.textContent = `${name}: run ${out.run_id} started`;
      button.disabled = false;
    } else {
      window.location.reload();
    }
  } catch (err) {
    status.textContent = `${action} refused: ${err.message}`;
    button.disabled = false;
  }
});
