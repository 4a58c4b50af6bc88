"""Models behind an OpenAI-compatible server (vLLM, SGLang's OpenAI API): an ``openai:URL#NAME`` model spec.

Importing this package registers the ``openai:`` scheme with the engine's model specs
(`models.specs.register_scheme`), as `distributed` does for ``ray:``. The tokenizer stays local (alignment
needs every model's vocabulary); drafts, scores and top-k come over HTTP (`openai_session`).
"""

from ..models.specs import SpecScheme, register_scheme
from .openai_models import load_openai_model
from .openai_spec import OPENAI_PREFIX, resolve_openai_spec

register_scheme(SpecScheme(OPENAI_PREFIX, resolve_openai_spec, load_openai_model))
