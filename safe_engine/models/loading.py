"""A model spec → a loaded causal LM, its tokenizer and its own prompt format (`LoadedModel`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cache, cached_property

from ..contract.errors import ModelLoadError, first_line
from ..contract.sessions import Session, Sessions
from ..runtime.executors import OWN_CACHE
from ..runtime.session import LocalSessions
from ..runtime.weights import Weights
from ..tokenization.alignment import EOS_KEY, TokenBytes, special_ids
from .embedded import Progress, ensure_converted
from .specs import ResolvedSpec, resolve_spec, scheme_of

DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_LINEAR_MODES = ("streamed", "torch", "int8-head")  # cpu_linear.py; --cpu-linear
# Modes whose logits are not fp32: their tokens may differ from the reference computation (a near-tie can flip).
APPROXIMATE_CPU_LINEAR = frozenset({"int8-head"})


def pick_device(device: str = "auto") -> str:
    """The device a model loads on, named as its tensors name it: "cuda" is the current GPU's "cuda:N", so models
    given "cuda" and "cuda:0" share one device in the scheduler (it keys passes on this name)."""
    import torch

    if device != "auto":
        if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
            raise ModelLoadError(f"unknown device {device!r}: use auto, cpu, mps, cuda or cuda:N")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} asked for, but CUDA is not available here")
        if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r} asked for, but this machine has {torch.cuda.device_count()} GPU(s)"
            )
        if device == "mps" and not torch.backends.mps.is_available():
            raise ModelLoadError("device 'mps' asked for, but MPS is not available here")
        return f"cuda:{torch.cuda.current_device()}" if device == "cuda" else device
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(device: str, dtype: str = "auto"):
    import torch

    if dtype != "auto":
        try:
            return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        except KeyError:
            raise ModelLoadError(f"unknown dtype {dtype!r}: use auto, float32, float16 or bfloat16") from None
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.float32


@dataclass(frozen=True)
class LoadOptions:
    """How models load. `device` and `dtype`: one for every model, or a tuple with one per model (`load_models`;
    `load_model` loads one model and takes one of each). Device "auto" spreads the models over the visible GPUs
    by parameter count (`placement.py`), else picks cuda, mps or cpu."""

    device: str | tuple[str, ...] = "auto"
    dtype: str | tuple[str, ...] = "auto"
    trust_remote_code: bool = False
    chat_template: bool = True
    attn_implementation: str | None = None
    cpu_int8: bool = False  # int8 weights, dynamically quantized activations (every Linear layer, the LM head included)
    cpu_linear: str = "streamed"  # linear layers on the CPU (`cpu_linear.py`): streamed (fp32), torch or int8-head


@dataclass
class LoadedModel:
    """A causal LM ready for decoding: its tokenizer, byte table and prompt format here, its computation wherever
    its session factory runs it (`sessions`: this process's runtime, a server, a Ray actor)."""

    spec: ResolvedSpec
    name: str
    tokenizer: object
    sessions: Sessions
    use_chat_template: bool = True
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    context_length: int | None = None  # prompt + response tokens the model takes, when its config says
    device: str = "cpu"
    dtype: object = None
    int8: bool = False
    cpu_linear: str | None = None  # the fp32 linears' form on the CPU (cpu_linear.py); None off the CPU or under int8
    model: object = None  # the weights, when they are loaded in this process

    @cached_property
    def vocab(self) -> TokenBytes:
        return TokenBytes(self.tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def open_session(self) -> Session:
        """A fresh decoding state for one run, wherever the model computes."""
        return self.sessions.open()

    def format_prompt(self, prompt: str) -> str:
        """The prompt as this model sees it: its chat template when it has one and it is enabled."""
        if self.use_chat_template and self.has_chat_template:
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        return prompt

    def encode_prompt(self, prompt: str) -> list[int]:
        text = self.format_prompt(prompt)
        bos = self.tokenizer.bos_token
        templated = self.use_chat_template and self.has_chat_template
        add_special = not (templated and bos and text.startswith(bos))
        if templated and not bos:
            add_special = False
        return list(self.tokenizer(text, add_special_tokens=add_special)["input_ids"])

    def key_of(self, token_id: int) -> bytes | str:
        """Union key of a token: its bytes, EOS_KEY for any end token, else its special-token string."""
        if token_id in self.eos_ids:
            return EOS_KEY
        raw = self.vocab[token_id]
        if raw or token_id not in self.vocab.special_ids:
            return raw
        return self.tokenizer.convert_ids_to_tokens(token_id)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "spec": self.spec.spec,
            "device": self.device,
            "dtype": "int8" if self.int8 else str(self.dtype).replace("torch.", ""),
            **({"cpu_linear": self.cpu_linear} if self.cpu_linear else {}),
            # int8 weights or an int8 head: logits off the fp32 computation, so tokens may differ from the reference
            "approximate": self.int8 or self.cpu_linear in APPROXIMATE_CPU_LINEAR,
            "vocab_size": len(self.tokenizer),
            "chat_template": self.use_chat_template and self.has_chat_template,
        } | self.sessions.describe()


def _source(resolved: ResolvedSpec, progress: Progress | None) -> tuple[str, dict]:
    if resolved.kind == "embedded":
        return str(ensure_converted(resolved.location, progress)), {}
    if resolved.kind == "gguf":
        return resolved.location, {"gguf_file": resolved.gguf_file}
    return resolved.location, {}


def load_tokenizer(spec: str, options: LoadOptions = LoadOptions(), progress: Progress | None = None):
    """Only the tokenizer of a spec (the tokenizer debugger needs no weights)."""
    from transformers import AutoTokenizer

    resolved = resolve_spec(spec)
    source, extra = _source(resolved, progress)
    try:
        return AutoTokenizer.from_pretrained(
            source, trust_remote_code=options.trust_remote_code, local_files_only=_offline(), **extra
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load the tokenizer of {spec}: {first_line(exc)}") from exc


def load_model(spec: str, options: LoadOptions = LoadOptions(), progress: Progress | None = None) -> LoadedModel:
    scheme = scheme_of(spec)
    if scheme is not None:  # a model held elsewhere (a Ray actor): its own package loads it
        return scheme.load(spec, options, progress)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .cpu_linear import install_cpu_linear

    resolved = resolve_spec(spec)
    if resolved.kind == "tokenizer":
        raise ModelLoadError(
            f"{spec} holds a tokenizer only (no config.json): tokdiff can compare it, decoding needs a model"
        )
    if not (isinstance(options.device, str) and isinstance(options.dtype, str)):
        raise ModelLoadError("load_model loads one model: give it one device and one dtype (load_models takes lists)")
    if options.cpu_linear not in CPU_LINEAR_MODES:
        raise ModelLoadError(f"--cpu-linear is one of {', '.join(CPU_LINEAR_MODES)}, not {options.cpu_linear!r}")
    device = pick_device(options.device)
    if options.cpu_int8 and device != "cpu":
        raise ModelLoadError(
            f"int8 weights run on the CPU only, and {spec} would load on {device}: add --device cpu or drop --cpu-int8"
        )
    dtype = torch.float32 if options.cpu_int8 else pick_dtype(device, options.dtype)
    source, extra = _source(resolved, progress)
    kwargs = dict(trust_remote_code=options.trust_remote_code, local_files_only=_offline(), **extra)
    if not extra:  # GGUF files carry their config inside
        try:
            config = AutoConfig.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not read the config of {spec}: {first_line(exc)}") from exc
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(config, "auto_map", None):
            raise ModelLoadError(f"{spec} is a {config.model_type!r} model, not a causal language model")
    tokenizer = load_tokenizer(spec, options, progress)
    if progress:
        progress(f"loading {resolved.short_name} on {device} ({str(dtype).replace('torch.', '')})")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=options.attn_implementation, **kwargs
        )
        model.to(device).eval()
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(f"not enough memory on {device} to load {spec}") from exc
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load {spec}: {first_line(exc)}") from exc
    except RuntimeError as exc:
        if "memory" in str(exc).lower():
            raise ModelLoadError(f"not enough memory on {device} to load {spec}") from exc
        raise
    if options.cpu_int8:
        if progress:
            progress(f"quantizing {resolved.short_name} to int8")
        model = quantize_int8(model)
    cpu_linear = None
    if device == "cpu" and not options.cpu_int8:
        cpu_linear = options.cpu_linear
        install_cpu_linear(model, cpu_linear)
    _mask_rows_past_tokenizer(model, len(tokenizer))
    lm = local_model(
        resolved,
        model,
        tokenizer,
        device,
        dtype,
        use_chat_template=options.chat_template,
        eos_ids=eos_ids_of(model, tokenizer),
        int8=options.cpu_int8,
        cpu_linear=cpu_linear,
    )
    path = lm.sessions.path
    if progress and path.name == OWN_CACHE:
        progress(f"{lm.name} runs one run at a time on transformers' cache: {path.reason}")
    return lm


def local_model(spec: ResolvedSpec, model, tokenizer, device: str, dtype, **fields) -> LoadedModel:
    """A model whose weights are in this process: its path through the runtime is decided here, once, by probing
    what it computes (ModelLoadError when no path runs it). `fields`: LoadedModel's own (prompt format, end ids,
    int8, cpu_linear)."""
    weights = Weights(model, spec.short_name, device, len(tokenizer), fields.get("int8", False))
    return LoadedModel(
        spec=spec,
        name=spec.short_name,
        tokenizer=tokenizer,
        sessions=LocalSessions.serve(weights),
        context_length=getattr(getattr(model, "config", None), "max_position_embeddings", None),
        device=device,
        dtype=dtype,
        model=model,
        **fields,
    )


@cache  # the app loads its models once per run: count each once
def parameter_count(spec: str, options: LoadOptions = LoadOptions()) -> int:
    """The model's parameters, counted on the meta device from its config (no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    resolved = resolve_spec(spec)
    source, extra = _source(resolved, None)
    try:
        config = AutoConfig.from_pretrained(
            source, trust_remote_code=options.trust_remote_code, local_files_only=_offline(), **extra
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=options.trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not read the config of {spec}: {first_line(exc)}") from exc
    return sum(p.numel() for p in model.parameters())


def quantize_int8(model):
    """Every Linear layer (the 262k-row LM head of Gemma too) with int8 weights and activations quantized
    on the fly: faster per step on a CPU and less accurate (benchmarks/RESULTS.md has both, measured).

    torch.ao's dynamic quantization, not torchao: torchao 0.18's int8 configs have no fast CPU kernels
    and ran far slower than fp32 on this kind of machine (benchmarks/RESULTS.md). torch marks these APIs deprecated.
    """
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deprecat", category=Warning)
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def _mask_rows_past_tokenizer(model, size: int) -> None:
    """Output rows past the tokenizer's last id (heads padded to a round size, as in Qwen's and Gemma 3's
    larger checkpoints) spell nothing, so the model must never pick them: their logits become -inf."""

    def mask(module, args, output):
        logits = getattr(output, "logits", None)
        if logits is not None and logits.shape[-1] > size:
            logits[..., size:] = float("-inf")

    model.register_forward_hook(mask)


def eos_ids_of(model, tokenizer) -> frozenset[int]:
    """The ids that end a response: the model's (its generation config's and config's) and the tokenizer's."""
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids |= set(value) if isinstance(value, (list, tuple, set)) else {value}
    # Chat models end a turn with their own marker; treat it as the end of the response. The template
    # says which (below); these markers cover tokenizers that lost theirs (the embedded Gemma's GGUF).
    vocab = tokenizer.get_vocab()
    for marker in ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>"):
        if marker in vocab:
            ids.add(vocab[marker])
    turn_end = _turn_end_id(tokenizer)
    if turn_end is not None:
        ids.add(turn_end)
    return frozenset(i for i in ids if i is not None and i >= 0)


_TURN_PROBE = "Sure."


def _turn_end_id(tokenizer) -> int | None:
    """The special token the chat template closes an assistant turn with, read off the template itself
    (Llama 3's <|eot_id|>, Command R's <|END_OF_TURN_TOKEN|>), so no family needs to be known here."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    conversation = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": _TURN_PROBE}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # a template may refuse this conversation (system turn required, ...)
        return None
    if _TURN_PROBE not in text:
        return None
    after = text[text.rindex(_TURN_PROBE) + len(_TURN_PROBE) :].lstrip()
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    return ids[0] if ids and ids[0] in special_ids(tokenizer) else None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
