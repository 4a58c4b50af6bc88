"""Past one machine: models held by Ray actors (`ray_models`) and benchmark sweeps sharded over Ray
replicas (`ray_bench`). Ray is optional: only `ray_spec` (parsing, no Ray) is imported by the engine, lazily.
"""
