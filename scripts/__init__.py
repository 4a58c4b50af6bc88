"""Project scripts: run each as a module from the repository root, e.g. ``python -m scripts.gpu_check``."""
