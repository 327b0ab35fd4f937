"""The token-logging shim: Anthropic Messages and OpenAI Chat Completions in front of an engine.

`python -m clawjax.serving --help` runs it; `clawjax.serving.server.ShimServer` (asyncio) and
`ShimThread` (a thread of its own) run it in-process. With several worker processes
(`ShimConfig.workers`, `--workers`), `clawjax.serving.front.ShimFront` is the front that answers the
control routes and `ShimProcessPool` runs it in-process. Backends live in `clawjax.serving.backends`.
"""
