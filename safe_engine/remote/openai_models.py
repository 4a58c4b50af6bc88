"""Loading an ``openai:`` spec: check the server now (a bad URL, an unreachable host or an unknown model name
fails here, not mid-run), find the model's tokenizer, and return a model whose sessions ask the server
(`ServedSessions`).

The tokenizer comes from the spec's ``@TOKENIZER`` when given, else from the model root the server reports
(vLLM's ``/v1/models`` lists each model's ``root``: the folder or hub id it loaded) when this machine can
read it (a local folder, or a hub id already in the cache: nothing downloads at run time).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from ..contract.errors import ModelLoadError, ModelSpecError
from ..models.loading import LoadedModel, LoadOptions, eos_ids_of, load_tokenizer
from ..models.specs import resolve_spec
from ..runtime.scheduler import Scheduler
from .http_client import HttpSettings, JsonClient, RemoteError
from .openai_session import OpenAISession
from .openai_spec import api_key, parse_openai_spec


@dataclass(frozen=True)
class ServedSessions:
    """The session factory of a model behind an OpenAI-compatible server: its sessions ask the server."""

    client: JsonClient
    served_name: str
    name: str
    vocab_size: int  # the tokenizer's ids: rows the strategies get span them

    @property
    def key(self) -> object:
        return self.client

    def open(self, scheduler: Scheduler | None = None) -> OpenAISession:
        return OpenAISession(self, scheduler)

    def describe(self) -> dict:
        # the server's engine computes, not this process's runtime; its rows are top-k (approximate)
        return {"placement": "openai", "url": self.client.base_url, "approximate": True, "runtime": "openai"}


def load_openai_model(spec: str, options: LoadOptions = LoadOptions(), progress=None) -> LoadedModel:
    """Ask the server which models it serves, then load the tokenizer; every failure is a ModelLoadError."""
    parsed = parse_openai_spec(spec)
    client = JsonClient(parsed.base_url, api_key(), HttpSettings.from_env())
    if progress:
        progress(f"asking {parsed.base_url} for {parsed.name}")
    try:
        listed = client.get("/models").get("data") or []
    except RemoteError as exc:
        raise ModelLoadError(f"{spec}: {exc}") from None
    served = {m.get("id"): m for m in listed if isinstance(m, dict)}
    if parsed.name not in served:
        names = ", ".join(sorted(map(str, served))) or "none"
        raise ModelLoadError(f"{parsed.base_url} does not serve {parsed.name!r}; it serves: {names}")
    entry = served[parsed.name]
    source = parsed.tokenizer or entry.get("root")
    try:
        resolve_spec(source or "")
    except ModelSpecError:
        raise ModelLoadError(
            f"{spec}: the server reports the model root {source!r}, which this machine cannot read; "
            f"name a local folder or hub id with the tokenizer after the name ({spec.split('@')[0]}@FOLDER)"
        ) from None
    tokenizer = load_tokenizer(source, options, progress)
    return LoadedModel(
        spec=resolve_spec(spec),
        name=parsed.name,
        tokenizer=tokenizer,
        sessions=ServedSessions(client, parsed.name, parsed.name, len(tokenizer)),
        use_chat_template=options.chat_template,
        eos_ids=eos_ids_of(_generation_config(source), tokenizer),
        context_length=entry.get("max_model_len"),
        device=f"openai:{parsed.host}",
    )


def _generation_config(source: str):
    """The end ids the model's own generation config names (Gemma's <end_of_turn>), when its folder has one."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        config = None
    return SimpleNamespace(generation_config=config, config=None)
