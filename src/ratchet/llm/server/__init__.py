"""A local model provider that speaks OpenAI's and Anthropic's wire formats, for tests,
demos and benchmarks: ``ratchet llm-server``, or in-process::

    from ratchet.llm.server import LocalProvider, serve

    provider = LocalProvider({"rules": [{"match": {"contains": "hi"},
                                         "reply": {"text": "hello"}}]})
    with serve(provider) as base:          # http://127.0.0.1:PORT
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="local")
        client.chat.completions.create(model="gpt-4.1-mini",
                                       messages=[{"role": "user", "content": "hi"}])
    provider.stats()["billed_calls"]       # 1

Replies are deterministic (the echo of the last user message, or the script's rules);
usage is counted from the text; ``Idempotency-Key`` is honoured as a careful provider
would; faults (429, 500, slow, dropped connections) can be queued.
"""

from ratchet.extras import require

# Checked before the modules below import starlette and uvicorn, so a missing extra is one
# line naming it rather than an ImportError from a submodule.
require("the local model provider (ratchet llm-server)", "server")

from ratchet.llm.server.provider import LocalProvider  # noqa: E402
from ratchet.llm.server.script import ScriptError  # noqa: E402
from ratchet.llm.server.serving import run_until_signalled, serve  # noqa: E402

__all__ = ["LocalProvider", "ScriptError", "run_until_signalled", "serve"]
