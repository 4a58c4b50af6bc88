"""Request bodies of the OpenAI API subset we serve; fields we do not use (``user``, penalties) are accepted.

SAFE's own options travel in the extra field ``safe`` (`openai` clients send it with ``extra_body``): the
decoding options of ``python -m safe_engine generate`` by name (``lookahead``, ``top_k``, ``weights``, ...),
and ``events: true`` to stream the engine's events along with the text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    safe: dict[str, Any] = Field(default_factory=dict)

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatRequest(Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
