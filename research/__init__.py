"""The research write-up: docs/research.md and its SVG figures built from a live run's
summary.json (writeup.py, `jumpahead write-up`; the sentences that compare arms in
writeup_text.py, the figures in writeup_figures.py).

Imports traces and live (the run records and tables it writes up)."""
