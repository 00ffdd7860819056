"""Chat-template facts that decide what DPO trains and where a judge's score is read.

- Where an assistant turn starts. TRL's DPOTrainer tokenises the prompt with ``add_generation_prompt=True`` and the
  completion as the rest of prompt + assistant message. For most templates the assistant content follows the
  generation prompt directly; Qwen3's writes an empty think block ``<think>\\n\\n</think>\\n\\n`` into the final
  assistant turn, which the generation prompt leaves out. So a trained judge writes its evaluation *after* the think
  block, and a forced answer prefix must go there too: `assistant_prefix` renders the turn exactly as training does.
- The date. Llama 3.1's template writes "Today Date: 26 Jul 2024" unless given ``date_string``; later Llama templates
  take the date from the clock (``strftime_now``), so the same row would tokenise differently from one day to the
  next and scores would move with the calendar. `pin_template_date` fixes the date for such templates.
"""

# Late imports: judgetrain.data (inside the functions that use them): the model cache and aliases are read without
# loading a model (`judgetrain cache`, the dry run): torch and transformers come in with a load.

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

FROZEN_DATE = "26 Jul 2024"  # Llama 3.1's own default: scores of a 3.1 template stay what they were
_SENTINEL = "\u2063JUDGETRAIN_ASSISTANT_CONTENT\u2063"
_DATE_PIN = "{%- if date_string is not defined %}{%- set date_string = \"%s\" %}{%- endif %}"


def assistant_prefix(tokenizer, messages: list[dict]) -> str:
    """The rendered text of ``messages`` (content neutralised, `judgetrain.data.chat`) followed by an assistant turn up
    to where its content starts, as the template renders a final assistant message (what DPO trains on), not the
    bare generation prompt."""
    from judgetrain.data.chat import chat_text, neutral_messages

    turn = neutral_messages(messages, tokenizer) + [{"role": "assistant", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(turn, tokenize=False)
    cut = text.find(_SENTINEL)
    if cut < 0:  # a template that drops or rewrites the content: fall back to the generation prompt
        return chat_text(tokenizer, messages, add_generation_prompt=True)
    return text[:cut]


def reads_clock(template: str | None) -> bool:
    return bool(template) and "strftime_now" in template


def pin_template_date(tokenizer, date: str = FROZEN_DATE) -> bool:
    """Make a template that reads today's date (``strftime_now``) use ``date`` unless a caller passes
    ``date_string``. Changes ``tokenizer.chat_template`` in place (saved with the model or adapter, so the trained
    judge keeps the date it was trained with); returns whether it did."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not reads_clock(template) or template.startswith(_DATE_PIN[:40]):
        return False
    if "date_string" not in template:
        logger.warning("the chat template reads the clock (strftime_now) outside date_string: its rendering, and so "
                       "the scores, can change from one day to the next")
        return False
    tokenizer.chat_template = _DATE_PIN.replace("%s", date) + template
    logger.info("chat template reads today's date: pinned date_string to %r so tokens and scores do not change with "
                "the calendar", date)
    return True
