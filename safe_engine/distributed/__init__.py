"""Past one machine: models held by Ray actors (`ray_models`, a ``ray:`` model spec) and benchmark sweeps
sharded over Ray replicas (`ray_bench`). Ray is optional and imported only when an actor starts; importing
this package registers the ``ray:`` scheme with the engine's model specs (`models.specs.register_scheme`).
"""

from ..models.specs import SpecScheme, register_scheme
from .ray_models import load_ray_model
from .ray_spec import RAY_PREFIX, resolve_ray_spec

register_scheme(SpecScheme(RAY_PREFIX, resolve_ray_spec, load_ray_model))
