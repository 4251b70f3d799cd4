// A run page's fork and resume actions. "Fork from here" opens on the step shown in the
// detail panel (run.js announces it with a `step-shown` event): the step's output to edit
// as JSON, or, for a model call, the assistant's answer as text (put back into the
// provider's response body, so the workflow reads it as the model's); the run's input
// optionally. The fork is the API's (POST /v1/runs/{id}/fork), as cancel and retry are:
// on the session cookie with the page's CSRF token. The new run's page is where it lands.
import { api, runPath } from "./api.js";

const $ = (id) => document.getElementById(id);
const data = JSON.parse($("run-data").textContent);
const base = `/v1/runs/${runPath(data.run_id)}`;
const FORKABLE = ["completed", "failed"];

// -- a model's answer in its response body ----------------------------------------------
// The shapes ratchet.model.story.answer_text reads: OpenAI chat completions and responses,
// Anthropic messages. Only the text is edited: tool calls stay as the model made them.

const texts = (content) => (typeof content === "string" ? [content]
  : Array.isArray(content) ? content.filter((b) => b && typeof b.text === "string").map((b) => b.text)
    : []);

// The assistant's text in `body`, or null when the body is none of those shapes.
export function answerOf(body) {
  if (typeof body === "string") return body;
  if (!body || typeof body !== "object") return null;
  if (Array.isArray(body.choices) && body.choices.length) {
    return texts(body.choices[0]?.message?.content).join("\n");
  }
  if (Array.isArray(body.output)) {
    return body.output.filter((i) => i && i.type === "message").flatMap((i) => texts(i.content)).join("\n");
  }
  if (Array.isArray(body.content) && (body.type ?? "message") === "message") {
    return body.content.filter((b) => b && b.type === "text").map((b) => String(b.text)).join("\n");
  }
  return null;
}

// `body` with its assistant text replaced by `text` (a copy; `body` is left as it was).
export function withAnswer(body, text) {
  if (typeof body === "string") return text;
  const copy = structuredClone(body);
  if (Array.isArray(copy.choices)) {
    const message = copy.choices[0].message ?? (copy.choices[0].message = { role: "assistant" });
    message.content = text;
    return copy;
  }
  if (Array.isArray(copy.output)) {
    const part = { type: "output_text", text, annotations: [] };
    const first = copy.output.findIndex((i) => i && i.type === "message");
    if (first === -1) {
      copy.output.unshift({ type: "message", role: "assistant", status: "completed", content: [part] });
    } else {
      copy.output[first].content = [part];
      copy.output = copy.output.filter((i, n) => n <= first || !(i && i.type === "message"));
    }
    if (typeof copy.output_text === "string") copy.output_text = text;
    return copy;
  }
  const at = copy.content.findIndex((b) => b && b.type === "text");
  const rest = copy.content.filter((b) => !(b && b.type === "text"));
  rest.splice(at === -1 ? 0 : Math.min(at, rest.length), 0, { type: "text", text });
  copy.content = rest;
  return copy;
}

// -- the fork form ----------------------------------------------------------------------

const form = $("fork");
const open = $("fork-open");
let step = null; // the step detail the form was opened on (GET .../step)

const say = (text) => { $("fork-result").textContent = text; };

function parsed(text, what) {
  try {
    return { value: JSON.parse(text) };
  } catch (err) {
    return { error: `${what} is not valid JSON: ${err.message}` };
  }
}

// The step shown in the detail panel: fork from it if it completed or failed.
$("detail")?.addEventListener("step-shown", (e) => {
  step = e.detail;
  if (!open) return;
  open.hidden = !FORKABLE.includes(step.state.status);
  form.hidden = true;
});

open?.addEventListener("click", () => {
  const s = step.state;
  const answer = s.status === "completed" && s.kind === "llm" ? answerOf(s.output) : null;
  $("fork-step").textContent = s.step_id;
  // A completed step is forked with its output edited; a failed one runs again unless
  // an output is given for it.
  form.elements.namedItem("edit").checked = s.status === "completed";
  form.elements.namedItem("raw").checked = false;
  $("fork-raw-box").hidden = answer === null;
  $("fork-answer-box").hidden = answer === null;
  $("fork-output-box").hidden = answer !== null;
  $("fork-answer").value = answer ?? "";
  $("fork-output").value = JSON.stringify(s.status === "completed" ? s.output : null, null, 2);
  form.elements.namedItem("change_input").checked = false;
  // The arguments by name, as a fork takes them (the page's Input shows them as given).
  $("fork-input").value = JSON.stringify(JSON.parse($("fork-input-given").textContent), null, 2);
  say("");
  editable();
  form.hidden = false;
  const first = answer === null ? $("fork-output") : $("fork-answer");
  (first.disabled ? form.elements.namedItem("edit") : first).focus();
});

$("fork-cancel")?.addEventListener("click", () => { form.hidden = true; });

// What is not sent is not editable: the output unless it replaces the step's, the input
// unless it changes the run's.
function editable() {
  const edit = form.elements.namedItem("edit").checked;
  $("fork-answer").disabled = !edit;
  $("fork-output").disabled = !edit;
  $("fork-input").disabled = !form.elements.namedItem("change_input").checked;
}
form?.addEventListener("change", editable);

// A model call's answer as text, or its whole response body as JSON (from the answer as
// edited so far, and back).
form?.elements.namedItem("raw")?.addEventListener("change", (e) => {
  const raw = e.target.checked;
  if (raw) {
    $("fork-output").value = JSON.stringify(withAnswer(step.state.output, $("fork-answer").value), null, 2);
  } else {
    const got = parsed($("fork-output").value, "the response");
    const answer = got.error ? null : answerOf(got.value);
    if (answer === null) {
      e.target.checked = true;
      say(got.error ?? "the response has no answer to edit as text");
      return;
    }
    $("fork-answer").value = answer;
  }
  $("fork-answer-box").hidden = raw;
  $("fork-output-box").hidden = !raw;
});

form?.addEventListener("submit", async (e) => {
  e.preventDefault();
  const s = step.state;
  const body = { at: s.step_id };
  if (form.elements.namedItem("edit").checked) {
    let output;
    if (!$("fork-answer-box").hidden) {
      output = withAnswer(s.output, $("fork-answer").value);
    } else {
      const got = parsed($("fork-output").value, "the step's output");
      if (got.error) { say(got.error); return; }
      output = got.value;
    }
    body.edit = { [s.step_id]: output };
  }
  if (form.elements.namedItem("change_input").checked) {
    const got = parsed($("fork-input").value, "the run's input");
    if (got.error) { say(got.error); return; }
    body.input = got.value;
  }
  const submit = $("fork-submit");
  submit.disabled = true;
  try {
    const out = await api(`${base}/fork`, { method: "POST", body });
    say(`forked: ${out.run_id}`);
    window.location.assign(`/runs/${runPath(out.run_id)}`);
  } catch (err) {
    say(`fork refused: ${err.message}`);
    submit.disabled = false;
  }
});

// -- resuming a cancelled run -------------------------------------------------------------

$("resume")?.addEventListener("click", async (e) => {
  const button = e.target;
  button.disabled = true;
  try {
    const out = await api(`${base}/resume`, { method: "POST" });
    $("action-result").textContent = `resumed: ${out.status ?? "queued"}`;
    // Resumed in place or as a new run: either way, its page, from the top.
    window.location.assign(`/runs/${runPath(out.run_id ?? data.run_id)}`);
  } catch (err) {
    $("action-result").textContent = `resume refused: ${err.message}`;
    button.disabled = false;
  }
});
