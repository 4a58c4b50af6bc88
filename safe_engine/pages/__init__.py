"""Runs as HTML: the coloured transcript, its details and charts, drawn from a run's events by the same
renderers for the web app, the command line, self-contained pages and notebooks (no Gradio here)."""
