"""The text layer: tokenizers, chat templates, output parsing and token-in-token-out prompts.

Serving turns API requests into `Message`/`ToolSpec` records, gets prompt ids from a per-rollout
`PromptBuilder`, and turns sampled ids back into a `ParsedTurn` with `ChatTemplate.parse`. Templates
write `Markup`: only their own text places control tokens; the conversation's text never does.
The layer knows tokenizers by name or model dir, not model presets (`clawjax.models.vocab`).
"""

from clawjax.text.messages import Message, ParsedTurn, ToolCall, ToolSpec
from clawjax.text.prompt import Prompt, PromptBuilder
from clawjax.text.templates import ChatTemplate, load_template
from clawjax.text.tokenizer import Markup, Tokenizer, load_tokenizer

__all__ = ["ChatTemplate", "Markup", "Message", "ParsedTurn", "Prompt", "PromptBuilder", "ToolCall",
           "ToolSpec", "Tokenizer", "load_template", "load_tokenizer"]
