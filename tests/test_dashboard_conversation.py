"""A run's model calls as a conversation on its page, in a real browser on both backends
(the harness of tests/test_dashboard.py), for runs made against the local provider through
the wrapped OpenAI SDK: an agent's turns with their messages, tool calls and results,
tokens, cost and latency, a retried call and one cut short by its worker's SIGKILL told
inline, the raw JSON one click away, one step's whole conversation in its detail; a
journal's markup shown as text; the page following a running agent; a 200-turn
conversation paged. The dashboard guide's conversation screenshots are taken here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import test_dashboard
from proc import Harness
from test_dashboard import IMAGES, Dash, dashboard, eid, expect, row
from waiting import wait_for

from ratchet.llm.server import LocalProvider, serve

browser = test_dashboard.browser  # the module's browser fixture, shared

ASK_LOOKUP: dict[str, Any] = {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]}
ANSWER: dict[str, Any] = {
    "match": {"last_role": "tool"},
    "reply": {"text": "It is sunny in Paris."},
}
AGENT_SCRIPT = {"rules": [{"match": {"last_role": "user"}, "reply": ASK_LOOKUP}, ANSWER]}
# The agent's question (it says "weather") asks for the tool; other questions are echoed.
WEATHER_SCRIPT = {"rules": [{"match": {"contains": "weather"}, "reply": ASK_LOOKUP}, ANSWER]}
TURN_1 = "1:openai.chat.completions.create"
TURN_2 = "3:openai.chat.completions.create"


@pytest.fixture
def dash(h: Harness, browser: Any) -> Iterator[Dash]:
    with dashboard(h, browser, heartbeat_s=0.5, live_poll_s=0.2) as d:
        yield d


def shot(dash: Dash, locator: Any, name: str) -> None:
    # One backend writes the guide's pictures; both take them, so both render the page.
    picture = locator.screenshot()
    if dash.h.db_url.startswith("sqlite"):
        IMAGES.mkdir(parents=True, exist_ok=True)
        (IMAGES / name).write_bytes(picture)


@pytest.mark.crash
def test_an_agent_run_reads_as_a_conversation_with_its_retry_and_crash_inline(
    dash: Dash,
) -> None:
    h = dash.h
    server = LocalProvider(script=AGENT_SCRIPT)
    with serve(server) as base:
        env = {"CRASH_LLM_URL": base}
        server.fail("429", times=1, retry_after=0.1)  # turn 1's first attempt: retried
        run_id = dash.start("agent_run", {"text": "What is the weather in Paris?"})
        a = h.spawn("a", env_extra=env)
        h.wait_invoked("2:lookup")  # turn 1 answered, its tool running
        server.fail("slow", times=1, delay_s=3.0)  # turn 2 is held...
        h.open_gate("lookup")
        wait_for(lambda: server.stats()["received"] >= 3, what="turn 2 sent")
        a.kill()  # ...and its worker killed while the provider answers it
        h.spawn("b", worker_id="a", env_extra=env)  # restarted: it reclaims the run at once
        h.wait_status(eid(run_id), "succeeded")

    page = dash.signed_in(viewport={"width": 1100, "height": 900})
    page.goto(f"/runs/{run_id}")
    talk = page.get_by_role("region", name="Conversation")
    turns = talk.get_by_role("article")
    expect(turns).to_have_count(2)
    first, second = turns.nth(0), turns.nth(1)
    expect(first).to_have_attribute("data-step", TURN_1)
    roles = first.locator(".msg .role")
    expect(roles).to_have_text(["system", "user", "assistant · reply"])
    expect(first.locator(".msg").nth(0)).to_contain_text("Answer with the tools.")
    expect(first.locator(".msg").nth(1)).to_contain_text("What is the weather in Paris?")
    # The reply's tool call with its arguments; the call's tokens, cost and latency.
    call = first.locator(".msg.reply .call")
    expect(call).to_contain_text("calls lookup")
    expect(call.locator("pre")).to_have_text('{\n  "city": "Paris"\n}')
    expect(first.locator(".tokens")).to_have_text(re.compile(r"^[\d,]+ → [\d,]+ tokens$"))
    expect(first.locator(".cost")).to_have_text(re.compile(r"^\$0\.\d{6}$"))
    expect(first.locator(".latency")).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s)$"))
    # The 429 and its retry, inline.
    expect(first.locator(".attempt")).to_have_text(
        [re.compile(r"^attempt 1 retrying: .*429"), "attempt 2 completed"]
    )

    # Turn 2 continues turn 1: the tool's result (named), then the answer; its first
    # attempt was cut short by the kill, and the drive that ended says so.
    expect(second.locator(".earlier")).to_contain_text(f"3 earlier messages, as in {TURN_1}")
    expect(second.locator(".msg .role")).to_have_text(["tool · lookup", "assistant · reply"])
    expect(second.locator(".msg").nth(0)).to_contain_text('"sky": "sunny"')
    expect(second.locator(".msg.reply")).to_contain_text("It is sunny in Paris.")
    took_over = (
        r"worker (restarted, run reclaimed|killed, taken over"
        r"|lost \(killed or hung\), lease expired, taken over)"
    )
    expect(second.locator(".attempt")).to_have_text(
        [
            re.compile(rf"^attempt 1 interrupted \(drive 1 by a: {took_over} by a after"),
            "attempt 1 completed",
        ]
    )
    shot(dash, talk, "dashboard-conversation.png")

    # The raw JSON, one click away: the request as sent (its messages whole), the response.
    raw = second.locator("details.raw")
    raw.locator("summary").click()
    expect(raw.locator("pre")).to_contain_text('"tool_call_id"')
    expect(raw.locator("pre")).to_contain_text('"It is sunny in Paris."')
    expect(raw.locator("pre")).to_contain_text('"latency_ms"')

    # A step's detail (opened from its turn, as from its waterfall row): that call's whole
    # conversation, every message it was sent.
    second.get_by_role("button", name=TURN_2).click()
    detail = page.get_by_role("region", name=f"Step {TURN_2}")
    whole = detail.locator("#detail-conversation")
    expect(whole.locator(".msg .role")).to_have_text(
        ["system", "user", "assistant", "tool · lookup", "assistant · reply"]
    )
    shot(dash, detail, "dashboard-conversation-step.png")
    page.get_by_role("button", name="Close step detail").click()
    row(page, TURN_1).get_by_role("button", name=TURN_1).click()
    detail = page.get_by_role("region", name=f"Step {TURN_1}")
    expect(detail.locator("#detail-conversation .msg .role")).to_have_text(
        ["system", "user", "assistant · reply"]
    )

    # On a phone, nothing wider than the screen.
    page.set_viewport_size({"width": 390, "height": 844})
    expect(first.locator(".msg.reply .call")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_journals_markup_is_text_the_page_follows_and_200_turns_are_paged(
    dash: Dash,
) -> None:
    h = dash.h
    evil = '<script>document.title="pwned"</script><img src=x onerror="document.title=1"> weather?'
    with serve(LocalProvider(script=WEATHER_SCRIPT)) as base:
        marked = dash.start("agent_run", {"text": evil})
        h.spawn("w", env_extra={"CRASH_LLM_URL": base})
        h.wait_invoked("2:lookup")  # turn 1 answered, its tool waiting for its gate
        page = dash.signed_in()
        page.goto(f"/runs/{marked}")
        talk = page.get_by_role("region", name="Conversation")
        expect(talk.get_by_role("article")).to_have_count(1)
        # The page follows the run: the next turn comes without a reload.
        h.open_gate("lookup")
        expect(talk.get_by_role("article")).to_have_count(2)
        expect(talk.locator(".msg.reply").last).to_contain_text("It is sunny in Paris.")
        expect(page.locator("#run-status")).to_have_text("succeeded")
        long = dash.start("asker", {"n": 200})
        h.wait_status(eid(long), "succeeded", timeout=60)

    # What the journal holds is shown as text, never run.
    expect(talk.locator(".msg.role-user .text").first).to_have_text(evil)
    assert talk.locator("script, img").count() == 0
    assert page.title() != "pwned"

    # A 200-turn run: fifty turns at first, fifty more a click.
    with page.expect_response(re.compile(r"/conversation$")) as first_page:
        page.goto(f"/runs/{long}")
    assert len(first_page.value.body()) < 100_000
    turns = page.get_by_role("region", name="Conversation").get_by_role("article")
    expect(turns).to_have_count(50)
    page.get_by_role("button", name="More turns (150 more)").click()
    expect(turns).to_have_count(100)
    expect(turns.last.locator(".msg.role-user")).to_contain_text("question 100")
    expect(turns.last.locator(".msg.reply")).to_contain_text("echo: question 100")
    expect(page.get_by_role("button", name="More turns (100 more)")).to_be_visible()

    # Another tenant's token reads neither the conversation nor a turn of it.
    with dash.api(dash.token(tenant="globex")) as other:
        for path in ("conversation", f"turn?step_id={TURN_1}"):
            refused = other.get(f"/ui/runs/{marked}/{path}")
            assert refused.status_code == 404, refused.text
    with dash.api() as mine:
        raw = mine.get(f"/ui/runs/{marked}/turn", params={"step_id": TURN_1}).json()
        assert raw["request"]["messages"][-1]["content"] == evil
        assert raw["response"]["choices"][0]["message"]["tool_calls"]
        # The step's detail in the API gives the request as what the call was made with.
        step = mine.get(f"/v1/runs/{marked}/step", params={"step_id": TURN_1}).json()
        assert step["args_journaled"] is True and step["args"] == raw["request"]
        assert step["args"]["model"] == "gpt-4.1-mini"
        assert mine.get(f"/ui/runs/{marked}/turn?step_id=9:nope").status_code == 404
        assert mine.get(f"/ui/runs/{marked}/conversation?after=-1").status_code == 422
        missing = mine.get(f"/ui/runs/{marked}/conversation?step_id=2:lookup")
        assert missing.status_code == 404 and "no model call" in missing.json()["message"]
